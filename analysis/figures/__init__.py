"""Report figures: tidy DataFrame in, matplotlib Figure out (seaborn, Agg backend, no ``show``).

Rules every figure follows (they are what keeps a figure from misleading):

* one fixed colour per model across every figure (:func:`variant_palette`, passed as ``palette``);
* n printed per group, and groups with fewer than :data:`MIN_N` values drawn as points (or hollow
  markers), never as a full-size violin or a solid bar that looks as sure as one of 400;
* empty groups are left out, not drawn as empty space; a model with no value at all keeps its
  place on the axis, marked "n/a" (:func:`not_available`), and the figure records which
  (``fig.attnstudy_na``) for its caption to count;
* a model with several layers of cross-attention is drawn per layer (``model · layer l``);
* an empty or undefined input draws a note, not an empty or broken axis;
* the models' legend sits under the figure and its title is the figure's reading note (what the
  numbers and hatches mean), so neither runs over the other or off the figure, whatever the number
  of models; past :data:`FOREST_ABOVE` models the summary names them on its axes instead.

Column conventions are those of :mod:`attnstudy.analysis.suite` plus a ``variant`` column naming the
model (e.g. ``g2p additive-bahdanau``) and a ``task`` column.

The figures are modules of this package, grouped by what they show, over :mod:`.base` (constants,
theme, palette, legend): :mod:`.summary` (learning curve, estimates, accuracy by length),
:mod:`.per_step` (the ablations' figures and :data:`FIGURE_KINDS`), :mod:`.examples` (heatmaps of
single examples) and :mod:`.other_models` (seed variance, trained adversaries). Import the names
below from ``attnstudy.analysis.figures``.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # before any submodule imports seaborn (which loads pyplot)

from .base import (  # noqa: E402
    FONT,
    HEATMAP_CMAP,
    IMPORTANCE_CMAP,
    LENGTH_BINS,
    MAX_ATTENTION_BINS,
    MAX_ATTENTION_LABELS,
    METRIC_NAMES,
    MIN_N,
    NA,
    RANKINGS,
    SPACE,
    TAU_COLUMNS,
    TAU_P,
    max_attention_bin,
    not_available,
    per_layer,
    variant_palette,
    visible_tokens,
    wilson,
)
from .base import _shade as _shade  # noqa: E402 (the report shades a model's layers)
from .examples import attention_heatmaps, example_heatmaps  # noqa: E402
from .other_models import seed_variance, trained_adversaries  # noqa: E402
from .per_step import (  # noqa: E402
    ERASURE_BAR_IN,
    FIGURE_KINDS,
    FigureInput,
    adversarial_by_max_attention,
    alignment_vs_ablation,
    erasure_fractions,
    example_bootstrap_ci,
    kendall_tau,
    per_example_alignment,
    permutation_by_max_attention,
    stat_distributions,
)
from .summary import (  # noqa: E402
    FOREST_ABOVE,
    FOREST_COLUMNS,
    accuracy_by_length,
    estimates_plot,
    learning_curve,
)

__all__ = [
    "ERASURE_BAR_IN",
    "FIGURE_KINDS",
    "FONT",
    "FOREST_ABOVE",
    "FOREST_COLUMNS",
    "HEATMAP_CMAP",
    "IMPORTANCE_CMAP",
    "LENGTH_BINS",
    "MAX_ATTENTION_BINS",
    "MAX_ATTENTION_LABELS",
    "METRIC_NAMES",
    "MIN_N",
    "NA",
    "RANKINGS",
    "SPACE",
    "TAU_COLUMNS",
    "TAU_P",
    "FigureInput",
    "accuracy_by_length",
    "adversarial_by_max_attention",
    "alignment_vs_ablation",
    "attention_heatmaps",
    "erasure_fractions",
    "estimates_plot",
    "example_bootstrap_ci",
    "example_heatmaps",
    "kendall_tau",
    "learning_curve",
    "max_attention_bin",
    "not_available",
    "per_example_alignment",
    "per_layer",
    "permutation_by_max_attention",
    "seed_variance",
    "stat_distributions",
    "trained_adversaries",
    "variant_palette",
    "visible_tokens",
    "wilson",
]
