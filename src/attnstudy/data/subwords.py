"""Subword tokenizers trained on a task's training words with the Hugging Face ``tokenizers``
library (BPE), each subword mapped back to its word.

Every word starts with :data:`WORD_START` (``▁``, the SentencePiece convention, through the
``Metaspace`` pre-tokenizer), so every symbol BPE starts from is a character of the training text.
That keeps training deterministic: the trainer numbers characters in sorted order and breaks ties
between equally frequent pairs by their ids. With a continuation prefix (``##``, WordPiece's
convention, or BPE's ``continuing_subword_prefix``) the prefixed symbols are numbered in hash-map
order, and the learned vocabulary changed from run to run (tests/data/test_nt.py holds it fixed).

Gold word alignments stay word-level: every example built from subwords carries ``src_words`` /
``tgt_words`` (:class:`attnstudy.data.types.Example`), and the alignment ablation sums a source
word's subword attention and averages a target word's
(:func:`attnstudy.analysis.ablations.alignment.word_attention`), as for Hugging Face models.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attnstudy.data.types import DataError

SUBWORD_KINDS = ("bpe", "words")
"""``bpe``: subwords of the ``tokenizers`` library (Sennrich et al. 2016); ``words``: one token
per word."""

WORD_START = "▁"
"""First character of a word's first subword (U+2581), so the words of a decoded subword sequence
are known without the tokenizer (:func:`merge_subwords`)."""

UNK = "<unk>"


@dataclass(frozen=True)
class SubwordTokenizer:
    """A trained tokenizer over already-split words.

    Attributes:
        kind: ``"bpe"`` or ``"words"``.
        vocab_size: the size asked of the trainer (the learned vocabulary may be smaller).
        tokenizer: the ``tokenizers.Tokenizer``, None for ``words``.
    """

    kind: str
    vocab_size: int
    tokenizer: object | None

    @property
    def vocabulary(self) -> dict[str, int]:
        """The learned tokens and their ids (empty for ``words``)."""
        return {} if self.tokenizer is None else dict(self.tokenizer.get_vocab())

    def encode(self, words: Sequence[str]) -> tuple[tuple[str, ...], tuple[int, ...]]:
        """Subword tokens of a word sequence and the word index of each.

        Args:
            words: the words (no spaces inside a word).

        Returns:
            (tokens, word index per token); for ``words`` the words themselves and 0, 1, ….
        """
        if self.tokenizer is None:
            return tuple(words), tuple(range(len(words)))
        enc = self.tokenizer.encode(list(words), is_pretokenized=True)
        return tuple(enc.tokens), tuple(int(w) for w in enc.word_ids)

    def words(self, tokens: Sequence[str]) -> list[str]:
        """The words of tokens this tokenizer wrote (or a model decoded): :func:`merge_subwords`
        for ``bpe``, the tokens themselves for ``words``."""
        return list(tokens) if self.tokenizer is None else merge_subwords(tokens)


def train_tokenizer(words: Iterable[Sequence[str]], kind: str, vocab_size: int) -> SubwordTokenizer:
    """Train a subword tokenizer on word sequences (a task's training split only).

    BPE (Sennrich et al. 2016, the ``tokenizers`` trainer), every word prefixed with
    :data:`WORD_START`, no normalisation, ``<unk>`` for a character never seen in training.
    Deterministic: the same words give the same vocabulary, merges and ids in every process.

    Args:
        words: one word sequence per example.
        kind: one of :data:`SUBWORD_KINDS`.
        vocab_size: the vocabulary size asked of the trainer (the alphabet, ``<unk>`` and the
            merges; the result may be smaller when the text has no more pairs).

    Raises:
        DataError: an unknown kind, or a word that is empty, contains whitespace or
            :data:`WORD_START`.
    """
    if kind not in SUBWORD_KINDS:
        raise DataError(f"unknown subword tokenization {kind!r}; use one of {SUBWORD_KINDS}")
    texts = []
    for seq in words:
        for w in seq:
            if not w or WORD_START in w or any(c.isspace() for c in w):
                raise DataError(
                    f"word {w!r} is empty or contains whitespace or {WORD_START!r}; it cannot be a word"
                )
        texts.append(" ".join(seq))
    if kind == "words":
        return SubwordTokenizer(kind, vocab_size, None)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement=WORD_START, prepend_scheme="always", split=True
    )
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[UNK], show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return SubwordTokenizer(kind, vocab_size, tok)


def subword_word_index(tokens: Sequence[str]) -> list[int]:
    """The word of every token of a subword sequence, numbered 0, 1, …: a token starting with
    :data:`WORD_START` starts a word, any other joins the word before it (or starts one, at the
    beginning). The grouping :func:`merge_subwords` joins.

    Example: ``["▁ἐν", "▁ἀρ", "χῇ"]`` → ``[0, 1, 1]``.
    """
    out: list[int] = []
    for t in tokens:
        if not out:
            out.append(0)
        else:  # the numbers never fall: the word before is the last one
            out.append(out[-1] + 1 if t.startswith(WORD_START) else out[-1])
    return out


def merge_subwords(tokens: Sequence[str]) -> list[str]:
    """Words of a subword sequence: its tokens grouped by :func:`subword_word_index`, joined, the
    :data:`WORD_START` marks dropped.

    Example: ``["▁ἐν", "▁ἀρ", "χῇ"]`` → ``["ἐν", "ἀρχῇ"]``.
    """
    out: list[str] = []
    for t, w in zip(tokens, subword_word_index(tokens)):
        if w == len(out):
            out.append("")
        out[w] += t.removeprefix(WORD_START) if t.startswith(WORD_START) else t
    return out
