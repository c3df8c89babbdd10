"""Tiny Hugging Face encoder-decoders built and fine-tuned locally (no download): the shipped
example's model and the test fixtures of :mod:`attnstudy.models.hf`.

:func:`build_tiny` writes a ``save_pretrained`` folder holding a randomly initialised Marian, BART
or T5 model, a tokenizer trained here with ``tokenizers`` (word-level, or BPE so that words split into
subwords), fine-tuned for a few seconds on a copy task over a small lexicon.

A build is deterministic: the same arguments give byte-identical files (``tokenizer.json``, the
config and ``model.safetensors``) on one machine and thread count. The BPE vocabulary is learned
here (:func:`bpe_merges`) in a fixed id order, because ``tokenizers``' own ``BpeTrainer`` numbers
the ``##`` subwords in its hash map's order, which changes from build to build (up to 17 of the
48 ids moved between two builds, and with them the trained weights and the example's results).
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

from attnstudy.runtime.outputs import (
    HF_MODEL_KIND,
    OutputError,
    ReplacedMeanwhileError,
    check_replace,
    replace_folder,
)

__all__ = ["LEXICON", "bpe_merges", "build_tiny", "copy_pairs"]

LEXICON = (
    "cat dog bird fish tree stone river cloud rain snow wind fire light dark small large red "
    "blue green old new"
).split()
"""The words of the copy task."""


def copy_pairs(n: int, seed: int = 0, min_words: int = 2, max_words: int = 6) -> list[str]:
    """``n`` seeded sentences of ``min_words``–``max_words`` lexicon words (source = target)."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(LEXICON) for _ in range(rng.randint(min_words, max_words)))
        for _ in range(n)
    ]


SPECIALS = ("<pad>", "</s>", "<unk>")
"""The tokenizers' special tokens, ids 0, 1, 2."""

BPE_VOCAB_SIZE = 48
"""Vocabulary size of the ``bpe`` tokenizer (specials, characters, ``##`` characters, merges)."""


