"""Summary statistics per layer of cross-attention, and their mean over layers.

A model with L > 1 layers of cross-attention has one set of per-step rows per analysed layer (the
``layer`` column of the tidy table). Each layer's statistics are those of
:func:`attnstudy.analysis.suite.summary_from_sums` on that layer's rows; the **layer mean** of a
statistic is the mean of its per-layer values, (1/L) Σ_l Σnum_l / Σden_l, with a 95 % percentile
bootstrap interval that resamples examples jointly across layers (one resample draws the same
examples for every layer, as the layers of one example are not independent).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from attnstudy.scoring.estimates import bootstrap_ci

from .catalogue import AblationConfig, get_ablation
from .suite import _combine, example_sums, put_estimate, summary_from_sums


def _joint(steps: pd.DataFrame) -> pd.DataFrame:
    """The rows of single layers with all their heads jointly (``head`` −1, ``layer`` ≥ 0): the
    rows of one head alone, or of every layer at once (``layer`` −1), are other units."""
    rows = steps
    if "head" in rows.columns:
        rows = rows[rows["head"] == -1]
    return rows[rows["layer"] >= 0]


def layers_of(steps: pd.DataFrame) -> list[int]:
    """The single layers analysed with all heads jointly in a per-step table (``[0]`` for a
    table without a ``layer`` column)."""
    if steps is None or steps.empty or "layer" not in steps.columns:
        return [0]
    return sorted(int(v) for v in _joint(steps)["layer"].dropna().unique())


def _layer_sums(
    steps: pd.DataFrame, layer: int, names: Sequence[str], analysis_prefix: str
) -> tuple[pd.DataFrame, list]:
    specs, parts = [], []
    rows = _joint(steps) if "layer" in steps.columns else steps
    rows = rows[rows["layer"] == layer] if "layer" in rows.columns else rows
    for name in names:
        spec = get_ablation(name)
        if spec.unit != "step":
            continue
        prefix = "reference" if spec.prefix == "reference" else analysis_prefix
        sub = rows[rows["prefix"] == prefix] if "prefix" in rows.columns else rows
        if sub.empty or not any(c.startswith(f"{name}_") for c in sub.columns):
            continue
        specs.append(spec)
        parts.append(example_sums(sub, [spec]))
    return (_combine(parts) if parts else pd.DataFrame()), specs


def layer_summaries(
    steps: pd.DataFrame,
    names: Sequence[str],
    cfg: AblationConfig,
    analysis_prefix: str = "greedy",
) -> dict[int | str, dict[str, float]]:
    """Summary metrics per layer and their layer mean.

    Args:
        steps: a suite's per-step table with a ``layer`` column (several layers).
        names: the per-step ablations to summarise (per-example ablations are not per layer).
        cfg: ``bootstrap_resamples`` and ``seed``.
        analysis_prefix: the prefix of the ``analysis`` ablations.

    Returns:
        layer index → ``ablation/<name>/<stat>`` metrics (with ``_ci_low``/``_ci_high`` and
        ``n_steps``), and ``"mean"`` → the layer means with their intervals (statistics every layer
        defines only).
    """
    out: dict[int | str, dict[str, float]] = {}
    sums: dict[int, pd.DataFrame] = {}
    specs = []
    for layer in layers_of(steps):
        s, specs_l = _layer_sums(steps, layer, names, analysis_prefix)
        if s.empty:
            continue
        sums[layer] = s
        specs = specs_l or specs
        out[layer] = summary_from_sums(s, specs_l, cfg)
    if len(sums) > 1:
        out["mean"] = _layer_mean(sums, cfg)
    return out


def _layer_mean(sums: dict[int, pd.DataFrame], cfg: AblationConfig) -> dict[str, float]:
    layers = sorted(sums)
    index = pd.Index([])
    for s in sums.values():
        index = index.union(s.index, sort=False)
    aligned = {lay: sums[lay].reindex(index, fill_value=0.0) for lay in layers}
    cols = set.intersection(*(set(s.columns) for s in aligned.values()))
    out: dict[str, float] = {}
    for col in sorted(cols):
        parts = col.split("|")
        if len(parts) != 3 or parts[2] not in ("num", "num~"):
            continue
        name, stat = parts[0], parts[1]
        den_col = f"{name}|{stat}|den"
        complement = parts[2] == "num~"
        arrays = []
        for lay in layers:
            arrays += [
                aligned[lay][col].to_numpy(float),
                aligned[lay][den_col].to_numpy(float),
            ]
        if any(a.sum() <= 0 for a in arrays[1::2]):
            continue  # a layer where the statistic is undefined: no mean
        put_estimate(out, f"ablation/{name}/{stat}", mean_of_ratios_ci(arrays, cfg, complement))
        out[f"ablation/{name}/n_steps"] = float(
            np.mean([aligned[lay][f"{name}|n"].sum() for lay in layers])
        )
    return out


def mean_of_ratios_ci(
    arrays: list[np.ndarray], cfg: AblationConfig, complement: bool = False
) -> tuple[float, float, float]:
    """(1/L) Σ_l (Σ num_l / Σ den_l) with a 95 % percentile bootstrap over examples (paired).

    Args:
        arrays: ``[num_0, den_0, num_1, den_1, …]``, each (n_examples,), aligned on examples;
            examples with den = 0 in every layer are left out.
        cfg: ``bootstrap_resamples`` and ``seed``.
        complement: report 1 − each ratio (AER).

    Returns:
        (value, ci_low, ci_high); NaN bounds with fewer than two examples.
    """

    def statistic(*a, axis=-1):
        ratios = [a[i].sum(axis) / a[i + 1].sum(axis) for i in range(0, len(a), 2)]
        r = np.mean(ratios, axis=0)
        return 1.0 - r if complement else r

    # examples that define the statistic in no layer (no gold links…) are left out, as the
    # suite's ratio_ci does for one layer; otherwise resamples of only those have 0/0
    keep = np.any([d > 0 for d in arrays[1::2]], axis=0)
    arrays = [a[keep] for a in arrays]
    value = float(statistic(*arrays))
    n = len(arrays[0])
    if n < 2:
        return value, math.nan, math.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        low, high = bootstrap_ci(
            arrays, statistic, resamples=cfg.bootstrap_resamples, seed=cfg.seed
        )
    return value, low, high
