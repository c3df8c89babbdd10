"""Saliency per decoder step (Simonyan et al. 2014) through Captum's definition, against attention.

S_tj = Σ_d |∂ log p_t(ŷ_t) / ∂e_jd|, the gradient of the emitted token's log-probability with
respect to source embedding e_j, attention detached by default
(:mod:`attnstudy.analysis.attribution`); Kendall τ-b of the head-mean attention row against it.
"""

from __future__ import annotations

from attnstudy.analysis.attribution_params import SaliencyParams
from attnstudy.analysis.catalogue import AblationSpec, Figure, Stat, VerdictRole

from ..attribution import run_method

SPEC = AblationSpec(
    name="saliency",
    run="attnstudy.analysis.ablations.saliency:run",
    params=SaliencyParams,
    requires=("gradients",),
    stats={
        "tau_attn": Stat(
            "saliency_tau_attn",
            label="τ attention–saliency",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            verdict=VerdictRole("agrees", measure="saliency"),
        ),
    },
    figure=Figure(
        "stat_distributions",
        "Agreement of attention with saliency",
        "Kendall τ-b per step between attention and saliency, Σ_d |∂ log p_t(ŷ_t)/∂e_jd| "
        "(Captum's Saliency summed over the embedding); a box per model.",
    ),
    definitions=(
        (
            "saliency",
            "Σ_d |∂ log p_t(y_t)/∂e_jd| for source embedding e_j (Simonyan et al. 2014; Captum "
            "Saliency), attention detached unless detach_attention = false.",
        ),
    ),
    terms=("Kendall τ-b",),
    default=False,
    order=71,
    description="saliency: the absolute gradient of log p_t(y_t) w.r.t. each source embedding, "
    "summed over the embedding, per step (Captum's definition); Kendall τ of attention against it",
    reference="Simonyan et al. 2014; Captum Saliency",
)


def run(model, batch, params, ctx):
    """Saliency against attention per decoder step (:func:`~attnstudy.analysis.attribution.run_method`)."""
    return run_method("saliency", model, batch, params, ctx)
