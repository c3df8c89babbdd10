"""Integrated gradients per decoder step (Sundararajan et al. 2017), batched, Captum's path
approximation, against attention.

IG_tj = Σ_d (e_jd − b_jd) ∫_0^1 ∂ log p_t(ŷ_t)/∂e_jd (b + α(e − b)) dα, approximated with
``n_steps`` points of Captum's ``method``; the baseline b is the zero embedding, or the ``<unk>``
or pad token's embedding. The convergence delta Σ_j IG_tj − (f_t(e) − f_t(b)) is recorded per
step; it is near 0 only with ``detach_attention = false`` (with the attention detached, the
integrated function is not f_t).
"""

from __future__ import annotations

from attnstudy.analysis.attribution_params import IntegratedGradientsParams
from attnstudy.analysis.catalogue import AblationSpec, Figure, Stat, VerdictRole

from ..attribution import run_method

SPEC = AblationSpec(
    name="integrated_gradients",
    run="attnstudy.analysis.ablations.integrated_gradients:run",
    params=IntegratedGradientsParams,
    requires=("gradients",),
    stats={
        "tau_attn": Stat(
            "integrated_gradients_tau_attn",
            label="τ attention–integrated gradients",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            verdict=VerdictRole("agrees", measure="integrated gradients"),
        ),
        "abs_delta": Stat("integrated_gradients_abs_delta", unit="nats"),
    },
    figure=Figure(
        "stat_distributions",
        "Agreement of attention with integrated gradients",
        "Kendall τ-b per step between attention and |integrated gradients| of log p_t(ŷ_t) with "
        "respect to the source embeddings (Captum's path approximation); a box per model.",
    ),
    definitions=(
        (
            "integrated gradients (IG)",
            "Σ_d (e_jd − b_jd) ∫ ∂ log p_t(y_t)/∂e_jd along the straight path from the baseline "
            "b to e (Sundararajan et al. 2017; Captum IntegratedGradients), attention detached "
            "unless detach_attention = false; ranked by absolute value.",
        ),
    ),
    terms=("Kendall τ-b",),
    default=False,
    order=73,
    description="integrated gradients of log p_t(y_t) w.r.t. the source embeddings per step "
    "(n_steps, baseline; convergence delta per step); Kendall τ of attention against it",
    reference="Sundararajan et al. 2017; Captum IntegratedGradients",
)


def run(model, batch, params, ctx):
    """Integrated gradients against attention per decoder step
    (:func:`~attnstudy.analysis.attribution.run_method`)."""
    return run_method("integrated_gradients", model, batch, params, ctx)
