"""A pretrained model's examples from text: a TSV file's lines or raw rows, re-tokenized into
the model's subwords with their gold links (what ``attnstudy ablate hf:FOLDER --tsv FILE``
reads). No store, no MLflow: :mod:`attnstudy.study.pretrained` records what is analysed,
:mod:`attnstudy.study.unrecorded` analyses without recording.
"""

from __future__ import annotations

from pathlib import Path

from attnstudy.data.alignment import parse_pharaoh
from attnstudy.data.types import DataError, Example


def read_tsv(path: str | Path) -> list[tuple[str, str, str | None]]:
    """Lines ``source<TAB>target[<TAB>links]`` of a UTF-8 file, as raw text.

    Raises:
        DataError: a missing or non-UTF-8 file, a blank line, a line with another number of
            fields or an empty field — naming file and line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; pass a TSV of source<TAB>target lines") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 ({e.reason} at byte {e.start}); convert it") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            raise DataError(f"{path}:{n}: blank line; remove it (one example per line)")
        fields = line.split("\t")
        if len(fields) not in (2, 3) or not all(f.strip() for f in fields[:2]):
            raise DataError(
                f"{path}:{n}: expected source<TAB>target[<TAB>links], got {len(fields)} field(s)"
            )
        rows.append((fields[0], fields[1], fields[2] if len(fields) == 3 else None))
    if not rows:
        raise DataError(f"{path}: no examples")
    return rows


def tsv_examples(model, path: str | Path) -> list[Example]:
    """A TSV file's examples (:func:`read_tsv`) as the pretrained ``model`` sees them, as
    ``attnstudy ablate hf:FOLDER --tsv FILE`` reads them: ids ``<file stem>/<line>``, source and
    target re-tokenized into the model's subwords (the source's end-of-sequence token included),
    gold links kept between the space-separated words
    (:func:`attnstudy.models.hf.subword_examples`).

    Args:
        model: a :class:`attnstudy.models.hf.HFSeq2Seq` (:func:`attnstudy.models.hf.load_pretrained`).
        path: the UTF-8 TSV file, ``source<TAB>target[<TAB>links]`` per line.

    Raises:
        DataError: an unreadable file, a malformed line or links (naming file and line).
        HFError: gold links the tokenizer's subwords cannot be mapped back to.
    """
    path = Path(path)
    return _examples(model, read_tsv(path), path.stem, lambda n: f"{path}:{n}")


def text_examples(model, rows, name: str = "text") -> list[Example]:
    """Examples of raw text as the pretrained ``model`` sees them, as :func:`tsv_examples` makes
    them from a file's lines: ids ``<name>/<n>`` (from 1), source and target re-tokenized into
    the model's subwords (the source's end-of-sequence token included), gold links kept between
    the space-separated words (:func:`attnstudy.models.hf.subword_examples`).

    Args:
        model: a :class:`attnstudy.models.hf.HFSeq2Seq` (:func:`attnstudy.models.hf.load_pretrained`).
        rows: ``(source, target)`` or ``(source, target, links)`` texts; ``links``: 0-based
            Pharaoh ``i-j`` between words (``ip j`` possible), or None.
        name: the ids' prefix.

    Raises:
        DataError: an empty text or links that do not fit the words (naming the row).
        HFError: gold links the tokenizer's subwords cannot be mapped back to.
    """
    triples = []
    for n, row in enumerate(rows, 1):
        if len(row) not in (2, 3) or not all(isinstance(x, str) and x.strip() for x in row[:2]):
            raise DataError(
                f"{name} row {n}: expected (source, target[, links]) texts, got {row!r}"
            )
        triples.append((row[0], row[1], row[2] if len(row) == 3 else None))
    return _examples(model, triples, name, lambda n: f"{name} row {n}")


def _examples(model, rows, name: str, where) -> list[Example]:
    """``(source, target, links)`` texts as the model's examples, ids ``<name>/<n>``; an error
    names row ``n`` as ``where(n)``."""
    from attnstudy.models.hf import subword_examples

    words = []
    for n, (src, tgt, links) in enumerate(rows, 1):
        s, t = tuple(src.split(" ")), tuple(tgt.split(" "))
        alignment = None
        if links is not None and links.strip():
            try:
                alignment = parse_pharaoh(links, len(s), len(t))
            except ValueError as e:
                raise DataError(f"{where(n)}: {e}") from None
        words.append(Example(f"{name}/{n}", s, t, alignment))
    return subword_examples(model, words, " ", " ")
