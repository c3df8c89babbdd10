"""Permutation (Jain & Wallace 2019, §4.1): P random permutations of α_t over the valid positions,
every step recomputed from its traced prefix state (one batched ``logits_given_attention`` call per
chunk); per step the median over permutations of TVD(p_t, p̃_t) and the fraction of permutations
whose argmax differs. Identity permutations are excluded and counted.
:func:`permutation_loop_reference` gives the same numbers from a plain loop (one forward per
permutation per step, same generators): the test oracle and the benchmark baseline.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import (
    AblationSpec,
    ExampleColumn,
    Figure,
    OutputChangeParams,
    Stat,
    Thresholds,
    VerdictRole,
)
from pydantic import Field
from torch import Tensor

from attnstudy.models import Seq2Seq, eval_mode

from .._chunks import (
    n_valid,
    require_attention,
    rows_given_attention,
    step_frame,
    step_table,
    sub_trace,
    trace_chunks,
)
from ..batch import AblationContext, PreparedBatch, step_permutations, step_streams
from ..divergences import tvd
from ..interventions import permutation_index
from ..step_scores import score_columns, score_stats, step_score


class PermutationParams(OutputChangeParams):
    """``[ablation.permutation]``."""

    n: int = Field(100, ge=1, le=100_000, description="permutations per step (P; J&W use 100)")


SPEC = AblationSpec(
    name="permutation",
    run="attnstudy.analysis.ablations.permutation:run",
    params=PermutationParams,
    more_stats="attnstudy.analysis.ablations.permutation:more_stats",
    stats={
        "flip_rate": Stat(
            "permutation_flip_rate",
            label="permutation flip rate",
            question="used",
            direction="higher",
            verdict=VerdictRole(
                "used",
                rule=Thresholds("used_flip", "unused_flip"),
                phrase="of {P}random permutations of the attention row, {pct} change the "
                "predicted token (mean over decoder steps)",
                summary="random permutations change the predicted token at{span} of their "
                "decoder steps (mean share of permutations)",
            ),
        ),
        "median_tvd": Stat(
            "permutation_median_tvd",
            label="permutation median TVD",
            unit="TVD (0–1)",
            question="used",
            direction="higher",
        ),
    },
    counts=("permutation_n_identity",),
    figure=Figure(
        "permutation",
        "Permutation: does the output depend on which source token gets which weight?",
        "Jain & Wallace (2019) fig. 3 design: per decoder step, the median output TVD over P "
        "random permutations of the attention row, grouped by the step's largest attention "
        "weight; one panel per task. Mass near 0: permuting changes little (attention not used, "
        "as J&W found for text classifiers); mass near 1: the output depends on the weights. "
        "Numbers under the axis: steps per group; groups of fewer than 20 steps are drawn as "
        "points.",
    ),
    definitions=(
        (
            "permutation",
            "the attention row's weights randomly reassigned among the valid source positions, P "
            "times per step (Jain & Wallace 2019, §4.1).",
        ),
    ),
    examples=(
        ExampleColumn(
            "perm_flip",
            "permutation flip rate",
            "permutation_flip_rate",
            unit="share of permutations (0–1), mean over steps",
            undefined="no step to permute: a source of one position, or only identity permutations",
            step_label="perm. flip",
        ),
        ExampleColumn(
            "perm_tvd",
            "permutation median TVD",
            "permutation_median_tvd",
            unit="TVD (0–1), mean over steps",
            undefined="no step to permute: a source of one position, or only identity permutations",
            step_label="perm. TVD",
        ),
    ),
    order=10,
    description="P random permutations of the attention row (local); median output TVD, flip rate",
    reference="Jain & Wallace 2019, §4.1 (permute_attn, median over 100)",
)


def run(model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Local permutation test at every real decoder step (Jain & Wallace 2019, §4.1, Fig. 5).

    For step t with attention α_t (every head permuted independently over the valid source
    positions, stream (ctx.seed, example_id, t, "permutation") of ``ctx.rng``'s scheme,
    :func:`attnstudy.analysis.batch.step_streams`):
    ``median_π TVD(p_t, p_t(α_t[π]))`` with TVD = ½ Σ_v |p − p̃| over the full output vocabulary,
    and the fraction of permutations whose argmax differs from argmax p_t. The permuted steps'
    rows go through the model's row form of the local intervention
    (:func:`attnstudy.analysis._chunks.rows_given_attention`: each step from its traced prefix
    state, no (B, P, H, T_y, T_x) scatter), and p_t is recomputed through the same call from the
    unchanged α_t, as its replacement P + 1.

    Args:
        model: the model (run in eval mode, previous mode restored).
        batch: prepared batch (prefix per ``cfg.prefix``).
        params: ``n`` (P).
        ctx: ``seed``, ``chunk_rows``.

    Returns:
        One row per real step: ``example_id``, ``step``, ``permutation_median_tvd`` (in [0, 1]),
        ``permutation_flip_rate`` (in [0, 1]), ``permutation_n_identity`` (identity permutations
        excluded), ``permutation_skipped`` (True when the source has < 2 valid positions; the
        values are then NaN). Both values are NaN if every permutation was the identity.

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    require_attention(model, batch, "permutation")
    tr = batch.trace
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    p_count = params.n
    nv = n_valid(tr)
    ids = batch.example_ids
    dev = tr.src.device
    med = torch.full(tr.step_mask.shape, float("nan"), dtype=torch.float64, device=dev)
    flip = med.clone()
    n_id = torch.zeros(tr.step_mask.shape, dtype=torch.long, device=dev)
    extra = {f"permutation_median_{s}": med.clone() for s in params.scores}
    cpu = torch.device("cpu")
    with eval_mode(model), torch.no_grad():
        for chunk in trace_chunks(tr, p_count + 1):
            rows = chunk.rows
            sub = sub_trace(tr, rows, chunk.start, chunk.stop)
            steps = sub.step_mask & (nv[rows] >= 2)[:, None]
            if not bool(steps.any()):
                continue
            streams = step_streams(ctx, [ids[i] for i in rows.tolist()], SPEC.name, chunk.start)
            # the permuted steps, (b, t) order: the S rows of everything below
            sb, st, index, identity = permutation_index(
                (~sub.pad_mask).to(cpu), steps.to(cpu), p_count, sub.attention.size(1), streams
            )
            sb, st = sb.to(dev), st.to(dev)
            weights = with_reference(sub.attention[sb, :, st], index.to(dev))
            logits = rows_given_attention(model, sub, sb, st, ctx.chunk_rows)(weights)
            keep = ~identity.to(dev)  # (S, P)
            d, flips = tvd_and_flips(logits)
            n_keep = keep.sum(1)
            m = nan_median(d.double().masked_fill_(~keep, float("nan")))
            f = (flips & keep).sum(1).double() / n_keep.clamp(min=1)
            f = f.masked_fill(n_keep == 0, float("nan"))
            at = (rows[sb], st + chunk.start)
            med[at], flip[at], n_id[at] = m, f, (~keep).sum(1)
            if params.scores:
                probs = torch.softmax(logits, -1)  # (S, P + 1, V)
                for col, v in score_columns(  # a T_y axis of 1 for its (B, P, T_y, V) form
                    "permutation_median",
                    params.scores,
                    probs[:, :p_count].unsqueeze(2),
                    probs[:, p_count].unsqueeze(1),
                    sub.tgt_out[sb, st].unsqueeze(1),
                    keep=keep.unsqueeze(2),
                ).items():
                    extra[col][at] = v[:, 0]
    columns = {
        "permutation_median_tvd": med[b_idx, t_idx].cpu().numpy(),
        "permutation_flip_rate": flip[b_idx, t_idx].cpu().numpy(),
        "permutation_n_identity": n_id[b_idx, t_idx].cpu().numpy(),
        **{col: v[b_idx, t_idx].cpu().numpy() for col, v in extra.items()},
        "permutation_skipped": (nv[b_idx] < 2).cpu().numpy(),
    }
    return step_table(batch, b_idx, t_idx, columns)


def with_reference(rows: Tensor, index: Tensor) -> Tensor:
    """The permuted rows and, as replacement P + 1, the row itself.

    Args:
        rows: (S, H, T_x) attention rows. index: long (S, P, H, T_x), a gather index of each
            replacement (:attr:`attnstudy.analysis.interventions.PermutationIndex.index`).

    Returns:
        (S, P + 1, H, T_x): ``rows`` gathered by ``index``, then ``rows``.
    """
    s, p = index.shape[:2]
    out = rows.new_empty(s, p + 1, *rows.shape[1:])
    torch.gather(rows.unsqueeze(1).expand(index.shape), -1, index, out=out[:, :p])
    out[:, p] = rows
    return out


SCORE_BLOCK = 1 << 20
"""Logits per block of :func:`tvd_and_flips` (4 MiB in float32): the softmax and difference
temporaries are a block's, not the whole (S, P + 1, V) output's (smaller blocks measured no
faster)."""


def tvd_and_flips(logits: Tensor) -> tuple[Tensor, Tensor]:
    """TVD and argmax flip of every replacement against the last one.

    With p the softmax of replacement P (the unchanged row) and p̃ that of replacement i < P:
    TVD = ½ Σ_v |p̃(v) − p(v)| (:func:`attnstudy.analysis.divergences.tvd`) and the flip
    argmax p̃ ≠ argmax p (first maximal position, as ``step_score("flip")``), computed a block of
    steps at a time (:data:`SCORE_BLOCK`) with the step scores' operations, so the same numbers
    as ``step_score("tvd"/"flip", softmax(logits[:, :P]), softmax(logits[:, P:]))``.

    Args:
        logits: (S, P + 1, V), replacement P the reference.

    Returns:
        ``(tvd, flips)``: float (S, P) in ``logits``' dtype, bool (S, P).
    """
    s, p1, v = logits.shape
    p = p1 - 1
    d = logits.new_empty(s, p)
    flips = torch.empty(s, p, dtype=torch.bool, device=logits.device)
    block = max(1, SCORE_BLOCK // (p1 * v))
    for lo in range(0, s, block):
        hi = min(s, lo + block)
        probs = torch.softmax(logits[lo:hi], -1)  # (s', P + 1, V)
        ref, out = probs[:, p:], probs[:, :p]
        d[lo:hi] = tvd(out, ref)
        torch.ne(out.max(-1).indices, ref.max(-1).indices, out=flips[lo:hi])
    return d, flips


def nan_median(values: Tensor) -> Tensor:
    """The median of each row's non-NaN values (``numpy.nanmedian(values, axis=1)``), NaN for a
    row without one: the middle value, or the mean of the two middle values for an even count.

    Args:
        values: float (S, P), NaN where a value is left out.

    Returns:
        (S,), ``values``' dtype.
    """
    # numpy's sort (NaN last, as torch's): several times faster on short float rows
    ordered = torch.from_numpy(np.sort(values.cpu().numpy(), axis=-1)).to(values.device)
    n = (~values.isnan()).sum(-1, keepdim=True)
    low = ordered.gather(-1, ((n - 1) // 2).clamp(min=0))
    high = ordered.gather(-1, (n // 2).clamp(max=values.size(-1) - 1))
    return ((low + high) / 2).squeeze(-1).masked_fill(n.squeeze(-1) == 0, float("nan"))


def permutation_loop_reference(
    model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext
) -> pd.DataFrame:
    """Plain-loop reference of :func:`run`: one forward per permutation per step.

    Uses the same streams, each step's drawn alone (:func:`attnstudy.analysis.batch.step_permutations`),
    builds each permuted row by hand and recomputes the step with
    ``attention.context`` + ``decoder.output_given_context`` for that single row. Slow by
    design; the result equals :func:`run` (to float rounding).

    Returns:
        The same columns as :func:`run`.

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    att = require_attention(model, batch, "permutation")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    h = att.size(1)
    dev = tr.src.device
    meds, flips, n_ids, skipped = [], [], [], []
    with eval_mode(model), torch.no_grad():
        for b, t in zip(b_idx.tolist(), t_idx.tolist()):
            pos = (~tr.pad_mask[b]).nonzero()[:, 0]
            nv = pos.numel()
            skipped.append(nv < 2)
            if nv < 2:
                meds.append(np.nan), flips.append(np.nan), n_ids.append(0)
                continue
            mem = sub_trace(tr, torch.tensor([b], device=dev)).memory
            prefix = tr.prefix[b, t].unsqueeze(0)

            def probs_of(
                row: torch.Tensor, mem=mem, prefix=prefix
            ) -> torch.Tensor:  # (H, T_x) -> (V,)
                ctx = model.attention.context(row[None, :, None, :], mem)[:, 0]
                return torch.softmax(model.decoder.output_given_context(prefix, ctx), -1)[0]

            row = att[b, :, t]
            base = probs_of(row)
            perms = step_permutations(
                ctx, batch.example_ids[b], t, "permutation", n=params.n, heads=h, n_valid=nv
            ).to(dev)
            ds, fs, n_id = [], [], 0
            for perm in perms:  # (H, nv)
                if bool((perm == torch.arange(nv, device=dev)).all()):
                    n_id += 1
                    continue
                new = row.clone()
                new[:, pos] = row[:, pos][torch.arange(h, device=dev)[:, None], perm]
                q = probs_of(new)
                ds.append(float(step_score("tvd", q, base)))
                fs.append(float(step_score("flip", q, base)))
            meds.append(float(np.median(ds)) if ds else np.nan)
            flips.append(float(np.mean(fs)) if fs else np.nan)
            n_ids.append(n_id)
    frame["permutation_median_tvd"] = np.asarray(meds, dtype=float)
    frame["permutation_flip_rate"] = np.asarray(flips, dtype=float)
    frame["permutation_n_identity"] = np.asarray(n_ids, dtype=np.int64)
    frame["permutation_skipped"] = np.asarray(skipped, dtype=bool)
    return frame


def more_stats(columns) -> dict:
    """The statistics of the step scores named in ``[ablation.permutation] scores`` (each the
    median over a step's permutations, as its TVD)."""
    return score_stats("permutation", columns, middle="median_")
