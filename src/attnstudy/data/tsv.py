"""The user's own data: ``source<TAB>target[<TAB>Pharaoh alignment]`` files."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from attnstudy.config import DataConfig
from attnstudy.config.data import SPLIT_HINT
from attnstudy.data.alignment import Alignment
from attnstudy.data.types import SPLITS, DataError, Example, Splits, tokenize
from attnstudy.data.vocab import SPECIALS
from attnstudy.runtime.notices import notice

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


def _check_separators(text: str, where: str, field_name: str, setting: str) -> None:
    """Under ``spaces`` only ASCII spaces separate tokens: any other whitespace (a no-break space,
    a mid-line carriage return, an ideographic space, …) is refused, since whether the writer meant
    it to split a token decides which token every later link points at."""
    for k, ch in enumerate(text, start=1):
        if ch.isspace() and ch != " ":
            name = unicodedata.name(ch, f"the control character {ch!r}")
            raise DataError(
                f"{where}: the {field_name} holds {name} (U+{ord(ch):04X}) at character {k}; under "
                f"data.{setting} = 'spaces' only ASCII spaces separate tokens: replace it with a "
                "space or remove it"
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
    for text, tok, field_name, setting in (
        (fields[0], src_tok, "source", "source_tokenization"),
        (fields[1], tgt_tok, "target", "target_tokenization"),
    ):
        if tok == "spaces":
            _check_separators(text, where, field_name, setting)
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


def _linked(lines: list[_Line]) -> list[tuple[_Line, int, int]]:
    """Every link of the file as (its line, source index, target index), as written."""
    return [(ln, i, j) for ln in lines for _, i, _, j in (ln.links or [])]


def _looks_one_based(linked: list[tuple[_Line, int, int]]) -> bool:
    """Every index ≥ 1, none past the end under 1-based reading, and some one past the end 0-based."""
    return (
        bool(linked)
        and all(1 <= i <= len(ln.src) and 1 <= j <= len(ln.tgt) for ln, i, j in linked)
        and any(i == len(ln.src) or j == len(ln.tgt) for ln, i, j in linked)
    )


def _check_order(
    linked: list[tuple[_Line, int, int]], p: Path, order: str, base: int | None
) -> None:
    """Refuse links that fit the file only when read in the other order (target index first): a
    link past its source or target under every possible index base while every link of the file
    fits swapped.

    Raises:
        DataError: naming the first such link and the setting.
    """
    bases = (0, 1) if base is None else (base,)

    def fits(ln: _Line, i: int, j: int) -> bool:
        return any(b <= i < len(ln.src) + b and b <= j < len(ln.tgt) + b for b in bases)

    bad = next(((ln, i, j) for ln, i, j in linked if not fits(ln, i, j)), None)
    if bad is None or not all(fits(ln, j, i) for ln, i, j in linked):
        return
    ln, i, j = bad
    other = "target-source" if order == "source-target" else "source-target"
    side = "source" if not any(b <= i < len(ln.src) + b for b in bases) else "target"
    written = f"{i}-{j}" if order == "source-target" else f"{j}-{i}"
    raise DataError(
        f"{p}:{ln.number}: alignment link {written} (read {order}) is past the {side}, but every "
        f"link of the file fits when read {other}: set data.alignment_order = '{other}'"
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
    alignment_base: int | None = None,
    max_source_len: int | None = None,
    max_target_len: int | None = None,
    *,
    alignment_order: str = "source-target",
) -> list[Example]:
    """Read ``source<TAB>target[<TAB>pharaoh alignment]`` lines.

    A final line ending and a UTF-8 byte-order mark are fine; any other blank line is an error.
    What the reader cannot interpret with certainty is refused (a special token in the data, a link
    past a field or on a space character, an empty alignment field in a file whose other lines have
    links); doubtful tokenizations get a one-line hint (:func:`attnstudy.runtime.notices.notice`).

    Args:
        path: a UTF-8 text file.
        source_tokenization, target_tokenization: ``"chars"`` or ``"spaces"`` (see :func:`tokenize`).
        split: used in example ids, ``"tsv/<split>/<line number>"``.
        alignment_base: 0 (Pharaoh, fast_align, awesome-align) or 1 (indices counted from 1);
            None: 0, unless not one link of the file uses index 0 (on either side), which under
            0-based links is all but impossible and under 1-based ones certain: then refused,
            asking for the setting (an explicit 0 accepts such a file).
        max_source_len, max_target_len: longer examples are left out, with a notice counting them.
        alignment_order: ``"source-target"`` (Pharaoh's ``i-j``) or ``"target-source"`` (each link
            written target index first); links that fit the file only in the other order are
            refused, naming the setting.

    Raises:
        DataError: ``file:line: problem; what to do`` for a missing file, non-UTF-8 text, a blank
            line, a wrong number of fields, an empty source or target, a special token, a bad or
            misplaced alignment link, links that look 1-based under an unset base, or a file
            without examples.
    """
    p = Path(path)
    lines = _read_lines(p, split, source_tokenization, target_tokenization)
    if alignment_order == "target-source":  # read every link as (source, target)
        lines = [
            replace(ln, links=[(t, j, k, i) for t, i, k, j in ln.links]) if ln.links else ln
            for ln in lines
        ]
    linked = _linked(lines)
    _check_order(linked, p, alignment_order, alignment_base)
    one_based = _looks_one_based(linked)  # then some link is past the end: the error names it
    if alignment_base is None:
        if linked and not one_based and all(i >= 1 and j >= 1 for _, i, j in linked):
            raise DataError(
                f"{p}:{linked[0][0].number}: not one of the file's {len(linked)} alignment links "
                "uses index 0 (source or target), as 1-based links would not: set "
                "data.alignment_base = 1 if they count from 1, or data.alignment_base = 0 if they "
                "are 0-based and no first token is ever linked"
            )
        alignment_base = 0
    examples = _examples(
        lines,
        p,
        split=split,
        base=(alignment_base, one_based),
        tokenization=(source_tokenization, target_tokenization),
        max_len=(max_source_len, max_target_len),
    )
    _tokenization_hints(lines, p, source_tokenization, target_tokenization)
    return examples


def _read_lines(p: Path, split: str, source_tokenization: str, target_tokenization: str) -> list:
    """The file's lines parsed (:func:`_parse_line`), a BOM and the final line ending dropped;
    an empty alignment field refused where other lines have links, noted where none has.

    Raises:
        DataError: a missing or unreadable file, a line that cannot be parsed, no lines, an empty
            alignment field beside linked lines.
    """
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
    return lines


def _examples(
    lines: list,
    p: Path,
    *,
    split: str,
    base: tuple[int, bool],
    tokenization: tuple[str, str],
    max_len: tuple[int | None, int | None],
) -> list[Example]:
    """The lines as examples (``tsv/<split>/<line>``) with their alignments (``base``: the
    alignment base and whether the links look 1-based), those over ``max_len`` (source, target)
    left out with a notice counting them.

    Raises:
        DataError: a misplaced link, or no example left.
    """
    (alignment_base, one_based), (max_source_len, max_target_len) = base, max_len
    examples = []
    too_long = []
    for ln in lines:
        alignment = None
        if ln.links is not None:
            alignment = _alignment(ln, p, alignment_base, one_based, *tokenization)
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
    return examples


def split_examples(
    examples: Sequence[Example], *, dev: float, test: float, salt: str
) -> dict[str, list[Example]]:
    """Split one file's examples into train, dev and test, deterministically and by source.

    Examples are grouped by their source (its tokens: every example of one source lands in the
    same split, so no test source was seen in training); groups are ordered by
    ``sha256(salt + source)`` (ties: the source), as the G2P split orders headwords
    (:func:`attnstudy.data.g2p.g2p_split_words`). Test takes whole groups until it holds at least
    ``round(test × N)`` of the N examples, dev then until it holds at least ``round(dev × N)``,
    train the rest. Each split keeps the file's order, and its ids are ``tsv/<split>/<line>``.

    Args:
        examples: the file's examples (ids ``tsv/<name>/<line number>``).
        dev, test: the shares of the examples in dev and test, in (0, 1), summing to less than 1.
        salt: the hash salt (another salt, another split).

    Returns:
        ``{"train": [...], "dev": [...], "test": [...]}``.

    Raises:
        DataError: a split would be empty (too few distinct sources for the shares asked).
    """
    salted = hashlib.sha256(salt.encode())

    def key(ex: Example) -> str:
        return json.dumps(list(ex.src), ensure_ascii=False)  # unambiguous for any token

    def digest(source: str) -> bytes:
        h = salted.copy()
        h.update(source.encode())
        return h.digest()

    members: dict[str, list[int]] = {}
    for i, ex in enumerate(examples):
        members.setdefault(key(ex), []).append(i)
    order = sorted(members, key=lambda k: (digest(k), k))
    assigned: dict[str, str] = {}
    at = 0
    for name, share in (("test", test), ("dev", dev)):
        n = 0
        while at < len(order) and n < round(share * len(examples)):
            assigned[order[at]] = name
            n += len(members[order[at]])
            at += 1
    out: dict[str, list[Example]] = {name: [] for name in SPLITS}
    for ex in examples:
        name = assigned.get(key(ex), "train")
        line = ex.id.rsplit("/", 1)[-1]
        out[name].append(replace(ex, id=f"tsv/{name}/{line}"))
    empty = [name for name in SPLITS if not out[name]]
    if empty:
        raise DataError(
            f"data.split: {len(examples)} example(s) with {len(members)} distinct source(s) leave "
            f"{' and '.join(empty)} empty (every example of one source goes to one split); use a "
            "larger file or other shares"
        )
    return out


def load_tsv(cfg: DataConfig) -> Splits:
    """The user's own files ``train_path``/``dev_path``/``test_path``, or ``train_path`` split
    by ``split`` (:func:`split_examples`); ``n_*`` take a prefix of each split.

    Raises:
        DataError: as :func:`read_tsv` and :func:`split_examples`, or if a path is not set.
    """

    def read(path: str, split: str) -> list[Example]:
        return read_tsv(
            path,
            cfg.source_tokenization,
            cfg.target_tokenization,
            split,
            cfg.alignment_base if "alignment_base" in cfg.model_fields_set else None,
            cfg.max_source_len,
            cfg.max_target_len,
            alignment_order=cfg.alignment_order,
        )

    whole = None
    if cfg.split is not None:
        s = cfg.split
        whole = split_examples(read(cfg.train_path, "train"), dev=s.dev, test=s.test, salt=s.salt)
    out: dict[str, list[Example]] = {}
    for split in SPLITS:
        path = cfg.train_path if whole is not None else getattr(cfg, f"{split}_path")
        if not path:
            raise DataError(f"task 'tsv' needs data.{split}_path, or {SPLIT_HINT}")
        examples = whole[split] if whole is not None else read(path, split)
        n = getattr(cfg, f"n_{split}")
        if n is not None and n > len(examples):
            notice(
                f"{path}: data.n_{split} = {n} but {'its ' + split + ' split' if whole else 'the file'} "
                f"has {len(examples)} example(s); "
                f"all {len(examples)} are used (leave data.n_{split} unset for the whole file)"
            )
        out[split] = examples[:n] if n is not None else examples
    return Splits(**out)
