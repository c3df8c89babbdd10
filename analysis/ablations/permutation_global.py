"""Global permutation: the permutation policy at every step of free-running greedy decoding, so the
effects propagate; per example: output changed?, edit distance, exact match before and after."""

from __future__ import annotations

import pandas as pd
import torch
from attnstudy.analysis.catalogue import AblationSpec, Drop, ExampleColumn, Stat, VerdictRole

from attnstudy.models import ALL, Seq2Seq, eval_mode
from attnstudy.scoring.metrics import edit_distance

from .._chunks import require_attention
from ..batch import AblationContext, PreparedBatch, step_streams
from ..interventions import permute

SPEC = AblationSpec(
    name="permutation_global",
    run="attnstudy.analysis.ablations.permutation_global:run",
    unit="example",
    requires=("attention", "global"),
    stats={
        "changed_rate": Stat("permutation_global_changed"),
        "edit_distance": Stat("permutation_global_edit_distance"),
        "exact_match_original": Stat("permutation_global_exact_original"),
        "exact_match_permuted": Stat("permutation_global_exact_permuted"),
        "exact_match_drop": Stat(
            "permutation_global_exact_drop",
            label="global permutation exact-match drop",
            unit="share of examples (0–1)",
            question="used",
            direction="higher",
            order=45,  # after the local interventions' columns
            verdict=VerdictRole(
                "used",
                "beside",
                rule=Drop("exact_match_original", "exact_match_permuted"),
                note="Permuting attention at every step of free-running decoding lowers exact "
                "match from {original} to {changed} (drop {fmt}).",
            ),
        ),
    },
    derive="attnstudy.analysis.ablations.permutation_global:derive",
    examples=(  # after the step ablations' columns
        ExampleColumn(
            "global_changed",
            "global permutation changed output",
            "permutation_global_changed",
            unit="1: the permuted decoding's output differs",
            undefined="not decoded with permuted attention",
            order=90,
        ),
        ExampleColumn(
            "global_edit_distance",
            "global permutation edit distance",
            "permutation_global_edit_distance",
            unit="tokens",
            undefined="not decoded with permuted attention",
            order=90,
        ),
    ),
    order=20,
    description="one permutation per step inside free-running decoding; sequence changed, edit distance, "
    "exact-match drop",
    reference="sequence-level effect of permuting attention (NMT: Vashishth et al. 2019)",
)


def derive(rows: pd.DataFrame) -> pd.DataFrame:
    """Adds ``permutation_global_exact_drop`` = exact match of the original minus the permuted output."""
    if {"permutation_global_exact_original", "permutation_global_exact_permuted"} <= set(
        rows.columns
    ):
        rows = rows.assign(
            permutation_global_exact_drop=rows["permutation_global_exact_original"].astype(float)
            - rows["permutation_global_exact_permuted"].astype(float)
        )
    return rows


def run(
    model: Seq2Seq,
    batch: PreparedBatch,
    params,
    ctx: AblationContext,
    max_decode_factor: float = 2.0,
) -> pd.DataFrame:
    """Global permutation: free-running greedy decoding with α_t permuted at every step.

    One permutation per step and head (stream (ctx.seed, example_id, t, "permutation_global")
    of ``ctx.rng``'s scheme, :func:`attnstudy.analysis.batch.step_streams`), applied inside :meth:`Seq2Seq.decode` so the changed outputs feed
    the following steps. The original output is the model's greedy decode without intervention.

    Args:
        model, batch, cfg: as for every ablation (``ctx.seed``); only the batch's sources and
            examples are used (the prefix does not matter: decoding is free-running).
        max_decode_factor: max output length of an example = factor × its source length + 2.

    Returns:
        One row per EXAMPLE: ``example_id``, ``permutation_global_changed`` (bool),
        ``permutation_global_edit_distance`` (Levenshtein distance in tokens between the
        original and the permuted output), ``permutation_global_exact_original`` and
        ``permutation_global_exact_permuted`` (bool: output equals any reference; their mean
        difference is the task-metric drop).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    require_attention(model, batch, "permutation_global")
    tr = batch.trace
    ids = batch.example_ids
    valid = ~tr.pad_mask
    max_len = int(max_decode_factor * int(tr.src_lengths.max())) + 2

    def intervene(weights: torch.Tensor, t: int) -> torch.Tensor:  # (B, H, T_x)
        # rows: permute's step 0 of each row is decoder step t
        return permute(weights, valid, 1, step_streams(ctx, ids, SPEC.name, t)).weights[:, 0]

    # the analysed unit: a model with one layer and all heads analysed needs no selector
    unit = {}
    if tr.cross_attention.size(1) > 1 or getattr(tr, "head", ALL) != ALL:
        unit = {"layer": tr.layer, "head": getattr(tr, "head", ALL)}
    with eval_mode(model), torch.no_grad():
        orig = model.decode(tr.src, tr.src_lengths, max_len)
        pert = model.decode(tr.src, tr.src_lengths, max_len, intervene=intervene, **unit)
    decode = batch.tgt_vocab.decode
    rows = []
    for i, ex in enumerate(batch.examples):
        # each example's own length limit, so the result does not depend on the batch
        limit = int(max_decode_factor * int(tr.src_lengths[i])) + 2
        a = tuple(decode(orig.tokens[i, :limit].tolist()))
        b = tuple(decode(pert.tokens[i, :limit].tolist()))
        refs = {tuple(r) for r in ex.references}
        rows.append(
            {
                "example_id": ex.id,
                "permutation_global_changed": a != b,
                "permutation_global_edit_distance": edit_distance(a, b),
                "permutation_global_exact_original": a in refs,
                "permutation_global_exact_permuted": b in refs,
            }
        )
    return pd.DataFrame(rows)
