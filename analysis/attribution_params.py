"""The attribution methods' names and labels (:data:`METHOD_LABELS`, the one registry of them)
and their parameters (:mod:`attnstudy.analysis.attribution`), one definition each, read by the
catalogue entries' spec headers without importing torch.

Every ablation module of an attribution method imports its :class:`Params` class from here, and
``attribution_agreement`` nests them, so ``[ablation.integrated_gradients]`` and
``[ablation.attribution_agreement.integrated_gradients]`` take the same keys.
"""

from __future__ import annotations

from typing import Literal

from attnstudy.analysis.catalogue import Params
from pydantic import Field

METHOD_LABELS: dict[str, str] = {
    "saliency": "saliency",
    "input_x_gradient": "input × gradient",
    "integrated_gradients": "integrated gradients",
    "occlusion": "occlusion",
}
"""The attribution methods of :func:`attnstudy.analysis.attribution.attribute`: name (in configs,
metric keys and columns) → label (in the report's tables, figures and verdicts, and in result
tables). Every list of the methods and every label of one is read from here."""
METHODS = tuple(METHOD_LABELS)
"""The attribution methods' names, in the registry's order."""
GRADIENT_METHODS = ("saliency", "input_x_gradient", "integrated_gradients")
"""The methods computed from input gradients (a model needs the ``gradients`` capability)."""
ONE_BACKWARD_METHODS = ("saliency", "input_x_gradient")
"""The methods read off one backward per decoder step together (``attribution.gradient_scores``):
asked for with the same settings, both come from one pass."""
IMPORTANCE_LABELS: dict[str, str] = {
    "attention": "attention",
    **METHOD_LABELS,
    "leave_one_out": "leave-one-out",
}
"""Every importance measure a source-token ranking can be read from: the head-mean attention
row, the attribution methods and leave-one-out by deletion (Jain & Wallace 2019, §3;
:func:`attnstudy.analysis.ablations.importance.loo_importance`): name → label."""

AGREEMENT_MEASURES: dict[str, str] = {
    **{method: METHOD_LABELS[method] for method in METHODS},
    "loo": IMPORTANCE_LABELS["leave_one_out"],
}
"""The measures the method × method agreement matrix compares (``attribution_agreement``), in its
order: name in its metric keys (leave-one-out is ``loo`` there, as in stored runs) → label."""
AGREEMENT_PAIRS: dict[str, tuple[str, str]] = {
    f"{a}_{b}": (a, b)
    for i, a in enumerate(AGREEMENT_MEASURES)
    for b in list(AGREEMENT_MEASURES)[i + 1 :]
}
"""Every pair of :data:`AGREEMENT_MEASURES` once: ``"<a>_<b>"`` (its metric keys' infix) → (a, b)."""
_AGREEMENT_SHORT_LABELS = {"integrated_gradients": "IG", "loo": "LOO"}
AGREEMENT_FORMER_LABELS: dict[str, tuple[str, ...]] = {
    pair: tuple(
        {"τ {}–{}".format(*(_AGREEMENT_SHORT_LABELS.get(m, AGREEMENT_MEASURES[m]) for m in (a, b)))}
        - {f"τ {AGREEMENT_MEASURES[a]}–{AGREEMENT_MEASURES[b]}"}
    )
    for pair, (a, b) in AGREEMENT_PAIRS.items()
}
"""The labels the agreement matrix's result tables used before they came from this registry
("IG", "LOO"), per pair (none where the label is unchanged): its ``Stat.former_labels``."""


class GradientParams(Params):
    """A gradient method's settings.

    Attributes:
        detach_attention: stop the gradient through the cross-attention weights, so it flows only
            through the encoder–context path (Jain & Wallace 2019, §3; importance.py's choice).
    """

    detach_attention: bool = True


class SaliencyParams(GradientParams):
    """Saliency (Simonyan et al. 2014): Σ_d |∂ log p_t(ŷ_t) / ∂e_jd|."""


class InputXGradientParams(GradientParams):
    """Input × gradient (Shrikumar et al. 2016): Σ_d e_jd · ∂ log p_t(ŷ_t) / ∂e_jd."""


class IntegratedGradientsParams(GradientParams):
    """Integrated gradients (Sundararajan et al. 2017, eq. 1, Captum's approximation).

    Attributes:
        n_steps: points of the path integral (Captum's ``n_steps``; ≥ 2).
        baseline: the baseline embedding of every real source position: ``"zero"`` (the zero
            vector), ``"unk"`` (the ``<unk>`` token's embedding; a Hugging Face model's unknown
            token, or its pad token where it has none) or ``"pad"`` (the pad token's embedding).
        approximation: Captum's integral approximation (``IntegratedGradients.attribute``'s
            ``method=``), one of the five it names.
    """

    n_steps: int = Field(50, ge=2, le=10_000)
    baseline: Literal["zero", "unk", "pad"] = "zero"
    approximation: Literal[
        "gausslegendre", "riemann_trapezoid", "riemann_left", "riemann_right", "riemann_middle"
    ] = "gausslegendre"


class OcclusionParams(Params):
    """Occlusion (Zeiler & Fergus 2014) of one source token at a time by a replacement token.

    Attributes:
        replacement: ``"auto"`` (``<unk>`` for attnstudy's models, the pad token for a Hugging Face
            model), ``"unk"`` or ``"pad"``.
        score: the registered step score of the output change
            (:mod:`attnstudy.analysis.step_scores`); the default ``log_probability_drop``,
            log p_t(ŷ_t) − log p̃_t(ŷ_t), is Captum's occlusion attribution of that target.
    """

    replacement: Literal["auto", "unk", "pad"] = "auto"
    score: str = Field("log_probability_drop", pattern=r"^[a-z_][a-z0-9_]*$")


class AgreementParams(Params):
    """The settings of each method the agreement matrix compares (same keys as their entries)."""

    saliency: SaliencyParams = Field(default_factory=SaliencyParams)
    input_x_gradient: InputXGradientParams = Field(default_factory=InputXGradientParams)
    integrated_gradients: IntegratedGradientsParams = Field(
        default_factory=IntegratedGradientsParams
    )
    occlusion: OcclusionParams = Field(default_factory=OcclusionParams)


class SourcePrefixParams(Params):
    """Source vs prefix settings (:mod:`attnstudy.analysis.ablations.source_prefix`).

    Attributes:
        methods: which of :data:`GRADIENT_METHODS` to attribute to the source and the prefix
            (default all three).
        detach_attention: stop the gradient through the cross-attention weights (default false:
            the whole network, so that integrated gradients' completeness holds).
        n_steps: integrated gradients' path points (Captum's Gauss–Legendre rule; ≥ 2).
    """

    methods: list[Literal[GRADIENT_METHODS]] = Field(  # type: ignore[valid-type]
        default_factory=lambda: list(GRADIENT_METHODS), min_length=1
    )
    detach_attention: bool = False
    n_steps: int = Field(20, ge=2, le=10_000)
