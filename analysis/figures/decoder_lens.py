"""The DecoderLens figure (catalogue figure kind ``"decoder_lens"``): what each encoder layer
already knows (Langedijk et al. 2024) — per encoder layer ℓ, the exact match and token error rate
of greedy decoding from layer ℓ's output, and the AER of the analysed layer's attention argmax
teacher-forced on the reference; a line per model, 95 % bootstrap intervals over examples."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .base import _legend_below, _note, _order, _subplots

PANELS = (
    ("exact", None, False, "exact match (greedy)\nhigher is better"),
    ("edits", "ref_len", False, "token error rate (greedy)\nlower is better"),
    ("aer_num", "aer_den", True, "AER of the attention argmax\n(teacher-forced), lower is better"),
)
"""(numerator column, denominator column or None for a mean, complement, axis label) per panel;
each column is ``decoder_lens_l<ℓ>_<name>``."""


def _estimate(rows: pd.DataFrame, num: str, den: str | None, complement: bool):
    """Σ num / Σ den (a mean where ``den`` is None) over examples with a 95 % bootstrap interval
    resampling examples, the tables' estimator (:func:`attnstudy.analysis.suite.ratio_ci`);
    (NaN, NaN, NaN) where undefined."""
    from ..catalogue import AblationConfig
    from ..suite import ratio_ci

    if num not in rows.columns or (den is not None and den not in rows.columns):
        return math.nan, math.nan, math.nan
    n = rows[num].astype(float).to_numpy()
    d = np.ones_like(n) if den is None else rows[den].astype(float).to_numpy()
    ok = np.isfinite(n) & np.isfinite(d) & (d > 0)
    est = ratio_ci(n[ok], d[ok], AblationConfig(), (lambda r: 1.0 - r) if complement else None)
    return est if est is not None else (math.nan, math.nan, math.nan)


def layers_known(examples: pd.DataFrame | None, palette: dict | None = None) -> Figure:
    """Per encoder layer ℓ, the task metrics of the DecoderLens and its attention's AER.

    Args:
        examples: per-example rows with ``variant``, ``example_id`` and the DecoderLens
            columns ``decoder_lens_l<ℓ>_*`` (:func:`attnstudy.analysis.ablations.decoder_lens.run`);
            a model's rows lack the layers it does not have (NaN).

    Returns:
        The figure (three panels: exact match, token error rate, AER); a note in its place when no
        row has DecoderLens columns.
    """
    from ..ablations.decoder_lens import layers_of

    layers = [] if examples is None else layers_of(examples.columns)
    fig, axes = _subplots(1, len(PANELS), figsize=(11, 3.8))
    if not layers or "variant" not in examples.columns:
        _note(axes[0], "no DecoderLens rows (ablation not run)")
        for ax in axes[1:]:
            ax.set_axis_off()
        return fig
    rows = examples.dropna(subset=[f"decoder_lens_l{layers[0]}_exact"])
    palette = {**{v: None for v in dict.fromkeys(rows["variant"])}, **(palette or {})}
    order = _order(rows, palette)
    for ax, (num, den, complement, label) in zip(axes, PANELS):
        for k, v in enumerate(order):
            mine = rows[rows["variant"] == v]
            xs, est = [], []
            for ell in layers:
                p = f"decoder_lens_l{ell}_"
                if mine[f"{p}exact"].notna().any():
                    xs.append(ell)
                    est.append(_estimate(mine, p + num, den and p + den, complement))
            x = np.array(xs, dtype=float) + (k - (len(order) - 1) / 2) * 0.04
            mean = np.array([e[0] for e in est])
            low, high = np.array([e[1] for e in est]), np.array([e[2] for e in est])
            ax.plot(x, mean, marker="o", color=palette.get(v), linewidth=1.6)
            ok = ~np.isnan(low)
            ax.vlines(x[ok], low[ok], high[ok], color=palette.get(v), linewidth=1.0)
        if num != "edits":  # shares: the whole 0–1 scale, not a zoom on a flat line
            ax.set_ylim(-0.02, 1.02)
        ax.set_xticks(layers)
        ax.set_xlabel("encoder layer ℓ the decoder reads")
        ax.set_ylabel(label)
    counts = rows.groupby("variant").size().to_dict()
    note = "points: corpus ratios over the examples; bars: 95 % bootstrap intervals over examples; "
    note += "examples: " + ", ".join(f"{v} {counts.get(v, 0)}" for v in order)
    _legend_below(fig, palette, order, note=note)
    return fig
