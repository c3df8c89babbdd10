"""Attribution methods per decoder step, batched, with Captum as their reference (docs/attribution.md).

What is attributed: at decoder step t of a teacher-forced pass over the analysis prefix, the
log-probability of the emitted token, f_t(e) = log p_t(ŷ_t | e) with ŷ_t = ``trace.tgt_out[:, t]``,
with respect to the source embeddings e (B, T_x, E) — the contract's ``embed`` and
``trace(embedded=…)``, for every family (recurrent, Transformer, Hugging Face). The gradient
methods detach the cross-attention weights by default (``detach_attention``, as
:func:`~attnstudy.analysis.ablations.importance.gradient_importance` and Jain & Wallace 2019 §3):
the gradient then flows only through the encoder–context path. A token's score is the sum over the
embedding dimension of the per-element attribution (signed); rankings use its absolute value.

Methods (:data:`METHODS`, named and labelled in :mod:`attnstudy.analysis.attribution_params`):

* ``saliency`` — Σ_d |∂f_t/∂e_jd| (Captum ``Saliency``, ``abs=True``), ≥ 0;
* ``input_x_gradient`` — Σ_d e_jd ∂f_t/∂e_jd (Captum ``InputXGradient``); its absolute value is
  importance.py's gradient × input;
* ``integrated_gradients`` — Σ_d (e_jd − b_jd) Σ_k w_k ∂f_t/∂e_jd(b + α_k (e − b)) (Sundararajan
  et al. 2017, eq. 1, Captum's α_k, w_k), with the convergence delta
  Σ_j IG_tj − (f_t(e) − f_t(b)) per step; completeness holds only without detached attention
  (the detached gradient is not the gradient of f_t);
* ``occlusion`` — source token j replaced by a replacement token (no gradient): a registered step
  score of the output change, by default log p_t(ŷ_t) − log p̃_t(ŷ_t) (Captum ``Occlusion`` with a
  one-token window: the same number on every embedding element, so the token's score is that
  number, not E times it).

Batching: the gradient methods make every (example, real step) — for integrated gradients every
(path point, example, real step) — a row of its own, traced over the prefix up to its step only
(the decoders are causal), and take one forward and one backward per chunk of rows
(:func:`_row_gradients`; :func:`_step_gradients`, one backward per step, is its plain reference);
occlusion
traces every (example, position) replacement as one no-grad batch, all steps at once.
:func:`captum_reference` computes each method with Captum on one example and one step.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from attnstudy.data.vocab import PAD_ID, UNK_ID
from attnstudy.models import eval_mode, gradients_in_eval

from .attribution_params import (  # the registry of the methods' names and labels
    METHODS,
    ONE_BACKWARD_METHODS,
)
from .divergences import kendall_tau
from .step_scores import get_step_score

CELLS_PER_PASS = 65_536
"""The gradient methods' chunk bound: rows × prefix length × T_x per forward and backward (at
least one row), which bounds the graph kept (:func:`_row_gradients`)."""

STEP_CELLS = 1_048_576
"""The batched backward's bound: steps × rows × T_y × T_x differentiated together."""

PADDING_SLACK = 1.3
"""How much padding a group of rows of the gradient methods may carry: its padded size (rows ×
longest source × most steps) at most this times the sum of its rows' own sizes."""


@dataclass
class Attribution:
    """Token scores of one method on a batch.

    Attributes:
        scores: (B, T_y, T_x) signed token scores (saliency ≥ 0); NaN at padding positions and
            padding steps.
        delta: (B, T_y) integrated gradients' convergence delta Σ_j IG_tj − (f_t(e) − f_t(b))
            (nats), NaN at padding steps; None for the other methods.
    """

    scores: Tensor
    delta: Tensor | None = None


def _trace_of(batch: Any):
    return getattr(batch, "trace", batch)


def _mask(tr, out: Tensor) -> Tensor:
    invalid = ~tr.step_mask[:, :, None] | tr.pad_mask[:, None, :]
    return out.masked_fill(invalid, math.nan)


def is_hugging_face(model: Any) -> bool:
    """Whether ``model`` is a wrapped Hugging Face model (:class:`attnstudy.models.hf.HFSeq2Seq`)."""
    hf = sys.modules.get("attnstudy.models.hf")  # an HF model exists only once this is imported
    return hf is not None and isinstance(model, hf.HFSeq2Seq)


