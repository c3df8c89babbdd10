"""Input × gradient per decoder step (Shrikumar et al. 2016) through Captum's definition.

X_tj = Σ_d e_jd · ∂ log p_t(ŷ_t) / ∂e_jd, attention detached by default; its absolute value is
the importance ablation's gradient × input (a test holds the two equal, and both equal to Captum's
``InputXGradient``). Kendall τ-b of the head-mean attention row against |X_t|.
"""

from __future__ import annotations

from attnstudy.analysis.attribution_params import InputXGradientParams
from attnstudy.analysis.catalogue import AblationSpec, Figure, Stat, VerdictRole

from ..attribution import run_method

SPEC = AblationSpec(
    name="input_x_gradient",
    run="attnstudy.analysis.ablations.input_x_gradient:run",
    params=InputXGradientParams,
    requires=("gradients",),
    stats={
        "tau_attn": Stat(
            "input_x_gradient_tau_attn",
            label="τ attention–input × gradient",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            verdict=VerdictRole("agrees", measure="input × gradient"),
        ),
    },
    figure=Figure(
        "stat_distributions",
        "Agreement of attention with input × gradient",
        "Kendall τ-b per step between attention and |Σ_d e_jd ∂ log p_t(ŷ_t)/∂e_jd| (Captum's "
        "InputXGradient summed over the embedding); a box per model.",
    ),
    definitions=(
        (
            "input × gradient",
            "Σ_d e_jd ∂ log p_t(y_t)/∂e_jd (Shrikumar et al. 2016; Captum InputXGradient), attention "
            "detached unless detach_attention = false; ranked by absolute value.",
        ),
    ),
    terms=("Kendall τ-b",),
    default=False,
    order=72,
    description="input × gradient Σ_d e_jd ∂ log p_t(y_t)/∂e_jd per step (Captum's definition); "
    "Kendall τ of attention against it",
    reference="Shrikumar et al. 2016; Captum InputXGradient",
)


def run(model, batch, params, ctx):
    """Input × gradient against attention per decoder step
    (:func:`~attnstudy.analysis.attribution.run_method`)."""
    return run_method("input_x_gradient", model, batch, params, ctx)
