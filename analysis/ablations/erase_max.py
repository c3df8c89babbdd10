"""Erase the largest attention weight (Serrano & Smith 2019, "Is Attention Interpretable?", §3): zero
the single largest weight of α_t in every head and renormalise (L1); TVD and flip per step."""

from __future__ import annotations

import pandas as pd
import torch
from attnstudy.analysis.catalogue import (
    AblationSpec,
    ExampleColumn,
    OutputChangeParams,
    Stat,
    VerdictRole,
)

from attnstudy.models import Seq2Seq, eval_mode

from .._chunks import base_probs, n_valid, require_attention, step_frame
from ..batch import AblationContext, PreparedBatch
from ..interventions import erase_max
from ..step_scores import score_columns, score_stats, step_score

SPEC = AblationSpec(
    name="erase_max",
    run="attnstudy.analysis.ablations.erase_max:run",
    params=OutputChangeParams,
    more_stats="attnstudy.analysis.ablations.erase_max:more_stats",
    stats={
        "flip_rate": Stat(
            "erase_max_flip",
            label="erase-max flip rate",
            question="used",
            direction="higher",
            verdict=VerdictRole("used", "beside", phrase="erasing the largest weight at {pct}"),
        ),
        "tvd": Stat(
            "erase_max_tvd",
            label="erase-max TVD",
            unit="TVD (0–1)",
            question="used",
            direction="higher",
        ),
    },
    definitions=(
        (
            "erase-max",
            "the largest attention weight set to 0 and the row renormalised (Serrano & Smith "
            "2019, §3).",
        ),
    ),
    examples=(
        ExampleColumn(
            "erase_max_flip",
            "erase-max flip",
            "erase_max_flip",
            unit="share of steps (0–1)",
            undefined="no step to erase: a source of one position",
            step_label="erase-max flip",
        ),
    ),
    order=40,
    description="the largest attention weight erased and the row renormalised; TVD, flip",
    reference="Serrano & Smith 2019, §3",
)


def run(model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Erase the largest attention weight (every head) and renormalise (Serrano & Smith 2019, §3).

    Returns:
        One row per real step: ``example_id``, ``step``, ``erase_max_tvd`` (TVD(p_t, p̃_t), full
        vocabulary), ``erase_max_flip`` (argmax changed, as float), ``erase_max_skipped``
        (source with < 2 valid positions: nothing would be left; values NaN).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    att = require_attention(model, batch, "erase_max")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    nv = n_valid(tr)
    steps = tr.step_mask & (nv >= 2)[:, None]
    rep = erase_max(att, ~tr.pad_mask)
    with eval_mode(model), torch.no_grad():
        base = base_probs(model, tr, ctx.chunk_rows)
        probs = torch.softmax(
            model.logits_given_attention(tr, rep.weights, ctx.chunk_rows, steps), -1
        )
    steps = steps & ~rep.empty.any(1)
    frame["erase_max_tvd"] = (
        step_score("tvd", probs, base)
        .double()
        .masked_fill(~steps, float("nan"))[b_idx, t_idx]
        .cpu()
        .numpy()
    )
    frame["erase_max_flip"] = (
        step_score("flip", probs, base)
        .double()
        .masked_fill(~steps, float("nan"))[b_idx, t_idx]
        .cpu()
        .numpy()
    )
    frame["erase_max_skipped"] = (nv[b_idx] < 2).cpu().numpy()
    for col, v in score_columns(
        "erase_max", params.scores, probs, base, tr.tgt_out, keep=steps
    ).items():
        frame[col] = v[b_idx, t_idx].cpu().numpy()
    return frame


def more_stats(columns) -> dict:
    """The statistics of the step scores named in ``[ablation.erase_max] scores``."""
    return score_stats("erase_max", columns)
