"""Shared plumbing of the local-intervention ablations (private).

Slicing a trace into example chunks keeps the (B, P, H, T_y, T_x) replacement tensors inside a
fixed element budget, so memory stays flat whatever the batch and source lengths.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from attnstudy.models import Seq2Seq, Trace
from attnstudy.models.attention import Memory

from .common import PreparedBatch

ELEMENT_BUDGET = 4_000_000
"""Max elements of one replacement tensor (B_chunk · P · H · T_y · T_x), ~16 MB in fp32."""


class NoAttentionError(ValueError):
    """The model has no attention (the ``none`` score): attention-based ablations do not apply."""


def require_attention(model: Seq2Seq, batch: PreparedBatch, name: str) -> Tensor:
    """The traced attention (B, H, T_y, T_x).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    if not model.has_attention or batch.trace.attention is None:
        raise NoAttentionError(f"ablation '{name}' needs attention weights; the 'none' model has none")
    return batch.trace.attention


def sub_trace(trace: Trace, rows: Tensor) -> Trace:
    """The trace of a subset of batch rows. ``rows``: long (B',)."""
    mem = trace.memory
    if mem is not None:
        keys = None if mem.keys is None else mem.keys.index_select(0, rows)
        mem = Memory(keys, mem.values.index_select(0, rows), mem.pad_mask.index_select(0, rows))
    att = None if trace.attention is None else trace.attention.index_select(0, rows)
    return Trace(
        src=trace.src.index_select(0, rows), src_lengths=trace.src_lengths.index_select(0, rows),
        pad_mask=trace.pad_mask.index_select(0, rows), tgt_in=trace.tgt_in.index_select(0, rows),
        tgt_out=trace.tgt_out.index_select(0, rows), step_mask=trace.step_mask.index_select(0, rows),
        logits=trace.logits.index_select(0, rows), attention=att,
        prefix=trace.prefix.index_select(0, rows), memory=mem,
        embedded=trace.embedded.index_select(0, rows),
    )


def example_chunks(trace: Trace, p: int, budget: int = ELEMENT_BUDGET) -> Iterator[Tensor]:
    """Consecutive row index chunks whose (B', P, H, T_y, T_x) weights and (B', P, T_y, V)
    logits each fit in ``budget`` elements."""
    b = trace.src.size(0)
    h = 1 if trace.attention is None else trace.attention.size(1)
    width = max(h * trace.src.size(1), trace.logits.size(-1))
    per = max(1, p * trace.tgt_in.size(1) * width)
    size = max(1, budget // per)
    for start in range(0, b, size):
        yield torch.arange(start, min(b, start + size))


def base_probs(model: Seq2Seq, trace: Trace, chunk_rows: int) -> Tensor:
    """p_t recomputed through the local path from the traced attention, (B, T_y, V).

    Comparing replacements against this (rather than ``trace.logits``) keeps both sides of a
    TVD/flip on the same computation path, so an unchanged row gives exactly the same output.
    """
    return torch.softmax(model.logits_given_attention(trace, trace.attention, chunk_rows), -1)


def n_valid(trace: Trace) -> Tensor:
    """Valid source positions per example, long (B,)."""
    return (~trace.pad_mask).sum(-1)


def step_frame(batch: PreparedBatch) -> tuple[pd.DataFrame, Tensor, Tensor]:
    """(example_id, step) of every real step, with their batch rows and steps (long (N,) each)."""
    b_idx, t_idx = batch.trace.step_mask.nonzero(as_tuple=True)
    ids = batch.example_ids
    frame = pd.DataFrame({"example_id": [ids[i] for i in b_idx.tolist()], "step": t_idx.numpy().astype(np.int64)})
    return frame, b_idx, t_idx
