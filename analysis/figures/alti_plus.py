"""The ALTI+ figure (catalogue figure kind ``"alti_plus"``): the share of each prediction that ALTI+
attributes to the source, along the output (relative position of the step in its example's
reference target, in fifths), per model, with 95 % bootstrap intervals over examples."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .base import _legend_below, _note, _order, _subplots

COLUMN = "alti_plus_source_share"
BINS = 5
"""The output is cut into fifths: step t of an example with n steps falls in ⌊5 t / n⌋."""


def _mean_ci(rows: pd.DataFrame, column: str = COLUMN) -> tuple[float, float, float]:
    """The tables' estimator: mean over steps, 95 % bootstrap interval over examples."""
    from ..catalogue import AblationConfig
    from ..suite import step_mean_ci

    est = step_mean_ci(rows, column, AblationConfig())
    return est if est is not None else (math.nan, math.nan, math.nan)


def source_share_along_output(
    steps: pd.DataFrame | None,
    palette: dict | None = None,
    columns: dict[str, str] | None = None,
) -> Figure:
    """Mean source share per fifth of the output, a line per model, a panel per column.

    Args:
        steps: per-step rows with ``variant``, ``example_id``, ``step`` and the share columns
            (NaN where undefined: left out).
        columns: share column → its label on the y axis (default ALTI+'s
            ``alti_plus_source_share``); columns no row has are left out.

    Returns:
        The figure; a note in its place when no step has a source share.
    """
    columns = columns or {COLUMN: "source contribution (ALTI+)"}
    present = {
        c: label
        for c, label in columns.items()
        if steps is not None and c in steps.columns and steps[c].notna().any()
    }
    fig, axes = _subplots(
        1, max(1, len(present)), figsize=(11 if len(present) < 2 else 5 * len(present), 4.2)
    )
    axes = np.atleast_1d(axes)
    if not present:
        what = "ALTI+ source contribution" if COLUMN in columns else "source share"
        _note(axes[0], f"no {what} (ablation not run, or undefined at every step)")
        return fig
    rows = steps.copy()
    n = rows.groupby(["variant", "example_id"])["step"].transform("max") + 1
    rows["fifth"] = np.minimum((BINS * rows["step"] / n).astype(int), BINS - 1)
    palette = {**{v: None for v in dict.fromkeys(rows["variant"])}, **(palette or {})}
    order = _order(rows, palette)
    for ax, (column, label) in zip(axes, present.items()):
        _panel(ax, rows.dropna(subset=[column]), column, order, palette)
        ax.set_ylabel(f"{label}\n1: all from the source")
    counts = rows.dropna(subset=list(present), how="all").groupby("variant").size().to_dict()
    _legend_below(fig, palette, order, counts=counts)
    return fig


def _panel(ax, rows: pd.DataFrame, column: str, order: list, palette: dict) -> None:
    """One column's lines: per model, the mean per fifth with its interval."""
    centres = (np.arange(BINS) + 0.5) / BINS
    for k, v in enumerate(order):
        mine = rows[rows["variant"] == v]
        est = [_mean_ci(mine[mine["fifth"] == b], column) for b in range(BINS)]
        mean = np.array([e[0] for e in est])
        low = np.array([e[1] for e in est])
        high = np.array([e[2] for e in est])
        x = centres + (k - (len(order) - 1) / 2) * 0.01  # models side by side, not on top
        ax.plot(x, mean, marker="o", color=palette.get(v), linewidth=1.6)
        ok = ~np.isnan(low)
        ax.vlines(x[ok], low[ok], high[ok], color=palette.get(v), linewidth=1.0)
    ax.set_xlim(0, 1)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(
        centres, [f"{int(100 * b / BINS)}–{int(100 * (b + 1) / BINS)} %" for b in range(BINS)]
    )
    ax.set_xlabel("position of the step in the reference output")
