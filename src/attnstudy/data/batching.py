"""Padding and length-bucketed batching of :class:`~attnstudy.data.types.Example` lists."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnstudy.data.types import Example
from attnstudy.data.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab


@dataclass
class Batch:
    """A padded batch; the source has no ``<bos>``/``<eos>`` (docs/design.md §3).

    Attributes:
        src: ``(B, T_x)`` source ids, padded with ``PAD_ID``.
        src_lengths: ``(B,)`` source lengths in tokens.
        tgt_in: ``(B, T_y)`` decoder input, ``<bos>`` + target, padded.
        tgt_out: ``(B, T_y)`` decoder output, target + ``<eos>``, padded.
        tgt_lengths: ``(B,)`` = target length + 1 (real steps, the ``<eos>`` step included).
        indices: position of each row in the example list given to :func:`collate`.
    """

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_lengths: torch.Tensor
    indices: list[int]

    @property
    def size(self) -> int:
        """Number of examples B."""
        return len(self.indices)

    def to(self, device: torch.device | str) -> Batch:
        """A copy with every tensor on ``device``."""
        return Batch(
            self.src.to(device),
            self.src_lengths.to(device),
            self.tgt_in.to(device),
            self.tgt_out.to(device),
            self.tgt_lengths.to(device),
            list(self.indices),
        )


def collate(
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    indices: Sequence[int] | None = None,
) -> Batch:
    """Encode and pad examples into one :class:`Batch`.

    Args:
        examples: the B examples of the batch, in row order.
        src_vocab: source vocabulary (unknown tokens → ``UNK_ID``).
        tgt_vocab: target vocabulary.
        indices: row → position in the caller's example list; default ``0 … B−1``.

    Returns:
        The batch, on the CPU (move it with :meth:`Batch.to`).

    Raises:
        ValueError: if ``examples`` is empty or ``indices`` has the wrong length.
    """
    if not examples:
        raise ValueError("cannot collate an empty list of examples")
    idx = list(range(len(examples))) if indices is None else [int(i) for i in indices]
    if len(idx) != len(examples):
        raise ValueError(f"got {len(examples)} examples but {len(idx)} indices")
    srcs = [src_vocab.encode(ex.src) for ex in examples]
    tgts = [tgt_vocab.encode(ex.tgt) for ex in examples]
    t_x, t_y = max(map(len, srcs)), max(map(len, tgts)) + 1
    host = torch.device("cpu")  # built on the host; Batch.to moves it to the model's device

    def ids(rows: list[list[int]]) -> torch.Tensor:
        return torch.tensor(rows, dtype=torch.long, device=host)

    return Batch(
        src=ids([s + [PAD_ID] * (t_x - len(s)) for s in srcs]),
        src_lengths=ids([len(s) for s in srcs]),
        tgt_in=ids([[BOS_ID, *t] + [PAD_ID] * (t_y - 1 - len(t)) for t in tgts]),
        tgt_out=ids([[*t, EOS_ID] + [PAD_ID] * (t_y - 1 - len(t)) for t in tgts]),
        tgt_lengths=ids([len(t) + 1 for t in tgts]),
        indices=idx,
    )


def make_batches(
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    batch_size: int,
    shuffle: bool,
    seed: int = 0,
    bucket: bool = True,
) -> list[Batch]:
    """Cut examples into padded batches; deterministic for a given ``seed``.

    With ``bucket`` the examples are sorted by (source length, target length) with a
    seeded random tie-break and cut into consecutive batches, so a batch holds similar
    lengths and little padding; ``shuffle`` then shuffles the order of the batches.
    Without ``bucket`` the examples keep their order (shuffled if ``shuffle``), so a batch
    pads to the longest of a random set. Pass e.g. ``seed + epoch`` for a new order per epoch.

    Args:
        examples: the examples; ``Batch.indices`` refer to positions in this sequence.
        src_vocab: source vocabulary.
        tgt_vocab: target vocabulary.
        batch_size: examples per batch (the last batch may be smaller).
        shuffle: shuffle (seeded) the batch order, or the example order without ``bucket``.
        seed: seed of the tie-break and the shuffles.
        bucket: sort by length before cutting.

    Raises:
        ValueError: if ``batch_size`` < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    rng = random.Random(seed)
    order = list(range(len(examples)))
    if bucket:
        tie = [rng.random() for _ in order]
        order.sort(key=lambda i: (len(examples[i].src), len(examples[i].tgt), tie[i]))
    elif shuffle:
        rng.shuffle(order)
    chunks = [order[k : k + batch_size] for k in range(0, len(order), batch_size)]
    if bucket and shuffle:
        rng.shuffle(chunks)
    return [collate([examples[i] for i in chunk], src_vocab, tgt_vocab, chunk) for chunk in chunks]
