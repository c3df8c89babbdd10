"""Source vs prefix: how much of each prediction the gradient methods attribute to the source.

A decoder step's output depends on two inputs, the source tokens and the target prefix (BOS and
the tokens before y_t). Voita et al. (ACL 2021, "Analyzing the Source and Target Contributions
to Predictions in NMT") measure their shares with LRP; inseq's ``attribute_target`` gives the
gradient-based form, computed here for saliency, input × gradient and integrated gradients. At
step t, with source embeddings e (T_x, E) and prefix embeddings f (T_y, E) (the contract's
``embed`` and ``embed_target``, differentiated through ``trace(embedded=, embedded_target=)``),
each method gives a score a_tj per source token and p_tk per prefix token k ≤ t (summed over the
embedding dimension, as :mod:`attnstudy.analysis.attribution`); the **source share** is

    S_t = Σ_j |a_tj| / (Σ_j |a_tj| + Σ_{k≤t} |p_tk|)        (1: all from the source)

(undefined where both sums are 0). Integrated gradients move the source and the prefix along one
path from the zero baseline together, so completeness covers both:
Σ_j IG_tj + Σ_k IG_tk = f_t(e, f) − f_t(0, 0); its delta is reported. The gradient flows through
the attention weights by default (``detach_attention = false``; detached, the gradient is not
that of f_t and completeness does not hold).

Computed plainly: per batch one trace through leaf embeddings (per path point for integrated
gradients) and one backward per decoder step (the rows of a batch are independent, so the sum
over rows differentiates to each row's own gradient).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.attribution_params import (
    GRADIENT_METHODS,
    METHOD_LABELS,
    SourcePrefixParams,
)
from attnstudy.analysis.catalogue import AblationSpec, Figure, Question, Stat
from torch import Tensor

from attnstudy.data.vocab import PAD_ID

from ..attribution import _baseline, _target_logp

SOURCE_PREFIX_METHODS = GRADIENT_METHODS
"""The methods attributed to the source and the prefix: the gradient methods of the attribution
registry (:mod:`attnstudy.analysis.attribution_params`, their names and labels)."""

SPEC = AblationSpec(
    name="source_prefix",
    run="attnstudy.analysis.ablations.source_prefix:run",
    params=SourcePrefixParams,
    prefix="reference",
    requires=("gradients", "prefix_gradients"),
    stats={
        **{
            f"share_{m}": Stat(
                f"source_prefix_share_{m}",
                label=f"source share ({METHOD_LABELS[m]})",
                unit="share of the attribution mass (0–1)",
                question="source_prefix",
                direction="higher",
                optional=True,
            )
            for m in GRADIENT_METHODS
        },
        "ig_abs_delta": Stat(
            "source_prefix_ig_abs_delta",
            label="IG completeness gap (source + prefix)",
            unit="nats",
            question="source_prefix",
            direction="lower",
            optional=True,
        ),
    },
    questions={
        "source_prefix": Question(
            "How much of a prediction comes from the source? Gradient attribution",
            "Per reference target token (teacher forcing), the share of the attribution mass "
            "(absolute token scores) that saliency, input × gradient and integrated gradients "
            "give the source tokens rather than the target prefix (Voita et al. 2021's question, "
            "in inseq's gradient form); integrated gradients' completeness over both inputs "
            "(the gap: the absolute convergence delta, nats); 95 % intervals over examples.",
            order=43,
        ),
    },
    figure=Figure(
        "source_prefix",
        "Gradient attribution: how much of each prediction comes from the source, along the output",
        "Per reference target token (teacher forcing), the share of the attribution mass that "
        "each gradient method gives the source tokens rather than the target prefix "
        "(Σ_j |a_tj| over source and prefix tokens), averaged over the steps in each fifth of the "
        "output, a panel per method and a line per model with 95 % bootstrap intervals over "
        "examples. Near 1: the step reads the source; near 0: the prefix decides it.",
    ),
    definitions=(
        (
            "source share",
            "Σ_j |a_tj| over the source tokens divided by that sum over the source and the "
            "target-prefix tokens (BOS and y_<t), a_t a gradient method's token scores of log "
            "p_t(y_t) (Voita et al. 2021's source contribution, in gradient form as inseq's "
            "attribute_target); undefined where every score is 0.",
        ),
    ),
    default=False,
    order=75,
    description="source vs prefix: the share of saliency, input × gradient and integrated "
    "gradients attribution that goes to the source rather than the target prefix, per step",
    reference="Voita et al. 2021; inseq attribute_target",
)


def _logp_steps(trace, tgt_out: Tensor) -> list[Tensor]:
    """log p_t(y_t) of every step, each (B,) (a recurrent trace keeps each step's logits)."""
    steps = getattr(trace, "step_logits", None) or trace.logits.unbind(1)
    return [
        torch.log_softmax(logits, -1).gather(-1, tgt_out[:, t : t + 1])[:, 0]
        for t, logits in enumerate(steps)
    ]


def step_gradients(model, tr, e: Tensor, f: Tensor, *, detach_attention: bool):
    """(∂ log p_t(y_t)/∂e, ∂ log p_t(y_t)/∂f) for every step t, one backward per step.

    Args:
        model: a model with the ``prefix_gradients`` capability (call inside ``eval_mode`` and
            ``gradients_in_eval``). tr: the batch's trace (src, lengths, tgt_in, tgt_out).
        e: source embeddings (B, T_x, E); f: prefix embeddings (B, T_y, E) of ``tr.tgt_in``.

    Returns:
        (source gradients (T_y, B, T_x, E), prefix gradients (T_y, B, T_y, E)).
    """
    e = e.detach().requires_grad_(True)
    f = f.detach().requires_grad_(True)
    trace = model.trace(
        tr.src,
        tr.src_lengths,
        tr.tgt_in,
        tr.tgt_out,
        embedded=e,
        detach_attention=detach_attention,
        embedded_target=f,
    )
    steps = _logp_steps(trace, tr.tgt_out)
    ge, gf = [], []
    for t, logp in enumerate(steps):
        a, b = torch.autograd.grad(logp.sum(), (e, f), retain_graph=t < len(steps) - 1)
        ge.append(a)
        gf.append(b)
    return torch.stack(ge), torch.stack(gf)


def source_prefix_scores(
    model, tr, method: str, *, detach_attention: bool = False, n_steps: int = 20
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Token scores of one method on the source and on the target prefix, every step.

    Args:
        model: a model with the ``prefix_gradients`` capability (mode restored by the caller).
        tr: a trace of the batch. method: one of :data:`SOURCE_PREFIX_METHODS`.
        detach_attention: as :class:`SourcePrefixParams`. n_steps: integrated gradients' points.

    Returns:
        (source scores (B, T_y, T_x), prefix scores (B, T_y, T_y), integrated gradients' delta
        Σ scores − (f_t(e, f) − f_t(0, 0)) (B, T_y) in nats, or None). Signed (saliency ≥ 0);
        NaN at padding positions, padding steps and prefix positions k > t.

    Raises:
        ValueError: an unknown method.
    """
    found = all_scores(model, tr, [method], detach_attention=detach_attention, n_steps=n_steps)
    return found[method]


def all_scores(
    model, tr, methods, *, detach_attention: bool = False, n_steps: int = 20
) -> dict[str, tuple[Tensor, Tensor, Tensor | None]]:
    """:func:`source_prefix_scores` of each of ``methods``, by method; saliency and input ×
    gradient come from one gradient pass (one trace, one backward per step) when both are asked.

    Raises:
        ValueError: an unknown method.
    """
    from attnstudy.models import eval_mode, gradients_in_eval

    unknown = [m for m in methods if m not in SOURCE_PREFIX_METHODS]
    if unknown:
        raise ValueError(
            f"unknown method {unknown[0]!r}; valid: {', '.join(SOURCE_PREFIX_METHODS)}"
        )
    out = {}
    with eval_mode(model), gradients_in_eval():
        e = model.embed(tr.src).detach()
        f = model.embed_target(tr.tgt_in).detach()
        if {"saliency", "input_x_gradient"} & set(methods):
            ge, gf = step_gradients(model, tr, e, f, detach_attention=detach_attention)
            found = {
                "saliency": (ge.abs().sum(-1), gf.abs().sum(-1)),
                "input_x_gradient": ((ge * e).sum(-1), (gf * f).sum(-1)),
            }
            for m in set(found) & set(methods):
                src, pre = found[m]
                out[m] = _masked(tr, src.transpose(0, 1), pre.transpose(0, 1)) + (None,)
        if "integrated_gradients" in methods:
            out["integrated_gradients"] = _integrated(
                model, tr, e, f, detach_attention=detach_attention, n_steps=n_steps
            )
    return out


def _integrated(model, tr, e, f, *, detach_attention: bool, n_steps: int):
    """Integrated gradients along b + α (x − b) with b = 0 for source and prefix together
    (padding kept as it is), Captum's Gauss–Legendre α_k and w_k, summed in float64."""
    from captum.attr._utils.approximation_methods import approximation_parameters

    step_sizes, alphas_of = approximation_parameters("gausslegendre")
    base_e = _baseline(model, tr, "zero", e)  # padding stays as it is
    base_f = torch.where((tr.tgt_in == PAD_ID)[..., None], f, torch.zeros_like(f))
    src = torch.zeros(*tr.step_mask.shape, e.size(1), dtype=torch.float64, device=e.device)
    pre = torch.zeros(*tr.step_mask.shape, f.size(1), dtype=torch.float64, device=e.device)
    for w, a in zip(step_sizes(n_steps), alphas_of(n_steps)):
        ge, gf = step_gradients(
            model,
            tr,
            base_e + a * (e - base_e),
            base_f + a * (f - base_f),
            detach_attention=detach_attention,
        )
        src += w * (ge.double() * (e - base_e).double()).sum(-1).transpose(0, 1)
        pre += w * (gf.double() * (f - base_f).double()).sum(-1).transpose(0, 1)
    with torch.no_grad():
        at = _logp(model, tr, e, f)
        at_base = _logp(model, tr, base_e, base_f)
    src_m, pre_m = _masked(tr, src, pre)
    total = src_m.nan_to_num(0.0).sum(-1) + pre_m.nan_to_num(0.0).sum(-1)
    delta = (total - (at.double() - at_base.double())).masked_fill(~tr.step_mask, math.nan)
    return src_m.to(e.dtype), pre_m.to(e.dtype), delta


def _logp(model, tr, e: Tensor, f: Tensor) -> Tensor:
    """log p_t(y_t) (B, T_y) of the trace through given embeddings."""
    trace = model.trace(
        tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=e, embedded_target=f
    )
    return _target_logp(trace, tr)


def _masked(tr, src: Tensor, pre: Tensor) -> tuple[Tensor, Tensor]:
    """NaN at padding steps, padding source positions and prefix positions after the step."""
    t_y = tr.tgt_in.size(1)
    future = torch.ones(t_y, t_y, dtype=torch.bool, device=src.device).triu(1)
    bad_step = ~tr.step_mask[:, :, None]
    src = src.masked_fill(bad_step | tr.pad_mask[:, None, :], math.nan)
    pre = pre.masked_fill(bad_step | future[None], math.nan)
    return src, pre


def source_share(src: Tensor, pre: Tensor) -> Tensor:
    """S_t = Σ_j |a_tj| / (Σ_j |a_tj| + Σ_k |p_tk|), (B, T_y); NaN where both sums are 0 or at
    padding steps (scores as :func:`source_prefix_scores` returns them)."""
    s = src.abs().nan_to_num(0.0).sum(-1)
    total = s + pre.abs().nan_to_num(0.0).sum(-1)
    share = s / total
    return share.masked_fill((total == 0) | src.isnan().all(-1), math.nan)


def run(model, batch, params, ctx) -> pd.DataFrame:
    """The source share of each selected method per real step (teacher-forced on the reference).

    Returns:
        One row per real step: ``example_id``, ``step``, ``source_prefix_skipped`` (False),
        ``source_prefix_share_<method>`` per selected method (0–1, NaN where undefined),
        ``source_prefix_ig_delta`` and ``source_prefix_ig_abs_delta`` (nats) with integrated
        gradients.
    """
    tr = batch.trace
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    frame = pd.DataFrame(
        {
            "example_id": [batch.examples[b].id for b in b_idx.tolist()],
            "step": t_idx.cpu().numpy().astype(np.int64),
            "source_prefix_skipped": np.zeros(len(b_idx), dtype=bool),
        }
    )
    scores = all_scores(
        model, tr, params.methods, detach_attention=params.detach_attention, n_steps=params.n_steps
    )
    for method in params.methods:
        src, pre, delta = scores[method]
        share = source_share(src, pre)[b_idx, t_idx]
        frame[f"source_prefix_share_{method}"] = share.double().cpu().numpy()
        if delta is not None:
            d = delta[b_idx, t_idx].double().cpu().numpy()
            frame["source_prefix_ig_delta"] = d
            frame["source_prefix_ig_abs_delta"] = np.abs(d)
    return frame
