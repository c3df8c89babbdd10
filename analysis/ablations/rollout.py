"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", ACL,
§3): a Transformer's encoder mixes the source tokens before the decoder attends to them, so the
cross-attention α_t weighs *encoder outputs*, not input tokens. Rollout traces the mixing back
through the encoder: with each layer's head-mean self-attention A_l and the residual connection
as an identity share, Ã_l = ½ A_l + ½ I (rows renormalised), the encoder's token-to-token rollout
is R = Ã_L ⋯ Ã_1, and step t's rolled-out attention over the input tokens is r_t = α_t R
(α_t the head-mean cross-attention of the analysed unit).

Per step: Kendall τ-b of r_t against α_t (how much the encoder's mixing reorders the weights) and
against leave-one-out importance (does the rolled-out attention track what matters better than
the raw weights do?), and whether the two argmaxes agree. A recurrent encoder has no
self-attention: the ablation is skipped for it, with the reason.
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
    name="rollout",
    run="attnstudy.analysis.ablations.rollout:run",
    requires=("attention", "self_attention"),
    stats={
        "tau_attn_rollout": Stat(
            "rollout_tau_attn_rollout",
            label="τ attention–rollout",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            # built from attention itself: named beside the importance measures, not read
            verdict=VerdictRole("agrees", "beside", measure="rollout"),
        ),
        "tau_rollout_loo": Stat(
            "rollout_tau_rollout_loo",
            label="τ rollout–LOO",
            unit="Kendall τ-b",
            question="agrees",
        ),
        "tau_attn_loo": Stat(
            "rollout_tau_attn_loo", verdict=VerdictRole("agrees", measure="leave-one-out")
        ),
        "argmax_agrees": Stat(
            "rollout_argmax_agrees",
            label="argmax of rollout = argmax of attention",
            question="agrees",
            direction="higher",
        ),
    },
    figure=Figure(
        "stat_distributions",
        "Attention rollout against attention and leave-one-out",
        "Abnar & Zuidema (2020): per decoder step, Kendall τ-b between the cross-attention and "
        "its rollout through the encoder's self-attention onto the input tokens, and between "
        "the rollout and leave-one-out importance; a box per model, numbers of steps in the "
        "legend. τ near 1 against attention: the encoder mixes little across positions.",
    ),
    definitions=(
        (
            "attention rollout",
            "the cross-attention row carried through every encoder layer's self-attention, each "
            "taken as ½A + ½I for the residual connection, onto the input tokens (Abnar & "
            "Zuidema 2020, §3).",
        ),
    ),
    terms=("Kendall τ-b",),
    default=False,
    order=86,
    description="the cross-attention rolled out through the encoder's self-attention (½A + ½I per "
    "layer) onto the input tokens; Kendall τ against α and against leave-one-out importance",
    reference="Abnar & Zuidema 2020, §3 (attention rollout)",
)


def encoder_rollout(encoder_attention: torch.Tensor) -> torch.Tensor:
    """R = Ã_L ⋯ Ã_1 with Ã_l = ½ A_l + ½ I, rows renormalised (Abnar & Zuidema 2020, §3).

    Args:
        encoder_attention: (B, L, H, T_x, T_x) self-attention of every encoder layer.

    Returns:
        (B, T_x, T_x): row i is encoder output i's share of every input token (rows of valid
        positions sum to 1).
    """
    a = encoder_attention.mean(2)  # (B, L, T_x, T_x) head mean
    eye = torch.eye(a.size(-1), dtype=a.dtype, device=a.device)
    rolled = eye.expand(a.size(0), -1, -1)
    for layer in range(a.size(1)):
        step = 0.5 * a[:, layer] + 0.5 * eye
        step = step / step.sum(-1, keepdim=True)
        rolled = step @ rolled
    return rolled


def rollout_weights(model, batch: PreparedBatch) -> torch.Tensor:
    """r_t = α_t R for every step: (B, T_y, T_x), 0 at padding (α is 0 there and R keeps it)."""
    tr = batch.trace
    alpha = tr.attention.mean(1)  # (B, T_y, T_x)
    return alpha @ encoder_rollout(model.encoder_attention(tr))


def run(model, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Rolled-out attention against attention and leave-one-out importance, per decoder step.

    Returns:
        One row per real step: ``example_id``, ``step``, ``rollout_skipped`` (one valid source
        position), ``rollout_tau_attn_rollout``, ``rollout_tau_rollout_loo``,
        ``rollout_tau_attn_loo`` (Kendall τ-b, NaN when undefined) and ``rollout_argmax_agrees``.

    Raises:
        NoAttentionError: for a model without cross-attention.
    """
    require_attention(model, batch, "rollout")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    with torch.no_grad():
        rolled = rollout_weights(model, batch).double().numpy()
        loo = loo_importance(model, batch, ctx.chunk_rows).double().numpy()
    att = tr.attention.mean(1).double().numpy()
    cols: dict[str, list[float]] = {
        k: [] for k in ("tau_attn_rollout", "tau_rollout_loo", "tau_attn_loo", "argmax_agrees")
    }
    skipped = []
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        n = int(tr.src_lengths[b])
        skipped.append(n < 2)
        if n < 2:
            for v in cols.values():
                v.append(math.nan)
            continue
        a, r, lo = att[b, t, :n], rolled[b, t, :n], loo[b, t, :n]
        cols["tau_attn_rollout"].append(kendall_tau(a, r)[0])
        cols["tau_rollout_loo"].append(kendall_tau(r, lo)[0])
        cols["tau_attn_loo"].append(kendall_tau(a, lo)[0])
        cols["argmax_agrees"].append(float(int(np.argmax(a)) == int(np.argmax(r))))
    for k, v in cols.items():
        frame[f"rollout_{k}"] = np.asarray(v, dtype=float)
    frame["rollout_skipped"] = np.asarray(skipped, dtype=bool)
    return frame
