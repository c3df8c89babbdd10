"""Value zeroing per decoder step (Mohebbi, Zuidema, Chrupała & Alishahi 2023, "Quantifying
Context Mixing in Transformers", EACL, §2): what source position j's *value* contributes to step t,
with the attention weights left as they are.

The analysed cross-attention's output at step t is Σ_h Σ_j α_thj f_h(x_j) (+ a bias), f_h the value
vector after the score's value and output projections (Kobayashi et al. 2020, eq. 4). Value
zeroing sets the value vector of source position j to 0 in every analysed head, so its term
α_thj f_h(x_j) leaves the output and nothing else changes: the other weights are **not**
renormalised (the rows keep their traced α). Mohebbi et al. score the change of the mixed
representation (cosine distance); for a decoder step the output is what matters, so here the
step's output distribution is scored against the unmodified step's:

    VZ_tj = TVD(p_t, p_t^{v_j = 0})   (and any registered step score, ``scores``).

Per family: the recurrent models drop h_j's term from the context c_t = Σ_j α_tj h_j (multihead:
each head's block, through W^O); attnstudy's Transformer and a Hugging Face model zero row j of the
analysed layer's cross-attention values in every head (transformers 5.x: the value tensor the
``"attnstudy"`` function of ``transformers.AttentionInterface`` receives, which is the layer's
``EncoderDecoderCache.cross_attention_cache.layers[m].values[:, :, j]``). Because the output is
Σ_j α_thj v_hj, zeroing value row j is the same as giving it weight 0 in every head without
renormalising: the entry computes it through the contract's local intervention
(``logits_given_attention`` with column j of the analysed rows set to 0; every j of a step is one
replacement, P = T_x), and ``tests/analysis/test_value_zeroing.py`` holds it equal, on every family,
to zeroing the value tensors themselves. Each step is recomputed from its own traced prefix state
(a local intervention, like ``uniform`` and ``erase_max``): later steps keep the traced prefix.

Statistics per step: Kendall τ-b of VZ against the head-mean attention row α_t (an importance
measure's τ: value zeroing does not read α's ranking, though a position with α_tj = 0 has
VZ_tj = 0), against leave-one-out deletion and against |input × gradient| (Shrikumar et al. 2016,
attention detached); whether the position of the largest VZ is attention's argmax; and the TVD of
zeroing the value of the most-attended position.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import (
    AblationSpec,
    Capture,
    ExampleColumn,
    Figure,
    MapView,
    OutputChangeParams,
    Stat,
    VerdictRole,
)
from torch import Tensor

from attnstudy.models import eval_mode

from .._chunks import n_valid, require_attention, sub_trace, trace_chunks
from ..batch import AblationContext, PreparedBatch
from ..contract import capabilities
from ..step_scores import get_step_score, list_step_scores

NAME = "value_zeroing"

SPEC = AblationSpec(
    name="value_zeroing",
    run="attnstudy.analysis.ablations.value_zeroing:run",
    params=OutputChangeParams,
    more_stats="attnstudy.analysis.ablations.value_zeroing:more_stats",
    requires=("attention", "local"),
    stats={
        "tau_attn": Stat(
            "value_zeroing_tau_attn",
            label="τ attention–value zeroing",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            # an importance measure of its own: the output change when a value is zeroed, with
            # the weights kept (not a transform of attention's ranking)
            verdict=VerdictRole("agrees", measure="value zeroing"),
        ),
        "tau_vz_loo": Stat(
            "value_zeroing_tau_vz_loo",
            label="τ value zeroing–LOO",
            unit="Kendall τ-b",
            question="agrees",
        ),
        "tau_vz_ixg": Stat(
            "value_zeroing_tau_vz_ixg",
            label="τ value zeroing–input × gradient",
            unit="Kendall τ-b",
            question="agrees",
        ),
        "argmax_agrees": Stat(
            "value_zeroing_argmax_agrees",
            label="argmax of value zeroing = argmax of attention",
            question="agrees",
            direction="higher",
        ),
        "tvd_top": Stat(
            "value_zeroing_tvd_top",
            label="value-zeroing TVD, most-attended token",
            unit="TVD (0–1)",
            question="used",
            direction="higher",
        ),
    },
    figure=Figure(
        "stat_distributions",
        "Value zeroing against attention, leave-one-out and input × gradient",
        "Mohebbi et al. (2023): per decoder step, the value vector of each source position is "
        "zeroed in the analysed cross-attention (weights kept, not renormalised) and the output "
        "change is the TVD against the unmodified step. Boxes: Kendall τ-b of those TVDs against "
        "attention, leave-one-out and |input × gradient|, and the TVD when the most-attended "
        "position's value is zeroed; right: the share of steps whose largest value-zeroing "
        "effect is at attention's argmax. A box per model.",
    ),
    definitions=(
        (
            "value zeroing",
            "the output change at step t when source position j's value vector is set to 0 in "
            "every head of the analysed cross-attention, the attention weights left as they are "
            "(not renormalised): TVD(p_t, p_t with v_j = 0) (Mohebbi et al. 2023); ranked against "
            "attention, leave-one-out and input × gradient.",
        ),
    ),
    terms=("Kendall τ-b", "TVD"),
    # two columns (the browser page's size: its list carries every column for every example)
    examples=(
        ExampleColumn(
            "value_zeroing_tau_attn",
            "τ attn–value zeroing",
            "value_zeroing_tau_attn",
            unit="Kendall τ-b, mean over steps",
            undefined="τ undefined at every step: fewer than 2 source positions or a constant vector",
        ),
        ExampleColumn(
            "value_zeroing_tvd_top",
            "value zeroing TVD at attention's argmax",
            "value_zeroing_tvd_top",
            unit="TVD (0–1), mean over steps",
            undefined="fewer than 2 source positions at every step",
        ),
    ),
    captures=Capture(
        "attnstudy.analysis.ablations.value_zeroing:capture",
        "attnstudy.analysis.ablations.value_zeroing:maps",
        (
            MapView(
                "value_zeroing",
                "value zeroing",
                "output TVD when the source token's value vector is zeroed (its attention weight "
                "kept), each row scaled so its largest is 1; hover a cell for the unscaled TVD",
                scale="row",
            ),
        ),
    ),
    default=False,
    order=86,
    description="value zeroing: each source position's value vector zeroed in the analysed "
    "cross-attention (weights kept, not renormalised), the output change (TVD, any step score); "
    "Kendall τ against attention, leave-one-out and input × gradient; cost per decoder step: n "
    "local recomputations of the step (n source tokens), plus leave-one-out's n traces per "
    "example and one backward",
    reference="Mohebbi et al. 2023 (EACL), §2",
)

REASON_NO_GRADIENTS = "no input gradients"


def zeroed_rows(att: Tensor, p: int) -> Tensor:
    """Replacement rows with one source position's weight set to 0 in every head, not
    renormalised: ``out[:, j]`` is ``att`` with column j zeroed (j < p).

    Args:
        att: (B, H', T_y, T_x) analysed rows. p: positions replaced (≤ T_x).

    Returns:
        (B, p, H', T_y, T_x).
    """
    t_x = att.size(-1)
    one = torch.eye(p, t_x, dtype=torch.bool, device=att.device)  # (p, T_x)
    return att.unsqueeze(1).masked_fill(one[None, :, None, None, :], 0.0)


def value_zeroing_scores(
    model, batch: PreparedBatch, chunk_rows: int = 4096, scores=("tvd",)
) -> dict[str, Tensor]:
    """VZ_tj for every step and source position, per step score (Mohebbi et al. 2023).

    Args:
        model: a model with the ``local`` capability (eval mode during the call, mode restored).
        batch: prepared batch; its trace's analysed rows (B, H', T_y, T_x) are kept but for
            column j.
        chunk_rows: rows per output-layer call of ``logits_given_attention``.
        scores: registered step scores (``tvd`` first by convention), each
            ``score(p_t^{v_j = 0}, p_t, ŷ_t)``.

    Returns:
        score → float64 (B, T_y, T_x); NaN at padding positions and padding steps. TVD in [0, 1].

    Raises:
        NoAttentionError: for the ``none`` model.
        UnknownStepScoreError: a score is not registered.
    """
    require_attention(model, batch, NAME)
    fns = {s: get_step_score(s).fn for s in scores}
    tr = batch.trace
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    out = {
        s: torch.full((b, t_y, t_x), math.nan, dtype=torch.float64, device=tr.src.device)
        for s in scores
    }
    with eval_mode(model), torch.no_grad():
        for chunk in trace_chunks(tr, t_x):
            sub = sub_trace(tr, chunk.rows, chunk.start, chunk.stop)
            a = sub.attention  # (B', H', T', T_x)
            p = int(n_valid(sub).max())  # positions past every row's length are padding
            base = torch.softmax(model.logits_given_attention(sub, a, chunk_rows), -1)
            logits = model.logits_given_attention(sub, zeroed_rows(a, p), chunk_rows)
            probs = torch.softmax(logits, -1)  # (B', p, T', V)
            target = sub.tgt_out.unsqueeze(1)
            for s, fn in fns.items():
                v = fn(probs, base.unsqueeze(1), target).double()  # (B', p, T')
                out[s][chunk.rows, chunk.start : chunk.stop, :p] = v.transpose(1, 2)
    keep = tr.step_mask[:, :, None] & ~tr.pad_mask[:, None, :]
    return {s: v.masked_fill(~keep, math.nan) for s, v in out.items()}


def reference_scores(model, batch: PreparedBatch, score: str = "tvd") -> Tensor:
    """Plain-loop reference of :func:`value_zeroing_scores`: one (example, step, position) at a
    time, each a single-row ``logits_given_attention`` call.

    Returns:
        float64 (B, T_y, T_x), NaN where :func:`value_zeroing_scores` is.
    """
    tr = batch.trace
    fn = get_step_score(score).fn
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    out = torch.full((b, t_y, t_x), math.nan, dtype=torch.float64, device=tr.src.device)
    with eval_mode(model), torch.no_grad():
        for i in range(b):
            one = sub_trace(tr, torch.tensor([i], device=tr.src.device))
            n = int(tr.src_lengths[i])
            for t in tr.step_mask[i].nonzero()[:, 0].tolist():
                steps = torch.zeros_like(one.step_mask)
                steps[0, t] = True
                base = torch.softmax(
                    model.logits_given_attention(one, one.attention, steps=steps)[0, t], -1
                )
                for j in range(n):
                    w = one.attention.clone()
                    w[:, :, t, j] = 0.0
                    p = torch.softmax(model.logits_given_attention(one, w, steps=steps)[0, t], -1)
                    out[i, t, j] = float(fn(p, base, one.tgt_out[0, t]))
    return out


def _vectors(model, batch: PreparedBatch, params, ctx: AblationContext) -> dict[str, Tensor]:
    """Value zeroing (every score asked for) and the vectors it is ranked against."""
    from ..attribution import cached_attribution
    from .importance import loo_importance

    scores = ("tvd", *params.scores)
    vz = value_zeroing_scores(model, batch, ctx.chunk_rows, scores)
    with torch.no_grad():
        loo = loo_importance(model, batch, ctx.chunk_rows)
    ixg = None
    if "gradients" in capabilities(model):
        ixg = cached_attribution(
            model, batch, "input_x_gradient", ctx, {"detach_attention": True}
        ).scores
    return {
        **{f"vz_{s}": v for s, v in vz.items()},
        "attn": batch.trace.attention.mean(1),
        "loo": loo,
        "ixg": ixg,
    }


def table(batch: PreparedBatch, vectors: dict[str, Tensor | None], scores=()) -> pd.DataFrame:
    """The per-step table of :func:`run` from the vectors of :func:`_vectors`."""
    from ..attribution import tau_table

    ixg = vectors["ixg"]
    pairs = {"attn": ("attn", "vz_tvd"), "vz_loo": ("vz_tvd", "loo")}
    if ixg is not None:
        pairs["vz_ixg"] = ("vz_tvd", "ixg")
    pairs.update({f"attn_{s}": ("attn", f"vz_{s}") for s in scores})
    frame = tau_table(batch, NAME, vectors, pairs)
    if ixg is None:  # a model without input gradients: undefined, with the reason
        frame[f"{NAME}_tau_vz_ixg"] = math.nan
        frame[f"{NAME}_p_vz_ixg"] = math.nan
        frame[f"{NAME}_ixg_reason"] = REASON_NO_GRADIENTS
    tr = batch.trace
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    att = vectors["attn"][b_idx, t_idx].double().cpu().numpy()  # (N, T_x)
    vz = vectors["vz_tvd"][b_idx, t_idx].cpu().numpy()
    n = tr.src_lengths[b_idx].cpu().numpy()
    top_attn, top_vz, at_top = [], [], []
    for a, v, k in zip(att, vz, n):
        i = int(np.argmax(a[:k]))
        at_top.append(float(v[i]) if k >= 2 else math.nan)
        top_attn.append(i)
        top_vz.append(int(np.argmax(v[:k])))
    ok = n >= 2
    frame[f"{NAME}_argmax_agrees"] = np.where(
        ok, (np.asarray(top_attn) == np.asarray(top_vz)).astype(float), math.nan
    )
    frame[f"{NAME}_tvd_top"] = np.asarray(at_top, dtype=float)
    return frame


def run(model, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Value zeroing against attention, leave-one-out and input × gradient, per decoder step.

    Returns:
        One row per real step: ``example_id``, ``step``, ``value_zeroing_skipped`` (fewer than 2
        source positions: nothing to rank; values NaN), ``value_zeroing_tau_attn``,
        ``value_zeroing_tau_vz_loo``, ``value_zeroing_tau_vz_ixg`` (Kendall τ-b, with their
        ``_p_`` p-values; NaN when undefined, ``value_zeroing_reason`` says why, and
        ``value_zeroing_ixg_reason`` for a model without input gradients),
        ``value_zeroing_argmax_agrees`` (1.0 where the largest VZ is at attention's argmax),
        ``value_zeroing_tvd_top`` (VZ of attention's argmax) and, per extra step score s,
        ``value_zeroing_tau_attn_<s>``.

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    return capture(model, batch, params, ctx)[0]


def capture(model, batch: PreparedBatch, params, ctx: AblationContext):
    """:func:`run` keeping its vectors, for the example browser's maps: ``(table, vectors)``."""
    require_attention(model, batch, NAME)
    vectors = _vectors(model, batch, params, ctx)
    return table(batch, vectors, params.scores), vectors


def maps(batch: PreparedBatch, i: int, steps: Tensor, n: int, vectors) -> dict:
    """Example ``i``'s value-zeroing map (TVD), T × n, rounded as the browser's other maps."""
    from ..heatmaps import DIGITS

    m = vectors["vz_tvd"][i, steps.to(vectors["vz_tvd"].device), :n].cpu().numpy()
    return {
        "value_zeroing": [
            [round(float(v), DIGITS) if np.isfinite(v) else None for v in row] for row in m
        ]
    }


def more_stats(columns) -> dict:
    """The statistics of the step scores named in ``[ablation.value_zeroing] scores``: the mean
    τ-b of attention against each score's value-zeroing vector, ``tau_attn_<score>`` (logged,
    not a report column)."""
    names = set(columns)
    return {
        f"tau_attn_{name}": Stat(f"{NAME}_tau_attn_{name}", unit="Kendall τ-b")
        for name in list_step_scores()
        if name not in ("tvd", "flip") and f"{NAME}_tau_attn_{name}" in names
    }


__all__ = [
    "capture",
    "maps",
    "reference_scores",
    "run",
    "value_zeroing_scores",
    "zeroed_rows",
]
