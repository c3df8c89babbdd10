"""Occlusion per decoder step (Zeiler & Fergus 2014): each source token replaced in turn by a
replacement token, beside leave-one-out's deletion, against attention.

O_tj = score(p̃_t^{(j)}, p_t, ŷ_t) with token j replaced by ``<unk>`` (attnstudy's models) or the
pad token (Hugging Face models); the default score, log p_t(ŷ_t) − log p̃_t(ŷ_t), is Captum's
``Occlusion`` with a one-token window; any registered step score
(:mod:`attnstudy.analysis.step_scores`) can replace it. No gradient: every replacement of the
batch is traced at once.
"""

from __future__ import annotations

from attnstudy.analysis.attribution_params import OcclusionParams
from attnstudy.analysis.catalogue import AblationSpec, Figure, Stat, VerdictRole

from ..attribution import run_method

SPEC = AblationSpec(
    name="occlusion",
    run="attnstudy.analysis.ablations.occlusion:run",
    params=OcclusionParams,
    requires=(),  # a trace of the replaced source: no gradient
    stats={
        "tau_attn": Stat(
            "occlusion_tau_attn",
            label="τ attention–occlusion",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            verdict=VerdictRole("agrees", measure="occlusion"),
        ),
    },
    figure=Figure(
        "stat_distributions",
        "Agreement of attention with occlusion",
        "Kendall τ-b per step between attention and the output change when source token j is "
        "replaced by <unk> (the pad token for Hugging Face models); a box per model.",
    ),
    definitions=(
        (
            "occlusion",
            "the output change when source token j is replaced by a replacement token (<unk>; the "
            "pad token for Hugging Face models), by default log p_t(y_t) − log p̃_t(y_t) "
            "(Zeiler & Fergus 2014; Captum Occlusion); ranked by absolute value.",
        ),
    ),
    terms=("Kendall τ-b",),
    default=False,
    order=74,
    description="occlusion: each source token replaced by the unknown token (pad for Hugging Face "
    "models), the change of a step score (default log p_t(y_t)); Kendall τ of attention against it",
    reference="Zeiler & Fergus 2014; Captum Occlusion",
)


def run(model, batch, params, ctx):
    """Occlusion against attention per decoder step
    (:func:`~attnstudy.analysis.attribution.run_method`)."""
    return run_method("occlusion", model, batch, params, ctx)