def bpe_merges(
    texts: Iterable[str], vocab_size: int, specials: Iterable[str] = SPECIALS, prefix: str = "##"
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A BPE vocabulary and its merges learned from whitespace-split ``texts``, in a fixed order.

    Byte-pair encoding (Sennrich et al. 2016, §3.1) over characters, with ``prefix`` marking a
    character or subword that continues a word (as ``tokenizers``' ``BpeTrainer`` with
    ``continuing_subword_prefix``). Ids: ``specials``, then every character of the texts sorted,
    then every continuing character sorted, then each merge's new token in the order learned. Each
    merge joins the adjacent pair with the highest count over the words (weighted by their
    frequency); a tie goes to the pair of the lower ids, as the trainer breaks ties — but on these
    fixed ids, where the trainer's ``##`` ids follow its hash map's order, which changes between
    processes (so do its vocabulary and, under a tie, its merges).

    Args:
        texts: the training texts (words split at whitespace).
        vocab_size: stop when the vocabulary has this many tokens (or no pair is left).
        specials: tokens given the first ids.
        prefix: the continuing-subword prefix.

    Returns:
        (token → id, merges as pairs in order) for ``tokenizers.models.BPE(vocab, merges, …,
        continuing_subword_prefix=prefix)``.
    """
    counts = Counter(w for text in texts for w in text.split())
    words = {w: [w[0], *(prefix + c for c in w[1:])] for w in sorted(counts)}
    chars = sorted({c for w in counts for c in w})
    continuing = sorted({t for symbols in words.values() for t in symbols[1:]})
    ids = {t: i for i, t in enumerate([*specials, *chars, *continuing])}
    merges: list[tuple[str, str]] = []
    while len(ids) < vocab_size:
        pairs: Counter = Counter()
        for w, symbols in words.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += counts[w]
        if not pairs:
            break
        a, b = max(pairs, key=lambda p: (pairs[p], -ids[p[0]], -ids[p[1]]))
        merges.append((a, b))
        joined = a + b.removeprefix(prefix)
        ids.setdefault(joined, len(ids))
        for w, symbols in words.items():
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == a and symbols[i + 1] == b:
                    out.append(joined)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[w] = out
    return ids, merges


def _tokenizer(kind: str, texts: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if kind == "word":
        vocab = {t: i for i, t in enumerate([*SPECIALS, *sorted(set(" ".join(texts).split()))])}
        tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    elif kind == "bpe":
        vocab, merges = bpe_merges(texts, BPE_VOCAB_SIZE)
        tok = Tokenizer(
            models.BPE(vocab, merges, unk_token="<unk>", continuing_subword_prefix="##")
        )
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.add_special_tokens(list(SPECIALS))
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; valid: word, bpe")
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##") if kind == "bpe" else decoders.WordPiece()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", tok.token_to_id("</s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def _model(family: str, vocab_size: int, pad: int, eos: int):
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        MarianConfig,
        MarianMTModel,
        T5Config,
        T5ForConditionalGeneration,
    )

    if family == "marian":
        cfg = MarianConfig(
            vocab_size=vocab_size,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=pad,
            eos_token_id=eos,
            decoder_start_token_id=pad,
            forced_eos_token_id=eos,
            dropout=0.0,
            attention_dropout=0.0,
        )
        return MarianMTModel(cfg)
    if family == "t5":
        cfg = T5Config(
            vocab_size=vocab_size,
            d_model=32,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=2,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=16,
            pad_token_id=pad,
            eos_token_id=eos,
            decoder_start_token_id=pad,
            dropout_rate=0.0,
        )
        return T5ForConditionalGeneration(cfg)
    if family == "bart":
        # BART starts decoding from its end-of-sequence token
        cfg = BartConfig(
            vocab_size=vocab_size,
            d_model=32,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=pad,
            eos_token_id=eos,
            bos_token_id=eos,
            decoder_start_token_id=eos,
            forced_bos_token_id=None,
            forced_eos_token_id=eos,
            dropout=0.0,
            attention_dropout=0.0,
        )
        return BartForConditionalGeneration(cfg)
    raise ValueError(f"unknown family {family!r}; valid: marian, bart, t5")


def build_tiny(
    folder: str | Path,
    *,
    family: str = "marian",
    tokenizer: str = "word",
    steps: int = 150,
    seed: int = 0,
    progress: bool = False,
) -> Path:
    """Build, fine-tune on the copy task and ``save_pretrained`` a tiny model with its tokenizer.

    The folder is written whole or not at all (:func:`attnstudy.runtime.outputs.replace_folder`): a
    folder that exists is replaced only if this function made it, and one holding anything else
    is refused before training.

    Args:
        folder: where to write (created).
        family: ``"marian"``, ``"bart"`` or ``"t5"``.
        tokenizer: ``"word"`` (one token per word) or ``"bpe"`` (words split into subwords,
            :func:`bpe_merges`); either in a fixed id order, so a build is reproducible.
        steps: Adam steps of fine-tuning (batch 32, lr 3e-3); 0 keeps the random weights.
        seed: for the initialisation, the data and the batches.
        progress: show transformers' progress bar while the weights are written (off: the
            build prints nothing but its result).

    Returns:
        The folder.

    Raises:
        ValueError: an unknown family or tokenizer kind.
        attnstudy.runtime.outputs.OutputError: ``folder`` is not empty and was not made here, or is
        a
            protected place (the store, the current directory, the project root, ``$HOME``).
        attnstudy.runtime.outputs.ReplacedMeanwhileError: another process replaced ``folder`` while
        this
            one was writing it.
    """
    check_replace(folder, kind=HF_MODEL_KIND, option="FOLDER")  # before the minutes of training
    texts = copy_pairs(400, seed)
    tok = _tokenizer(tokenizer, texts)
    torch.manual_seed(seed)
    model = _model(family, len(tok), tok.pad_token_id, tok.eos_token_id)
    rng = random.Random(seed)
    if steps:
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(steps):
            batch = rng.sample(texts, 32)
            enc = tok(batch, return_tensors="pt", padding=True)
            labels = tok(text_target=batch, return_tensors="pt", padding=True).input_ids
            labels = labels.masked_fill(labels == tok.pad_token_id, -100)
            loss = model(**enc, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()

    def save(tmp: Path) -> None:
        from transformers.utils import logging as hf_logging

        shown = hf_logging.is_progress_bar_enabled()
        (hf_logging.enable_progress_bar if progress else hf_logging.disable_progress_bar)()
        try:  # "Writing model shards" is a bar of one shard: only when asked for
            model.save_pretrained(tmp)
        finally:
            (hf_logging.enable_progress_bar if shown else hf_logging.disable_progress_bar)()
        tok.save_pretrained(tmp)

    return replace_folder(folder, save, kind=HF_MODEL_KIND, option="FOLDER")


def main(argv: list[str] | None = None) -> int:
    """``python -m attnstudy.models.hf_tiny FOLDER [--family F] [--tokenizer T] [--steps N]
    [--progress]``: prints only ``saved: FOLDER`` unless ``--progress``."""
    import argparse

    p = argparse.ArgumentParser(
        prog="python -m attnstudy.models.hf_tiny",
        description="build and fine-tune a tiny Hugging Face model on a copy task, offline",
    )
    p.add_argument("folder")
    p.add_argument("--family", choices=["marian", "bart", "t5"], default="marian")
    p.add_argument("--tokenizer", choices=["word", "bpe"], default="bpe")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--progress", action="store_true", help="show a progress bar while the weights are written"
    )
    args = p.parse_args(argv)
    try:
        folder = build_tiny(
            args.folder,
            family=args.family,
            tokenizer=args.tokenizer,
            steps=args.steps,
            seed=args.seed,
            progress=args.progress,
        )
    except OutputError as err:
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 2
    except ReplacedMeanwhileError as err:  # another process wrote the folder: not bad input
        print(f"{p.prog}: error: {err}", file=sys.stderr)
        return 1
    print(f"saved: {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
