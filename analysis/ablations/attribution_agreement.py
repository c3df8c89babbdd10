"""The method × method agreement matrix: Kendall τ-b per decoder step between every pair of
importance measures — saliency, input × gradient, integrated gradients, occlusion (Captum's
definitions, :mod:`attnstudy.analysis.attribution`) and leave-one-out by deletion (Jain & Wallace
2019, :func:`~attnstudy.analysis.ablations.importance.loo_importance`) — each ranked by absolute
value. Input × gradient with the attention detached (the default) is the importance ablation's
gradient × input, so its row is the gradient's. How well the witnesses agree with each other is
the scale against which attention's τ with each of them is read.
"""

from __future__ import annotations

from attnstudy.analysis.attribution_params import (
    AGREEMENT_FORMER_LABELS,
    AGREEMENT_MEASURES,
    AGREEMENT_PAIRS,
    AgreementParams,
)
from attnstudy.analysis.catalogue import AblationSpec, Figure, Question, Stat, VerdictRole

from ..attribution import cached_attribution, head_mean_attention, tau_table
from .importance import loo_importance

SPEC = AblationSpec(
    name="attribution_agreement",
    run="attnstudy.analysis.ablations.attribution_agreement:run",
    params=AgreementParams,
    requires=("gradients",),
    stats={
        f"tau_{pair}": Stat(
            f"attribution_agreement_tau_{pair}",
            label=f"τ {AGREEMENT_MEASURES[a]}–{AGREEMENT_MEASURES[b]}",
            unit="Kendall τ-b",
            question="attribution_agreement",
            # result tables written before the labels came from the registry
            former_labels=AGREEMENT_FORMER_LABELS[pair],
            # the pairs of importance measures other than attention: the agreement's yardstick
            verdict=VerdictRole(
                "agrees",
                "yardstick",
                measure=f"{AGREEMENT_MEASURES[a]} and {AGREEMENT_MEASURES[b]}",
            ),
        )
        for pair, (a, b) in AGREEMENT_PAIRS.items()
    },
    questions={
        "attribution_agreement": Question(
            "Do the importance measures agree with each other? Kendall τ-b between methods",
            "Kendall τ-b per step between the rankings of source tokens by two importance "
            "measures (absolute values): saliency, input × gradient (= the gradient of the "
            "importance table), integrated gradients, occlusion and leave-one-out. Attention's τ "
            "with each measure is read against how well the measures agree with each other.",
            order=31,
        ),
    },
    figure=Figure(
        "stat_distributions",
        "Agreement between importance measures",
        "Kendall τ-b per step between every pair of saliency, input × gradient, integrated "
        "gradients, occlusion and leave-one-out; a box per model and pair.",
    ),
    terms=("Kendall τ-b",),
    default=False,
    order=76,
    description="method × method agreement: Kendall τ between saliency, input × gradient, "
    "integrated gradients, occlusion and leave-one-out per step",
    reference="Jain & Wallace 2019, §3; Captum",
)
METHODS = tuple(AGREEMENT_MEASURES)
"""The compared measures, in the matrix's order (the registry's :data:`AGREEMENT_MEASURES`)."""
PAIRS = AGREEMENT_PAIRS


def run(model, batch, params, ctx):
    """Kendall τ-b between every pair of :data:`METHODS` per decoder step.

    Args:
        params: :class:`~attnstudy.analysis.attribution_params.AgreementParams` (each method's
            settings). ctx: ``chunk_rows`` and the run's cache
            (:func:`~attnstudy.analysis.attribution.cached_attribution`).

    Returns:
        One row per real step: ``example_id``, ``step``, ``attribution_agreement_skipped``,
        ``attribution_agreement_tau_<a>_<b>`` and ``…_p_<a>_<b>`` for each pair,
        ``attribution_agreement_reason``.
    """
    vectors = {
        method: cached_attribution(
            model, batch, method, ctx, getattr(params, method).model_dump()
        ).scores
        for method in METHODS[:-1]
    }  # computed once per batch and settings within the run (shared with the methods' entries)
    vectors |= {
        "loo": loo_importance(model, batch, ctx.chunk_rows),
        "attn": head_mean_attention(batch),
    }
    return tau_table(batch, "attribution_agreement", vectors, PAIRS)
