"""Shared plumbing of the local-intervention ablations (private).

Slicing a trace into example chunks keeps the (B, P, H, T_y, T_x) replacement tensors inside a
fixed element budget, so memory stays flat whatever the batch and source lengths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from attnstudy.models import Seq2Seq, Trace

from .batch import PreparedBatch
from .errors import NoAttentionError

ELEMENT_BUDGET = 4_000_000
"""Max elements of one replacement tensor (B_chunk · P · H · T_y · T_x), ~16 MB in fp32."""


def require_attention(model: Seq2Seq, batch: PreparedBatch, name: str) -> Tensor:
    """The traced attention (B, H, T_y, T_x).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    if not model.has_attention or batch.trace.attention is None:
        raise NoAttentionError(
            f"ablation '{name}' needs attention weights; the 'none' model has none"
        )
    return batch.trace.attention


def sub_trace(trace: Trace, rows: Tensor, start: int = 0, stop: int | None = None) -> Trace:
    """:meth:`Trace.select`: the trace of some batch rows and a window of decoder steps."""
    return trace.select(rows, start, stop)


@dataclass(frozen=True)
class Chunk:
    """Batch rows and a step window ``[start, stop)`` whose replacement tensors fit the budget."""

    rows: Tensor
    start: int
    stop: int


def trace_chunks(trace: Trace, p: int, budget: int | None = None) -> Iterator[Chunk]:
    """Chunks of a trace whose (B', P, H, T', T_x) weights and (B', P, T', V) logits each fit in
    ``budget`` elements (default :data:`ELEMENT_BUDGET`).

    Consecutive examples are grouped while whole examples fit; an example too long for the budget
    on its own is cut into windows of its real steps, so one long example's memory stays bounded too
    (a 5,000-token example once asked for 250 GB).
    """
    budget = ELEMENT_BUDGET if budget is None else budget
    b, t_y = trace.src.size(0), trace.tgt_in.size(1)
    h = 1 if trace.attention is None else trace.attention.size(1)
    per_step = max(1, p * max(h * trace.src.size(1), trace.logits.size(-1)))
    steps_fit = max(1, budget // per_step)
    if steps_fit >= t_y:
        size = max(1, budget // (per_step * t_y))
        for start in range(0, b, size):
            yield Chunk(torch.arange(start, min(b, start + size), device=trace.src.device), 0, t_y)
        return
    real = trace.step_mask.sum(1).tolist()
    for row in range(b):
        n = int(real[row]) if real[row] else 0
        for start in range(0, n, steps_fit):
            yield Chunk(
                torch.tensor([row], device=trace.src.device), start, min(n, start + steps_fit)
            )


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
    return step_table(batch, b_idx, t_idx, {}), b_idx, t_idx


def step_table(batch: PreparedBatch, b_idx: Tensor, t_idx: Tensor, columns: dict) -> pd.DataFrame:
    """:func:`step_frame`'s table with ``columns`` (name → values (N,)) after example_id and
    step, built at once (a column inserted into a frame costs a copy of its blocks)."""
    ids = batch.example_ids
    return pd.DataFrame(
        {
            "example_id": [ids[i] for i in b_idx.tolist()],
            "step": t_idx.cpu().numpy().astype(np.int64),
            **columns,
        }
    )


def rows_given_attention(
    model, trace: Trace, b_idx: Tensor, t_idx: Tensor, chunk_rows: int = 4096
) -> Callable[[Tensor], Tensor]:
    """Local intervention at N scattered (example, step) rows, prepared once, applied many times.

    The model's own ``rows_given_attention(trace, b_idx, t_idx)`` when it has one that applies
    (the recurrent family, and the Transformer with one layer analysed: no scatter per call);
    else the scatter form over the contract's ``logits_given_attention``, computing those steps
    only.

    Args:
        model: a model with the ``local`` capability.
        trace: its trace; b_idx, t_idx: long (N,), batch row and step of each (real) row.
        chunk_rows: rows per output-layer call of ``logits_given_attention``.

    Returns:
        ``logits(weights)``: replacement rows (N, K, H', T_x) of the analysed unit → logits
        (N, K, V), differentiable in ``weights``; the recurrent family's row forms also have
        ``with_vjp(weights) -> (logits, vjp)``, the gradient written out
        (:class:`attnstudy.models.seq2seq.RowLogits`).
    """
    fast = getattr(model, "rows_given_attention", None)
    prepared = fast(trace, b_idx, t_idx) if fast is not None else None
    if prepared is not None:
        return prepared
    b, t_y = trace.src.size(0), trace.tgt_in.size(1)
    steps = torch.zeros_like(trace.step_mask)
    steps[b_idx, t_idx] = True

    def logits(weights: Tensor) -> Tensor:
        n, k, h, t_x = weights.shape
        full = weights.new_zeros(b, t_y, k, h, t_x).index_put((b_idx, t_idx), weights)
        out = model.logits_given_attention(
            trace, full.permute(0, 2, 3, 1, 4), chunk_rows=chunk_rows, steps=steps
        )  # (B, K, T_y, V)
        return out.permute(0, 2, 1, 3)[b_idx, t_idx]

    return logits