def token_id(model: Any, which: str) -> int:
    """The attnstudy id of a replacement or baseline token.

    Args:
        which: ``"unk"`` (``<unk>``; a Hugging Face model's unknown token, or its pad token where
            it has none), ``"pad"``, or ``"auto"`` (``<unk>`` for attnstudy's models, the pad token
            for a Hugging Face model).

    Raises:
        ValueError: another name.
    """
    if which == "auto":
        which = "pad" if is_hugging_face(model) else "unk"
    if which not in ("unk", "pad"):
        raise ValueError(f"unknown replacement token {which!r}; valid: auto, unk, pad")
    return UNK_ID if which == "unk" else PAD_ID


def _step_gradients(
    model, tr, embedded: Tensor, detach_attention: bool, *, reps: int = 1
) -> Iterator[tuple[int, Tensor]]:
    """(t, ∂ Σ_rows log p_t(ŷ_t) / ∂e) for every step t, one backward each: the plain per-step
    reference of :func:`_row_gradients` (tests hold them equal).

    ``embedded``: (reps · B, T_x, E), the batch repeated ``reps`` times (row r·B + b is example
    b). Yields gradients (reps · B, T_x, E); call inside ``eval_mode`` and ``gradients_in_eval``.
    """
    leaf = embedded.detach().requires_grad_(True)
    tgt_out = tr.tgt_out.repeat(reps, 1)
    trace = model.trace(
        tr.src.repeat(reps, 1),
        tr.src_lengths.repeat(reps),
        tr.tgt_in.repeat(reps, 1),
        tgt_out,
        embedded=leaf,
        detach_attention=detach_attention,
    )
    steps = getattr(trace, "step_logits", None) or trace.logits.unbind(1)  # T_y × (N, V)
    t_y = len(steps)
    for t in range(t_y):
        logp = torch.log_softmax(steps[t], -1).gather(-1, tgt_out[:, t : t + 1])
        (g,) = torch.autograd.grad(logp.sum(), leaf, retain_graph=t < t_y - 1)
        yield t, g


def _groups(lengths: list[int], steps: list[int], cells: int) -> Iterator[tuple[int, int]]:
    """[start, stop) runs of rows sorted by (source length, steps): a run grows while its padded
    size (rows × longest source × most steps) stays within :data:`PADDING_SLACK` times the rows'
    own sizes and within ``cells``."""
    start = 0
    while start < len(lengths):
        stop, own = start + 1, lengths[start] * steps[start]
        longest, most = lengths[start], steps[start]
        while stop < len(lengths):
            n_x, n_y = max(longest, lengths[stop]), max(most, steps[stop])
            padded = (stop + 1 - start) * n_x * n_y
            grown = own + lengths[stop] * steps[stop]
            if padded > PADDING_SLACK * grown or padded > cells:
                break
            stop, own, longest, most = stop + 1, grown, n_x, n_y
        yield start, stop
        start = stop


