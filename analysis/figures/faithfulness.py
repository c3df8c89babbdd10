"""The faithfulness figure (catalogue figure kind ``"faithfulness"``): comprehensiveness and
sufficiency AOPC per ranking and model, with 95 % bootstrap intervals over examples; a model that
lacks a ranking (the ``none`` baseline's attention) has "n/a" and the reason in its bar's place."""

from __future__ import annotations

import math

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from .base import _legend_below, _note, _order, _subplots, per_layer


def _mean_ci(rows: pd.DataFrame, column: str) -> tuple[float, float, float]:
    """The mean over steps with the tables' 95 % bootstrap interval over examples
    (:func:`attnstudy.analysis.suite.step_mean_ci`, as ``example_bootstrap_ci``)."""
    from ..catalogue import AblationConfig
    from ..suite import step_mean_ci

    est = step_mean_ci(rows.dropna(subset=[column]), column, AblationConfig())
    return est if est is not None else (math.nan, math.nan, math.nan)


PREFIX = "faithfulness_"
MODES = (
    ("comprehensiveness", "comprehensiveness (AOPC)\nhigher: more faithful"),
    ("sufficiency", "sufficiency (AOPC)\nlower: more faithful"),
)
SOFT_MODES = (
    ("soft_comprehensiveness", "soft comprehensiveness (Soft-NC)\nhigher: more faithful"),
    ("soft_sufficiency", "soft sufficiency (Soft-NS)\nhigher: more faithful"),
)
"""Soft erasure's panels (Zhao & Aletras 2023), drawn under deletion's where a model has them."""
XLABELS = {
    "comprehensiveness": "drop of p(y_t)",
    "sufficiency": "drop of p(y_t)",
    "soft_comprehensiveness": "normalised drop of p(y_t)",
    "soft_sufficiency": "normalised sufficiency",
}


def has_soft(steps: pd.DataFrame, rankings: list[str]) -> bool:
    """Whether some model has a soft erasure value of one of ``rankings`` (``soft_draws`` > 0
    and a step whose source matters)."""
    cols = [f"{PREFIX}{m}_{r}" for m, _ in SOFT_MODES for r in rankings]
    cols = [c for c in cols if c in steps.columns]
    return bool(cols) and bool(steps[cols].notna().any().any())


def ranking_labels() -> dict[str, str]:
    """Every ranking of the ``faithfulness`` entry: name → label, in the catalogue's order
    (:attr:`attnstudy.analysis.ablations.faithfulness.FaithfulnessParams.RANKINGS`)."""
    from ..catalogue import get_ablation

    return dict(get_ablation("faithfulness").params.RANKINGS)


def rankings_in(steps: pd.DataFrame) -> list[str]:
    """The rankings the study ran (a comprehensiveness column among ``steps``' columns, with a
    value or a reason of some model), in the catalogue's order."""

    def ran(r: str) -> bool:
        col = f"{PREFIX}comprehensiveness_{r}"
        return col in steps.columns and (
            steps[col].notna().any() or f"{PREFIX}{r}_reason" in steps.columns
        )

    return [r for r in ranking_labels() if ran(r)]


def why_missing(rows: pd.DataFrame, ranking: str, soft: bool = False) -> str:
    """Why a model has no value of a ranking: its reason column's (``faithfulness_<ranking>_
    reason``: "no attention", "no input gradients"), for soft erasure (``soft``) then
    ``faithfulness_soft_reason`` (no source embeddings to mask), else "undefined at every step"."""
    for col in (f"{PREFIX}{ranking}_reason", *([f"{PREFIX}soft_reason"] if soft else [])):
        if col in rows.columns and rows[col].notna().any():
            return str(rows[col].dropna().iloc[0])
    return "undefined at every step"


