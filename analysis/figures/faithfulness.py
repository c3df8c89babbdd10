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


def why_missing(rows: pd.DataFrame, ranking: str) -> str:
    """Why a model has no value of a ranking: its reason column's (``faithfulness_<ranking>_
    reason``: "no attention", "no input gradients"), else "undefined at every step"."""
    col = f"{PREFIX}{ranking}_reason"
    if col in rows.columns and rows[col].notna().any():
        return str(rows[col].dropna().iloc[0])
    return "undefined at every step"


def faithfulness_aopc(steps: pd.DataFrame, palette: dict | None = None) -> Figure:
    """Comprehensiveness (left) and sufficiency (right) AOPC of each ranking (rows) for each model
    (colours): the mean over decoder steps with a 95 % percentile bootstrap interval over examples
    (the tables' estimator).

    Args:
        steps: per-step rows with ``variant``, ``example_id`` and the ``faithfulness_…`` columns.
    """
    rankings = rankings_in(steps)
    fig, axes = _subplots(1, 2, figsize=(11, max(3.6, 1.6 + 0.45 * len(rankings))))
    if not rankings:
        _note(axes[0], "no faithfulness results (ablation not run, or skipped at every step)")
        axes[1].axis("off")
        return fig
    cols = [f"{PREFIX}{m}_{r}" for m, _ in MODES for r in rankings]
    base, palette = per_layer(steps[steps[cols].notna().any(axis=1)], palette)
    order = _order(base, palette)
    labels = {r: ranking_labels()[r] for r in rankings}
    for ax, (mode, title) in zip(axes, MODES):
        rows = []
        for r in rankings:
            col = f"{PREFIX}{mode}_{r}"
            for v, g in base.dropna(subset=[col]).groupby("variant", sort=False):
                mean, low, high = _mean_ci(g, col)
                rows.append(
                    {"ranking": labels[r], "variant": v, "mean": mean, "low": low, "high": high}
                )
        d = pd.DataFrame(rows)
        if d.empty:
            _note(ax, "undefined at every step")
            continue
        hue = [v for v in order if v in set(d["variant"])]
        sns.barplot(
            data=d,
            y="ranking",
            x="mean",
            hue="variant",
            hue_order=hue,
            order=[labels[r] for r in rankings],
            palette=palette,
            errorbar=None,
            orient="h",
            legend=False,
            ax=ax,
        )
        names = [labels[r] for r in rankings]
        for container, v in zip(ax.containers, hue):
            sub = d[d["variant"] == v].set_index("ranking")
            for bar in container:
                # a bar's ranking is the category at its centre (seaborn draws none for a ranking
                # the model lacks, so the container's bars are not one per ranking)
                y = bar.get_y() + bar.get_height() / 2
                r = names[int(round(y))]
                if r in sub.index:
                    ax.plot([sub.at[r, "low"], sub.at[r, "high"]], [y, y], color="0.25", lw=1.4)
        _mark_missing(ax, base, mode, rankings, hue)
        ax.axvline(0, color="0.5", lw=0.8)
        ax.set(title=title, xlabel="drop of p(y_t)", ylabel="ranking" if ax is axes[0] else "")
    _legend_below(
        fig,
        palette,
        order,
        note="bars: mean over decoder steps of the AOPC; lines: 95 % bootstrap interval over "
        "examples; removal by deletion (random orders delete as many tokens)",
        counts=base.groupby("variant").size().to_dict(),
    )
    return fig


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
            text = f"n/a for {v}: {why_missing(rows, r)}"
            ax.text(
                0,
                i - 0.4 + (j + 0.5) * width,
                f"  {text}" if right else f"{text}  ",
                ha="left" if right else "right",
                va="center",
                fontsize=8,
                color="0.3",
            )