def _row_gradients(
    model, tr, embedded: Tensor, detach_attention: bool, *, cells: int = CELLS_PER_PASS
) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
    """∂ log p_t(ŷ_t) / ∂e of every row and step, from one forward per group of rows and one
    batched backward per chunk of steps.

    The rows are sorted by source length and grouped (:func:`_groups`), so that a group is traced
    cut to its own longest source and prefix (little padding); each group's steps are
    differentiated together by a batched backward (``torch.autograd.grad(is_grads_batched=True)``,
    a vmap over one-hot grad_outputs: step t's cotangent is 1 at (every row, t)), in chunks of at
    most ``cells`` (steps × rows × T_y × T_x), which bounds the memory of the batched gradients.
    Where an operation has no batching rule the steps fall back to one backward each. The rows of
    a batch are independent, so the sum over a group's rows of log p_t differentiates to each
    row's own gradient. :func:`_step_gradients` is its plain reference.

    Args:
        embedded: (N, T_x, E), N = reps · B: the batch's embeddings (or path points) repeated,
            row n being example n mod B.
        cells: the bound of a group's trace (rows × T_y × T_x) and of a chunk of steps.

    Yields:
        (n (R,), t (k,), gradients (k, R, m, E)) — rows, steps and their gradients, m the group's
        longest source; steps beyond a row's own are padding steps (the callers mask them); call
        inside ``eval_mode`` and ``gradients_in_eval``.
    """
    b = tr.src.size(0)
    reps = embedded.size(0) // b
    n_steps = tr.step_mask.sum(1).repeat(reps)
    lengths = tr.src_lengths.repeat(reps)
    order = torch.argsort(lengths * (tr.tgt_in.size(1) + 1) + n_steps, stable=True)
    for start, stop in _groups(lengths[order].tolist(), n_steps[order].tolist(), cells):
        n = order[start:stop]
        ex = n % b
        m, t_y = int(lengths[n].max()), int(n_steps[n].max())
        leaf = embedded[n, :m].detach().requires_grad_(True)
        trace = model.trace(
            tr.src[ex, :m],
            tr.src_lengths[ex],
            tr.tgt_in[ex, :t_y],
            tr.tgt_out[ex, :t_y],
            embedded=leaf,
            detach_attention=detach_attention,
        )
        # a recurrent trace keeps each step's logits: a chunk's backward then visits its steps'
        # prefixes only, not the whole stacked output (Trace.step_logits)
        per_step = getattr(trace, "step_logits", None)
        k = max(1, STEP_CELLS // (n.numel() * t_y * m))
        for t0 in range(0, t_y, k):
            t1 = min(t_y, t0 + k)
            logits = torch.stack(per_step[t0:t1], 1) if per_step else trace.logits[:, t0:t1]
            logp = torch.log_softmax(logits, -1).gather(-1, tr.tgt_out[ex, t0:t1, None])[..., 0]
            t = torch.arange(t0, t1, device=n.device)
            yield n, t, _batched_grad(logp, leaf, retain_graph=t1 < t_y)


def _batched_grad(logp: Tensor, leaf: Tensor, *, retain_graph: bool) -> Tensor:
    """(k, R, …) gradients of Σ_rows logp[:, i] for each of the k columns of ``logp`` (R, k)
    (vmapped; one backward per column where vmap cannot batch an operation)."""
    k = logp.size(1)
    one_hot = torch.zeros(k, *logp.shape, dtype=logp.dtype, device=logp.device)
    steps = torch.arange(k, device=logp.device)
    one_hot[steps, :, steps] = 1.0
    if k == 1:
        return torch.autograd.grad(logp, leaf, one_hot[0], retain_graph=retain_graph)[0][None]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # vmap's per-operation performance notes
            (g,) = torch.autograd.grad(
                logp, leaf, one_hot, retain_graph=retain_graph, is_grads_batched=True
            )
        return g
    except RuntimeError:  # an operation without a batching rule: one backward per step
        last = one_hot.size(0) - 1
        return torch.stack(
            [
                torch.autograd.grad(logp, leaf, o, retain_graph=retain_graph or i < last)[0]
                for i, o in enumerate(one_hot)
            ]
        )


def gradient_scores(model, batch, *, detach_attention: bool = True) -> dict[str, Tensor]:
    """Saliency and input × gradient of every step from one backward per step.

    Args:
        model: any model with the ``gradients`` capability (mode restored; no parameter
            gradient accumulated). batch: a prepared batch (or its trace).
        detach_attention: stop the gradient through the cross-attention weights.

    Returns:
        ``{"saliency": Σ_d |g|, "input_x_gradient": Σ_d g·e}``, each (B, T_y, T_x) (nats per unit
        of embedding), NaN at padding positions and steps.
    """
    tr = _trace_of(batch)
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    sal = torch.zeros(b, t_y, t_x, dtype=tr.logits.dtype, device=tr.src.device)
    ixg = torch.zeros_like(sal)
    with eval_mode(model), gradients_in_eval():
        e = model.embed(tr.src).detach()
        for n, t, g in _row_gradients(model, tr, e, detach_attention):
            m, cell = g.size(2), (n[None, :], t[:, None])
            sal[:, :, :m][cell] = g.abs().sum(-1)
            ixg[:, :, :m][cell] = (g * e[n, :m]).sum(-1)
    return {"saliency": _mask(tr, sal), "input_x_gradient": _mask(tr, ixg)}


def _baseline(model, tr, which: str, e: Tensor) -> Tensor:
    if which == "zero":
        base = torch.zeros_like(e)
    else:
        base = model.embed(torch.full_like(tr.src, token_id(model, which))).detach()
    return torch.where(tr.pad_mask[..., None], e, base)  # padding stays as it is


def integrated_gradients(
    model,
    batch,
    *,
    n_steps: int = 50,
    baseline: str = "zero",
    approximation: str = "gausslegendre",
    detach_attention: bool = True,
    cells: int = CELLS_PER_PASS,
) -> Attribution:
    """Integrated gradients of every step (Sundararajan et al. 2017, eq. 1), batched.

    IG_tj = Σ_d (e_jd − b_jd) Σ_k w_k ∂f_t/∂e_jd(b + α_k (e − b)), with Captum's α_k and w_k for
    ``approximation`` (``captum.attr._utils.approximation_methods``). Every (path point, example,
    real step) is a row of :func:`_row_gradients`: one forward and one backward per chunk of rows.

    Args:
        model, batch: as :func:`gradient_scores`.
        n_steps: path points (≥ 2). baseline: ``"zero"``, ``"unk"`` or ``"pad"`` (the token's
            embedding at every real position; padding keeps its own).
        approximation: Captum's ``method``. detach_attention: as :func:`gradient_scores`.
        cells: the chunk bound (:data:`CELLS_PER_PASS`).

    Returns:
        :class:`Attribution` with the convergence delta per step.

    Raises:
        ValueError: n_steps < 2, an unknown approximation or baseline.
    """
    from captum.attr._utils.approximation_methods import approximation_parameters

    if n_steps < 2:
        raise ValueError(f"integrated gradients needs n_steps ≥ 2, got {n_steps}")
    step_sizes, alphas_of = approximation_parameters(approximation)
    tr = _trace_of(batch)
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    dtype, dev = tr.logits.dtype, tr.src.device
    weights = torch.tensor(step_sizes(n_steps), dtype=torch.float64, device=dev)
    alphas = torch.tensor(alphas_of(n_steps), dtype=dtype, device=dev)
    # the path sum accumulated in float64: its terms are large where the delta is small
    out = torch.zeros(b, t_y, t_x, dtype=torch.float64, device=dev)
    with eval_mode(model), gradients_in_eval():
        e = model.embed(tr.src).detach()
        base = _baseline(model, tr, baseline, e)
        step = e - base  # the path's direction, in the model's dtype
        diff = step.double()
        points = (base[None] + alphas[:, None, None, None] * step[None]).flatten(0, 1)
        for n, t, g in _row_gradients(model, tr, points, detach_attention, cells=cells):
            ex, m = n % b, g.size(2)
            # Σ_d (e − b)_d w_k ∂f_t/∂e_d at the row's α_k, summed into its (example, step)
            term = (g.double() * diff[ex, :m]).sum(-1) * weights[n // b][None, :, None]
            cell = (ex[None, :].expand(t.numel(), -1), t[:, None].expand(-1, ex.numel()))
            out[:, :, :m].index_put_(cell, term, accumulate=True)
        with torch.no_grad():
            f_x = _target_logp(model.trace(tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out), tr)
            f_b = _target_logp(
                model.trace(tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=base), tr
            )
    scores = _mask(tr, out)
    delta = scores.nan_to_num(0.0).sum(-1) - (f_x.double() - f_b.double())
    return Attribution(scores.to(dtype), delta.masked_fill(~tr.step_mask, math.nan))


def _target_logp(trace, tr) -> Tensor:
    """log p_t(ŷ_t), (B, T_y)."""
    return torch.log_softmax(trace.logits, -1).gather(-1, tr.tgt_out[..., None])[..., 0]


def occlusion(
    model,
    batch,
    *,
    replacement: str = "auto",
    score: str = "log_probability_drop",
    chunk_rows: int = 4096,
) -> Attribution:
    """Occlusion of each source token by a replacement token, every step at once (no gradient).

    O_tj = score(p̃_t^{(j)}, p_t, ŷ_t), p̃^{(j)} the trace of the same prefix over the source with
    token j replaced (:func:`token_id`); the default score, log p_t(ŷ_t) − log p̃_t(ŷ_t), is
    Captum's ``Occlusion`` with a one-token window. All B × T_x replacements are traced as one
    batch, ``chunk_rows // T_y`` sources per call.

    Args:
        model, batch: as :func:`gradient_scores`. replacement: ``"auto"``, ``"unk"`` or ``"pad"``.
        score: a registered step score (:mod:`attnstudy.analysis.step_scores`).
        chunk_rows: decoder rows (sources × T_y) per trace call.

    Returns:
        :class:`Attribution` (no delta), in the score's unit.

    Raises:
        UnknownStepScoreError: ``score`` is not registered. ValueError: unknown replacement.
    """
    fn = get_step_score(score).fn
    rep = token_id(model, replacement)
    tr = _trace_of(batch)
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    out = torch.full((b, t_y, t_x), math.nan, dtype=tr.logits.dtype, device=tr.src.device)
    valid = (~tr.pad_mask).nonzero()  # (R, 2): example, position
    rows_b, rows_j = valid[:, 0], valid[:, 1]
    # the score from float64 probabilities: a drop of 1e-5 nats is a difference of log-probabilities
    # whose float32 ulp (2.4e-7 at 2–4 nats) is 1 % of it, and equal drops at two positions were
    # then exact ties one ulp of batch-dependent noise apart (an argmax read as an alignment flipped)
    p = torch.softmax(tr.logits.double(), -1)
    per_chunk = max(1, chunk_rows // t_y)
    with eval_mode(model), torch.no_grad():
        for start in range(0, rows_b.numel(), per_chunk):
            rb, rj = rows_b[start : start + per_chunk], rows_j[start : start + per_chunk]
            src = tr.src[rb].clone()
            src[torch.arange(rb.numel(), device=src.device), rj] = rep
            lengths = tr.src_lengths[rb]
            n_max = int(lengths.max())
            trace = model.trace(src[:, :n_max], lengths, tr.tgt_in[rb], tr.tgt_out[rb])
            drop = fn(torch.softmax(trace.logits.double(), -1), p[rb], tr.tgt_out[rb])
            out[rb, :, rj] = drop.to(out.dtype)
    return Attribution(_mask(tr, out))


def attribution(model, batch, method: str, chunk_rows: int = 4096, **params) -> Attribution:
    """One method's :class:`Attribution` (``params``: the method's settings,
    :mod:`attnstudy.analysis.attribution_params`).

    Raises:
        ValueError: an unknown method (the message lists :data:`METHODS`) or setting.
    """
    if method in ONE_BACKWARD_METHODS:
        unknown = set(params) - {"detach_attention"}
        if unknown:
            raise ValueError(f"{method} takes detach_attention only, got {sorted(unknown)}")
        return Attribution(gradient_scores(model, batch, **params)[method])
    if method == "integrated_gradients":
        return integrated_gradients(model, batch, **params)
    if method == "occlusion":
        return occlusion(model, batch, chunk_rows=chunk_rows, **params)
    raise ValueError(f"unknown attribution method {method!r}; valid: {', '.join(METHODS)}")


def cached_attribution(model, batch, method: str, ctx: Any, params: dict) -> Attribution:
    """:func:`attribution`, computed once per (model, batch, method, settings) within a run.

    The run's cache is ``ctx.cache`` (:class:`~attnstudy.analysis.batch.AblationContext`, one per
    suite run; a context without one computes every time). An entry is used only for the same
    model object and the same trace tensors (``src``, ``tgt_in``: every analysis unit of a batch
    shares them, and the scores do not depend on the unit); one entry per (method, settings) is
    kept, the latest batch's. Saliency and input × gradient with the same settings come from one
    :func:`gradient_scores` pass and are stored together.

    Args:
        model, batch, method: as :func:`attribution`. ctx: the run context (``chunk_rows``,
            ``cache``). params: the method's settings (a dict).

    Raises:
        ValueError: as :func:`attribution`.
    """
    cache = getattr(ctx, "cache", None)
    tr = _trace_of(batch)
    settings = tuple(sorted(params.items()))
    if cache is not None:
        hit = cache.get((method, settings))
        if hit is not None and hit[0] is model and hit[1] is tr.src and hit[2] is tr.tgt_in:
            return hit[3]
    if method in ONE_BACKWARD_METHODS and set(params) <= {"detach_attention"}:
        found = {m: Attribution(v) for m, v in gradient_scores(model, batch, **params).items()}
    else:
        found = {method: attribution(model, batch, method, chunk_rows=ctx.chunk_rows, **params)}
    if cache is not None:
        for m, result in found.items():
            cache[(m, settings)] = (model, tr.src, tr.tgt_in, result)
    return found[method]


def attribute(model, batch, method: str = "input_x_gradient", **params) -> Tensor:
    """Token scores of an attribution method at every decoder step: the public entry point.

    Args:
        model: any model of the contract with the ``gradients`` capability (attnstudy's own, or a
            Hugging Face folder loaded with :func:`attnstudy.models.hf.load_pretrained`).
        batch: a :class:`~attnstudy.analysis.batch.PreparedBatch` (e.g. from
            :func:`~attnstudy.analysis.batch.prepare_batches`) or its trace: the teacher-forced
            prefix whose emitted tokens are the targets.
        method: one of :data:`METHODS`. params: the method's settings (``detach_attention``,
            ``n_steps``, ``baseline``, ``approximation``, ``replacement``, ``score``, ``chunk_rows``).

    Returns:
        (B, T_y, T_x) signed token scores (sum over the embedding dimension), NaN at padding.

    Raises:
        ValueError: an unknown method or setting.
    """
    return attribution(model, batch, method, **params).scores


# ----------------------------------------------------------------------------- Captum references


def captum_reference(
    model, batch, method: str, *, row: int, step: int, **params
) -> tuple[Tensor, Tensor | None]:
    """Captum's attribution of one example's step: the plain reference of the batched forms.

    The example is traced alone over its own (unpadded) source and prefix; the forward function
    returns log p_step(ŷ_step) for embeddings given to the contract's ``trace(embedded=…)``.

    Args:
        model, batch: as :func:`attribute`. method: one of :data:`METHODS`. row: the batch row.
        step: the decoder step. params: the method's settings (occlusion: ``replacement`` only;
            its score is Captum's, log p_t(ŷ_t) − log p̃_t(ŷ_t)).

    Returns:
        (token scores (n,) over the example's n source tokens, the convergence delta (scalar) for
        integrated gradients else None).
    """
    from captum.attr import InputXGradient, IntegratedGradients, Occlusion, Saliency

    tr = _trace_of(batch)
    n, steps = int(tr.src_lengths[row]), int(tr.step_mask[row].sum())
    src = tr.src[row : row + 1, :n]
    lengths = tr.src_lengths[row : row + 1]
    tgt_in, tgt_out = tr.tgt_in[row : row + 1, :steps], tr.tgt_out[row : row + 1, :steps]
    detach = params.pop("detach_attention", True)

    def forward(emb: Tensor) -> Tensor:
        m = emb.size(0)
        trace = model.trace(
            src.expand(m, -1),
            lengths.expand(m),
            tgt_in.expand(m, -1),
            tgt_out.expand(m, -1),
            embedded=emb,
            detach_attention=detach,
        )
        target = tgt_out[:, step].expand(m)
        return torch.log_softmax(trace.logits[:, step], -1).gather(-1, target[:, None])[:, 0]

    with eval_mode(model), gradients_in_eval():
        e = model.embed(src).detach().requires_grad_(True)
        if method == "saliency":
            return Saliency(forward).attribute(e, abs=True).sum(-1)[0].detach(), None
        if method == "input_x_gradient":
            return InputXGradient(forward).attribute(e).sum(-1)[0].detach(), None
        if method == "integrated_gradients":
            which = params.get("baseline", "zero")
            base = (
                torch.zeros_like(e)
                if which == "zero"
                else model.embed(torch.full_like(src, token_id(model, which))).detach()
            )
            attr, delta = IntegratedGradients(forward).attribute(
                e,
                baselines=base,
                n_steps=params.get("n_steps", 50),
                method=params.get("approximation", "gausslegendre"),
                return_convergence_delta=True,
            )
            return attr.sum(-1)[0].detach(), delta[0].detach()
        if method == "occlusion":
            rep = model.embed(
                torch.full_like(src, token_id(model, params.get("replacement", "auto")))
            )
            with torch.no_grad():
                attr = Occlusion(forward).attribute(
                    e,
                    sliding_window_shapes=(1, e.size(-1)),
                    strides=(1, e.size(-1)),
                    baselines=rep.detach(),
                )
            return attr[0, :, 0], None
    raise ValueError(f"unknown attribution method {method!r}; valid: {', '.join(METHODS)}")


# ----------------------------------------------------------------------------- Kendall τ tables

REASON_NO_ATTENTION = "no attention (the 'none' model)"
REASON_ONE_POSITION = "one valid source position"
REASON_CONSTANT = "constant vector"


def tau_table(
    batch, name: str, vectors: dict[str, Tensor | None], pairs: dict[str, tuple[str, str]]
) -> pd.DataFrame:
    """Kendall τ-b per real step between pairs of token-score vectors, ranked by absolute value.

    Args:
        batch: the prepared batch (example ids, step mask, source lengths).
        name: the ablation's name (column prefix).
        vectors: label → (B, T_y, T_x) scores (signed; ``"attn"``: the head-mean attention, or None
            for a model without attention).
        pairs: column key → (label, label).

    Returns:
        One row per real step: ``example_id``, ``step``, ``<name>_skipped`` (fewer than 2 source
        positions), ``<name>_tau_<key>`` and ``<name>_p_<key>`` (Kendall τ-b of the absolute
        scores and its p-value, NaN when undefined) and ``<name>_reason`` (why some τ of the row
        is undefined, else None).
    """
    tr = _trace_of(batch)
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    arrays = {
        k: None if v is None else v.detach().abs().double().cpu().numpy()
        for k, v in vectors.items()
    }
    lengths = tr.src_lengths.tolist()
    taus: dict[str, list[float]] = {k: [] for k in pairs}
    ps: dict[str, list[float]] = {k: [] for k in pairs}
    skipped, reasons = [], []
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        n = int(lengths[b])
        skipped.append(n < 2)
        reason = REASON_ONE_POSITION if n < 2 else None
        for key, (x, y) in pairs.items():
            ax, ay = arrays[x], arrays[y]
            if n < 2 or ax is None or ay is None:
                tau, p = math.nan, math.nan
                if n >= 2:
                    reason = reason or REASON_NO_ATTENTION
            else:
                tau, p = kendall_tau(ax[b, t, :n], ay[b, t, :n])
                if math.isnan(tau):
                    reason = reason or REASON_CONSTANT
            taus[key].append(tau)
            ps[key].append(p)
        reasons.append(reason)
    frame = pd.DataFrame(
        {
            "example_id": [batch.examples[b].id for b in b_idx.tolist()],
            "step": t_idx.cpu().numpy().astype(np.int64),
            f"{name}_skipped": np.asarray(skipped, dtype=bool),
        }
    )
    for key in pairs:
        frame[f"{name}_tau_{key}"] = np.asarray(taus[key], dtype=float)
        frame[f"{name}_p_{key}"] = np.asarray(ps[key], dtype=float)
    frame[f"{name}_reason"] = pd.Series(reasons, dtype=object)
    return frame


def head_mean_attention(batch) -> Tensor | None:
    """The analysed layer's head-mean attention (B, T_y, T_x), or None without attention."""
    att = _trace_of(batch).attention
    return None if att is None else att.mean(1)


def run_method(method: str, model, batch, params, ctx) -> pd.DataFrame:
    """The catalogue entry of one method: its scores per step and Kendall τ-b against attention.

    Args:
        method: one of :data:`METHODS` (also the entry's name). model, batch: as
            :func:`attribute`. params: the entry's :mod:`~attnstudy.analysis.attribution_params`.
        ctx: the run context (``chunk_rows``).

    Returns:
        One row per real step: ``example_id``, ``step``, ``<method>_skipped``,
        ``<method>_tau_attn``, ``<method>_p_attn`` (τ of head-mean attention against |scores|,
        NaN without attention), ``<method>_reason``; integrated gradients adds
        ``integrated_gradients_delta`` (the convergence delta, nats) and its absolute value
        ``integrated_gradients_abs_delta``.
    """
    found = cached_attribution(model, batch, method, ctx, params.model_dump())
    frame = tau_table(
        batch,
        method,
        {"attn": head_mean_attention(batch), method: found.scores},
        {"attn": ("attn", method)},
    )
    if found.delta is not None:
        tr = _trace_of(batch)
        b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
        delta = found.delta[b_idx, t_idx].double().cpu().numpy()
        frame[f"{method}_delta"] = delta
        frame[f"{method}_abs_delta"] = np.abs(delta)
    return frame
