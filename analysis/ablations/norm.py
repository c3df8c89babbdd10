"""Norm-based analysis (Kobayashi et al. 2020, "Attention is Not Only a Weight: Analyzing
Transformers with Vector Norms", EMNLP, §3, eq. 4): the context vector is Σ_j α_tj f(x_j), so
what source position j contributes at step t is the vector α_tj f(x_j), whose norm can be large
where the weight is small and the other way round. Per step, the norm of each position's
contribution (summed over heads), ‖Σ_h α_thj f_h(x_j)‖, beside the head-mean weight α_tj.

f(x_j) is the value vector after the score's value and output projections, as the model computes
the context (:meth:`attnstudy.models.Seq2Seq.value_vectors`): for ``additive``, ``dot``, ``general``,
``concat`` and ``uniform`` the values are the encoder states themselves (no projection); for
``scaled_dot`` the value projection W^V h_j; for ``multihead`` each head's W^O_h W^V_h h_j (the
output projection's block for that head), so the sum over heads and positions is the context.

Per step: Kendall τ-b of the norm-based weights against α (how much the norms reorder the weights)
and against leave-one-out importance (do the norms track what matters more than α does?).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import AblationSpec, Figure, Stat, VerdictRole

from .._chunks import require_attention, step_frame
from ..batch import AblationContext, PreparedBatch
from ..divergences import kendall_tau
from .importance import loo_importance

SPEC = AblationSpec(
    name="norm",
    run="attnstudy.analysis.ablations.norm:run",
    requires=("attention", "values"),
    stats={
        "tau_attn_norm": Stat(
            "norm_tau_attn_norm",
            label="τ attention–norm",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            # built from attention itself: named beside the importance measures, not read
            verdict=VerdictRole("agrees", "beside", measure="norm"),
        ),
        "tau_norm_loo": Stat(
            "norm_tau_norm_loo",
            label="τ norm–LOO",
            unit="Kendall τ-b",
            question="agrees",
        ),
        "tau_attn_loo": Stat(
            "norm_tau_attn_loo", verdict=VerdictRole("agrees", measure="leave-one-out")
        ),
        "argmax_agrees": Stat(
            "norm_argmax_agrees",
            label="argmax of norm = argmax of attention",
            question="agrees",
            direction="higher",
        ),
    },
    figure=Figure(
        "stat_distributions",
        "Norm of the weighted value vectors against attention and leave-one-out",
        "Kobayashi et al. (2020): per decoder step, Kendall τ-b between the attention weights α_j "
        "and the norms ‖α_j f(x_j)‖ of what each source position adds to the context, and between "
        "those norms and leave-one-out importance; a box per model, numbers of steps in the "
        "legend. τ near 1 against attention: the value vectors' norms change little of "
        "attention's ranking.",
    ),
    definitions=(
        (
            "norm (‖α f(x)‖)",
            "the norm of source position j's contribution α_j f(x_j) to the context vector, f the "
            "value transform (Kobayashi et al. 2020, eq. 4); compared with leave-one-out "
            "importance (TVD between p_t and the output with source token j deleted).",
        ),
    ),
    terms=("Kendall τ-b",),
    default=False,
    order=85,
    description="‖α_j f(x_j)‖, the norm of each source position's contribution to the context, beside α_j; "
    "Kendall τ against α and against leave-one-out importance",
    reference="Kobayashi et al. 2020, §3 (eq. 4)",
)


def norm_weights(model, batch: PreparedBatch) -> torch.Tensor:
    """‖Σ_h α_thj f_h(x_j)‖ for every step and source position, shape (B, T_y, T_x); 0 at padding.

    Args:
        model: a model with :meth:`value_vectors` ((B, H, T_x, d) transformed values of a trace).
        batch: prepared batch; its trace's attention (B, H, T_y, T_x) is the α.
    """
    tr = batch.trace
    att = tr.attention  # (B, H, T_y, T_x)
    values = model.value_vectors(tr)  # (B, H, T_x, d)
    contrib = att.unsqueeze(-1) * values.unsqueeze(2)  # (B, H, T_y, T_x, d)
    return contrib.sum(1).norm(dim=-1).masked_fill(tr.pad_mask[:, None, :], 0.0)


def run(model, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Norm-based weights against attention and leave-one-out importance, per decoder step.

    Returns:
        One row per real step: ``example_id``, ``step``, ``norm_skipped`` (one valid source
        position: nothing to rank), ``norm_tau_attn_norm``, ``norm_tau_norm_loo``,
        ``norm_tau_attn_loo`` (Kendall τ-b, NaN when undefined) and ``norm_argmax_agrees`` (1.0 if
        the largest norm and the largest weight are at the same position).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    require_attention(model, batch, "norm")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    with torch.no_grad():
        norms = norm_weights(model, batch).double().cpu().numpy()
        loo = loo_importance(model, batch, ctx.chunk_rows).double().cpu().numpy()
    att = tr.attention.mean(1).double().cpu().numpy()
    lengths = tr.src_lengths.tolist()
    cols: dict[str, list[float]] = {
        k: [] for k in ("tau_attn_norm", "tau_norm_loo", "tau_attn_loo", "argmax_agrees")
    }
    skipped = []
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        n = int(lengths[b])
        skipped.append(n < 2)
        if n < 2:
            for v in cols.values():
                v.append(math.nan)
            continue
        a, m, lo = att[b, t, :n], norms[b, t, :n], loo[b, t, :n]
        cols["tau_attn_norm"].append(kendall_tau(a, m)[0])
        cols["tau_norm_loo"].append(kendall_tau(m, lo)[0])
        cols["tau_attn_loo"].append(kendall_tau(a, lo)[0])
        cols["argmax_agrees"].append(float(int(np.argmax(a)) == int(np.argmax(m))))
    for k, v in cols.items():
        frame[f"norm_{k}"] = np.asarray(v, dtype=float)
    frame["norm_skipped"] = np.asarray(skipped, dtype=bool)
    return frame
