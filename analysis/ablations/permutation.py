"""Permutation (Jain & Wallace 2019, §4.1): P random permutations of α_t over the valid positions,
every step recomputed from its traced prefix state (one batched ``logits_given_attention`` call per
chunk); per step the median over permutations of TVD(p_t, p̃_t) and the fraction of permutations
whose argmax differs. Identity permutations are excluded and counted.
:func:`permutation_loop_reference` gives the same numbers from a plain loop (one forward per
permutation per step, same generators): the test oracle and the benchmark baseline.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import AblationSpec, Figure, OutputChangeParams, Stat
from pydantic import Field

from attnstudy.models import Seq2Seq, eval_mode

from .._chunks import base_probs, n_valid, require_attention, step_frame, sub_trace, trace_chunks
from ..batch import AblationContext, PreparedBatch, step_generator
from ..interventions import permutation_indices, permute
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
    order=10,
    description="P random permutations of the attention row (local); median output TVD, flip rate",
    reference="Jain & Wallace 2019, §4.1 (permute_attn, median over 100)",
)


def run(model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Local permutation test at every real decoder step (Jain & Wallace 2019, §4.1, Fig. 5).

    For step t with attention α_t (every head permuted independently over the valid source
    positions, generator ``step_generator(ctx.seed, example_id, t, "permutation")``):
    ``median_π TVD(p_t, p_t(α_t[π]))`` with TVD = ½ Σ_v |p − p̃| over the full output vocabulary,
    and the fraction of permutations whose argmax differs from argmax p_t. p_t is recomputed
    through the same local path from the unchanged α_t.

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
    frame, b_idx, t_idx = step_frame(batch)
    p_count = params.n
    nv = n_valid(tr)
    ids = batch.example_ids
    dev = tr.src.device
    med = torch.full(tr.step_mask.shape, float("nan"), dtype=torch.float64, device=dev)
    flip = med.clone()
    n_id = torch.zeros(tr.step_mask.shape, dtype=torch.long, device=dev)
    extra = {f"permutation_median_{s}": med.clone() for s in params.scores}
    with eval_mode(model), torch.no_grad():
        for chunk in trace_chunks(tr, p_count):
            rows = chunk.rows
            sub = sub_trace(tr, rows, chunk.start, chunk.stop)
            steps = sub.step_mask & (nv[rows] >= 2)[:, None]
            if not bool(steps.any()):
                continue

            def gen(b: int, t: int, rows=rows, start=chunk.start) -> torch.Generator:
                return step_generator(ctx.seed, ids[int(rows[b])], start + t, "permutation")

            perm = permute(sub.attention, ~sub.pad_mask, p_count, gen, steps)
            base = base_probs(model, sub, ctx.chunk_rows)  # (b, T_y, V)
            logits = model.logits_given_attention(sub, perm.weights, ctx.chunk_rows, steps)
            # only the permuted steps from here on (the padding steps' rows are zeros): S rows
            sb, st = steps.nonzero(as_tuple=True)
            probs = torch.softmax(logits[sb, :, st], -1)  # (S, P, V)
            ref = base[sb, st]  # (S, V)
            keep = ~perm.identity[sb, :, st]  # (S, P)
            d = step_score("tvd", probs, ref.unsqueeze(1)).double().masked_fill(~keep, float("nan"))
            flips = step_score("flip", probs, ref.unsqueeze(1)).double()
            n_keep = keep.sum(1)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices → NaN
                m = torch.from_numpy(np.nanmedian(d.cpu().numpy(), axis=1)).to(dev)
            f = (flips * keep).sum(1) / n_keep.clamp(min=1)
            f = f.masked_fill(n_keep == 0, float("nan"))
            at = (rows[sb], st + chunk.start)
            med[at], flip[at], n_id[at] = m, f, (~keep).sum(1)
            for col, v in score_columns(  # a T_y axis of 1 for its (B, P, T_y, V) form
                "permutation_median",
                params.scores,
                probs.unsqueeze(2),
                ref.unsqueeze(1),
                sub.tgt_out[sb, st].unsqueeze(1),
                keep=keep.unsqueeze(2),
            ).items():
                extra[col][at] = v[:, 0]
    frame["permutation_median_tvd"] = med[b_idx, t_idx].cpu().numpy()
    frame["permutation_flip_rate"] = flip[b_idx, t_idx].cpu().numpy()
    frame["permutation_n_identity"] = n_id[b_idx, t_idx].cpu().numpy()
    for col, v in extra.items():
        frame[col] = v[b_idx, t_idx].cpu().numpy()
    frame["permutation_skipped"] = (nv[b_idx] < 2).cpu().numpy()
    return frame


def permutation_loop_reference(
    model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext
) -> pd.DataFrame:
    """Plain-loop reference of :func:`run`: one forward per permutation per step.

    Uses the same generators and the same draw (:func:`attnstudy.analysis.interventions.permutation_indices`),
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
            perms = permutation_indices(
                step_generator(ctx.seed, batch.example_ids[b], t, "permutation"),
                params.n,
                h,
                nv,
                device=dev,
            )
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
