"""Uniform attention (Moradi et al. 2019): α_t := 1/n over the n valid positions; TVD and flip per step."""

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
from ..interventions import uniform
from ..step_scores import score_columns, score_stats, step_score

SPEC = AblationSpec(
    name="uniform",
    run="attnstudy.analysis.ablations.uniform:run",
    params=OutputChangeParams,
    more_stats="attnstudy.analysis.ablations.uniform:more_stats",
    stats={
        "flip_rate": Stat(
            "uniform_flip",
            label="uniform flip rate",
            question="used",
            direction="higher",
            verdict=VerdictRole(
                "used",
                "beside",
                phrase="uniform attention at {pct}",
                note="Under uniform attention the token stays the same at {keep} of steps.",
            ),
        ),
        "tvd": Stat(
            "uniform_tvd",
            label="uniform TVD",
            unit="TVD (0–1)",
            question="used",
            direction="higher",
        ),
    },
    definitions=(
        (
            "uniform",
            "the attention row replaced by equal weights over the valid positions (Wiegreffe & "
            "Pinter 2019's baseline).",
        ),
    ),
    examples=(
        ExampleColumn(
            "uniform_flip",
            "uniform flip",
            "uniform_flip",
            unit="share of steps (0–1)",
            step_label="uniform flip",
        ),
        ExampleColumn(
            "uniform_tvd", "uniform TVD", "uniform_tvd", unit="TVD (0–1)", step_label="uniform TVD"
        ),
    ),
    order=30,
    description="the attention row replaced by uniform weights over the valid positions; TVD, flip",
    reference="Moradi et al. 2019; Wiegreffe & Pinter 2019 (uniform baseline)",
)


def run(model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Uniform attention: α_t := 1/n over the n valid positions (Moradi et al. 2019).

    Returns:
        One row per real step: ``example_id``, ``step``, ``uniform_tvd`` (TVD(p_t, p̃_t) over the
        full vocabulary), ``uniform_flip`` (bool as float: argmax changed), ``uniform_skipped``
        (source with < 2 valid positions: values NaN).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    att = require_attention(model, batch, "uniform")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    nv = n_valid(tr)
    steps = tr.step_mask & (nv >= 2)[:, None]
    with eval_mode(model), torch.no_grad():
        base = base_probs(model, tr, ctx.chunk_rows)
        probs = torch.softmax(
            model.logits_given_attention(tr, uniform(~tr.pad_mask, att), ctx.chunk_rows, steps), -1
        )
    d = step_score("tvd", probs, base).double().masked_fill(~steps, float("nan"))
    f = step_score("flip", probs, base).double().masked_fill(~steps, float("nan"))
    frame["uniform_tvd"] = d[b_idx, t_idx].cpu().numpy()
    frame["uniform_flip"] = f[b_idx, t_idx].cpu().numpy()
    frame["uniform_skipped"] = (nv[b_idx] < 2).cpu().numpy()
    for col, v in score_columns(
        "uniform", params.scores, probs, base, tr.tgt_out, keep=steps
    ).items():
        frame[col] = v[b_idx, t_idx].cpu().numpy()
    return frame


def more_stats(columns) -> dict:
    """The statistics of the step scores named in ``[ablation.uniform] scores``."""
    return score_stats("uniform", columns)