def faithfulness_aopc(steps: pd.DataFrame, palette: dict | None = None) -> Figure:
    """Comprehensiveness (left) and sufficiency (right) AOPC of each ranking (rows) for each model
    (colours): the mean over decoder steps with a 95 % percentile bootstrap interval over examples
    (the tables' estimator). Where soft erasure was measured (``soft_draws`` > 0; Zhao & Aletras
    2023), a second row of panels draws Soft-NC and Soft-NS of the same rankings beside
    deletion's, higher more faithful in both.

    Args:
        steps: per-step rows with ``variant``, ``example_id`` and the ``faithfulness_…`` columns.
    """
    rankings = rankings_in(steps)
    soft = bool(rankings) and has_soft(steps, rankings)
    modes = MODES + (SOFT_MODES if soft else ())
    rows_ = 2 if soft else 1
    height = max(3.6, 1.6 + 0.45 * len(rankings))
    fig, axes = _subplots(rows_, 2, figsize=(11, height * rows_ - (0.8 if soft else 0)))
    axes = list(axes.flat)
    if not rankings:
        _note(axes[0], "no faithfulness results (ablation not run, or skipped at every step)")
        axes[1].axis("off")
        return fig
    cols = [f"{PREFIX}{m}_{r}" for m, _ in modes for r in rankings]
    cols = [c for c in cols if c in steps.columns]
    base, palette = per_layer(steps[steps[cols].notna().any(axis=1)], palette)
    order = _order(base, palette)
    labels = {r: ranking_labels()[r] for r in rankings}
    for ax, (mode, title) in zip(axes, modes):
        _panel(ax, base, mode, rankings, labels, order, palette)
        ax.set(title=title, xlabel=XLABELS[mode], ylabel="ranking" if ax in axes[::2] else "")
    note = (
        "bars: mean over decoder steps of the AOPC; lines: 95 % bootstrap interval over "
        "examples; removal by deletion (random orders delete as many tokens)"
    )
    if soft:
        note += (
            "; lower row: soft erasure (each embedding element zeroed at random by the "
            "ranking's normalised score, normalised by the all-zero source's drop)"
        )
    _legend_below(fig, palette, order, note=note, counts=base.groupby("variant").size().to_dict())
    return fig


def _panel(ax, base: pd.DataFrame, mode, rankings, labels, order, palette) -> None:
    """One panel: each ranking's mean of ``faithfulness_<mode>_<ranking>`` per model (bars) with
    its interval (lines), and "n/a" with the reason where a model lacks the ranking."""
    rows = []
    for r in rankings:
        col = f"{PREFIX}{mode}_{r}"
        if col not in base.columns:
            continue
        for v, g in base.dropna(subset=[col]).groupby("variant", sort=False):
            mean, low, high = _mean_ci(g, col)
            rows.append(
                {"ranking": labels[r], "variant": v, "mean": mean, "low": low, "high": high}
            )
    d = pd.DataFrame(rows)
    if d.empty:
        _note(ax, "undefined at every step")
        return
    # every model of the figure keeps its slot, also one with no value in this panel (soft
    # erasure undefined for it): its bars are missing and its slots say why
    hue = [v for v in order if v in set(base["variant"])]
    drawn = [v for v in hue if v in set(d["variant"])]  # seaborn's containers, in this order
    names = [labels[r] for r in rankings]
    if len(drawn) < len(hue):  # seaborn dodges the models it has data of: an empty bar (width
        # 0, no interval) keeps the slots of a model without a value in this panel
        empty = pd.DataFrame({"ranking": names[0], "variant": [v for v in hue if v not in drawn]})
        d = pd.concat([d, empty.assign(mean=0.0, low=math.nan, high=math.nan)])
        drawn = hue
    sns.barplot(
        data=d,
        y="ranking",
        x="mean",
        hue="variant",
        hue_order=hue,
        order=names,
        palette=palette,
        errorbar=None,
        orient="h",
        legend=False,
        ax=ax,
    )
    for container, v in zip(ax.containers, drawn):
        sub = d[d["variant"] == v].set_index("ranking")
        for bar in container:
            # a bar's ranking is the category at its centre (seaborn draws none for a ranking
            # the model lacks, so the container's bars are not one per ranking)
            y = bar.get_y() + bar.get_height() / 2
            r = names[int(round(y))]
            if r in sub.index and math.isfinite(sub.at[r, "low"]):
                ax.plot([sub.at[r, "low"], sub.at[r, "high"]], [y, y], color="0.25", lw=1.4)
    _mark_missing(ax, base, mode, rankings, hue)
    ax.axvline(0, color="0.5", lw=0.8)


def _mark_missing(ax, base: pd.DataFrame, mode: str, rankings: list[str], hue: list[str]) -> None:
    """``n/a`` and the reason where a model of ``hue`` has no value of a ranking, in the slot its
    bar would take (seaborn dodges the hue levels over 0.8 of a category), written from x = 0
    towards the wider side of the axis."""
    width = 0.8 / max(len(hue), 1)
    low, high = ax.get_xlim()
    right = high >= -low
    for i, r in enumerate(rankings):
        col = f"{PREFIX}{mode}_{r}"
        for j, v in enumerate(hue):
            rows = base[base["variant"] == v]
            if col in rows.columns and rows[col].notna().any():
                continue
            text = f"n/a for {v}: {why_missing(rows, r, mode.startswith('soft_'))}"
            ax.text(
                0,
                i - 0.4 + (j + 0.5) * width,
                f"  {text}" if right else f"{text}  ",
                ha="left" if right else "right",
                va="center",
                fontsize=8,
                color="0.3",
            )
