"""The ablations' own figures, drawn from the per-step tables: permutation and adversarial
attention by max attention, Kendall τ between importance rankings, erasure, alignment against
the ablations, the generic :func:`stat_distributions`, and :data:`FIGURE_KINDS` (how the
catalogue's figure kinds are drawn, from a :class:`FigureInput`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from scipy import stats

from .base import (
    FONT,
    MAX_ATTENTION_LABELS,
    MIN_N,
    NA,
    RANKINGS,
    TAU_COLUMNS,
    TAU_P,
    _group_x,
    _has,
    _legend_below,
    _mark_na,
    _na_text,
    _note,
    _order,
    _subplots,
    _with_na,
    max_attention_bin,
    not_available,
    per_layer,
    variant_palette,
)

# ----------------------------------------------------------------------------- per-step distributions


def _by_max_attention(
    steps: pd.DataFrame,
    column: str,
    ylabel: str,
    title: str,
    palette: dict | None,
    ylim: tuple[float, float],
    reference: float | None = None,
) -> Figure:
    if not _has(steps, column, "max_attention"):
        fig, ax = _subplots(figsize=(11, 3))
        _note(ax, f"no {title.lower()} results (no attention, or ablation not run)")
        return fig
    # every model keeps its place: one with no value at any step is marked n/a, not dropped
    models = list(palette) if palette else list(dict.fromkeys(steps["variant"]))
    task_of = (
        steps.groupby("variant")["task"].agg(lambda t: set(t)).to_dict() if "task" in steps else {}
    )
    d = steps.dropna(subset=[column, "max_attention"]).copy()
    d, palette = per_layer(d, palette)
    d["bin"] = max_attention_bin(d["max_attention"])
    missing = not_available(models, d["variant"])
    tasks = sorted(d["task"].unique()) if "task" in d else [""]
    if not tasks:
        tasks = sorted({t for m in missing for t in task_of.get(m, ())}) or [""]
    fig, axes = _subplots(
        1, len(tasks), figsize=(11, 4.4), squeeze=False, sharey=True, width_ratios=None
    )
    for ax, task in zip(axes[0], tasks):
        sub = d[d["task"] == task] if task else d
        bins = [b for b in MAX_ATTENTION_LABELS if (sub["bin"] == b).any()] or [NA]
        gone = [m for m in missing if not task or task in task_of.get(m, {task})]
        variants = _with_na(_order(sub, palette), gone, palette)
        k = len(variants)
        width = 0.8 / max(k, 1)
        for i, b in enumerate(bins):
            for j, v in enumerate(variants):
                if v in gone:  # its place in every bin, marked
                    _na_text(
                        ax,
                        _group_x(i, j, width),
                        0.5,
                        v,
                        palette,
                        ha="center",
                        va="center",
                        rotation=90,
                        fontsize=FONT - 2,
                        transform=ax.get_xaxis_transform(),
                    )
                    _mark_na(fig, v, [])
                    continue
                vals = sub.loc[(sub["bin"] == b) & (sub["variant"] == v), column].to_numpy(float)
                if len(vals) == 0:
                    continue
                _draw_group(ax, vals, (i, j), width=width, colour=palette[v], rotate=k > 3)
        if reference is not None:
            ax.axhline(reference, color="0.4", lw=0.8, ls=":")
        ax.set_xticks(range(len(bins)), bins)
        ax.tick_params(axis="x", pad=14)
        ax.set_xlim(-0.6, len(bins) - 0.4)
        ax.set(
            title=task or title,
            xlabel="maximum attention weight of the step",
            ylim=(ylim[0], ylim[1]),
        )
        ax.set_ylabel(ylabel if ax is axes[0, 0] else "")
    fig.suptitle(title)
    _legend_below(
        fig,
        palette,
        _with_na(_order(d, palette), missing, palette),
        note=(
            f"numbers under the axis: decoder steps per group; groups with fewer than {MIN_N} steps are "
            "drawn as points; black line: median; empty bins are left out"
            + (f"; {NA}: the model has no value at any step" if missing else "")
        ),
        na=set(missing),
    )
    return fig


def _draw_group(ax, vals: np.ndarray, at: tuple[int, int], *, width, colour, rotate: bool) -> None:
    """One model's values in one bin (``at``: the bin's and the model's index): a violin with its
    median, or each value as a point where there are few (so its n is visible), and the count
    under the axis."""
    i, j = at
    x = _group_x(i, j, width)
    if len(vals) >= MIN_N and np.ptp(vals) > 0:
        parts = ax.violinplot(vals, [x], widths=width * 0.95, showextrema=False, showmedians=True)
        for body in parts["bodies"]:
            body.set_facecolor(colour)
            body.set_edgecolor(colour)
            body.set_alpha(0.55)
        parts["cmedians"].set_color("black")
    else:  # few values: each one as a point, so its n is visible
        rng = np.random.default_rng(i * 97 + j)
        jitter = rng.uniform(-width * 0.25, width * 0.25, len(vals))
        ax.scatter(x + jitter, vals, s=12, color=colour, alpha=0.8, lw=0)
        ax.plot([x - width * 0.3, x + width * 0.3], [np.median(vals)] * 2, color="k")
    ax.text(
        x,
        -0.012,
        f"{len(vals)}",
        ha="center",
        va="top",
        fontsize=FONT - 3,
        color=colour,
        rotation=90 if rotate else 0,
        transform=ax.get_xaxis_transform(),
    )


def permutation_by_max_attention(steps: pd.DataFrame, palette: dict | None = None) -> Figure:
    """Median output TVD under P permutations, by max-attention bin, one panel per task
    (Jain & Wallace 2019, fig. 3)."""
    return _by_max_attention(
        steps,
        "permutation_median_tvd",
        "median output TVD (0–1)",
        "Permuting attention: how much the output distribution changes per decoder step",
        palette,
        (0, 1.02),
    )


def adversarial_by_max_attention(
    steps: pd.DataFrame, palette: dict | None = None, eps: float | None = None
) -> Figure:
    """Max JSD of an adversarial attention whose output stays within ε (TVD), by max-attention bin
    (Jain & Wallace 2019, fig. 5); the dotted line is the ceiling ln 2."""
    eps_text = f" (output TVD ≤ ε = {eps:g})" if eps is not None else " (output within ε)"
    return _by_max_attention(
        steps,
        "adversarial_max_jsd",
        "max attention JSD (nats, ≤ ln 2)",
        "Adversarial attention: how different attention can be for the same output" + eps_text,
        palette,
        (0, math.log(2) * 1.05),
        reference=math.log(2),
    )


def kendall_tau(steps: pd.DataFrame, palette: dict | None = None) -> Figure:
    """Kendall τ-b per decoder step between attention, gradient and leave-one-out importance
    (Jain & Wallace 2019, fig. 2), and the share of steps whose τ is significant (p < 0.05)."""
    cols = [c for c in TAU_COLUMNS if c in steps.columns]
    d = (
        steps.melt(
            id_vars=[c for c in ("variant", "layer") if c in steps.columns],
            value_vars=cols,
            var_name="pair",
            value_name="tau",
        ).dropna(subset=["tau"])
        if cols
        else None
    )
    fig, (ax, ax2) = _subplots(1, 2, figsize=(11, 4.4), width_ratios=[2.2, 1])
    if d is None or d.empty:
        _note(ax, "no defined Kendall τ (importance not run, or constant attention)")
        ax2.axis("off")
        return fig
    models = list(palette) if palette else list(dict.fromkeys(steps["variant"]))
    d, palette = per_layer(d, palette)
    missing = not_available(models, d["variant"])
    order = _with_na(_order(d, palette), missing, palette)
    d["pair"] = d["pair"].map(TAU_COLUMNS)
    pairs = [TAU_COLUMNS[c] for c in cols]
    _tau_boxes(fig, ax, d, pairs=pairs, order=order, palette=palette)
    _tau_significance(ax2, steps, cols, order=order, palette=palette)
    defined, _ = per_layer(steps[steps[cols].notna().any(axis=1)], palette)
    _legend_below(
        fig,
        palette,
        order,
        counts=defined.groupby("variant").size().to_dict(),
        na=set(missing),
        note=f"{NA}: no defined τ for that pair" if getattr(fig, "attnstudy_na", None) else "",
    )
    return fig


def _tau_boxes(fig: Figure, ax, d: pd.DataFrame, *, pairs, order, palette) -> None:
    """The left panel: τ per pair and model as boxes; a model without a defined τ for a pair
    keeps its place in the pair's group, marked n/a."""
    sns.boxplot(
        data=d,
        x="pair",
        y="tau",
        hue="variant",
        hue_order=order,
        order=pairs,
        palette=palette,
        ax=ax,
        fliersize=1,
        legend=False,
    )
    # a model without a defined τ for a pair keeps its place in the pair's group, marked n/a
    width = 0.8 / max(len(order), 1)
    for i, pair in enumerate(pairs):
        there = set(d.loc[d["pair"] == pair, "variant"])
        for j, v in enumerate(order):
            if v in there:
                continue
            _na_text(
                ax,
                _group_x(i, j, width),
                0.0,
                v,
                palette,
                ha="center",
                va="center",
                rotation=90,
                fontsize=FONT - 2,
            )
            _mark_na(fig, v, [pair])
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set(
        title="Agreement of importance measures per decoder step",
        xlabel="",
        ylabel="Kendall τ-b",
        ylim=(-1.05, 1.05),
    )
    ax.tick_params(axis="x", labelsize=FONT - 1)


def _tau_significance(ax2, steps: pd.DataFrame, cols: list[str], *, order, palette) -> None:
    """The right panel: per pair and model the share of steps whose τ is significant
    (p < 0.05), n/a in the same places as the left panel; off without p-values."""
    rows = []
    for c in cols:
        p = TAU_P[c]
        if p not in steps.columns:
            continue
        s, pal = per_layer(steps.dropna(subset=[c]), palette)
        for v, g in s.groupby("variant"):
            rows.append(
                {
                    "pair": TAU_COLUMNS[c].replace(" vs ", "–\n"),
                    "variant": v,
                    "share": float((g[p] < 0.05).mean()),
                    "n": len(g),
                }
            )
    if rows:
        sig = pd.DataFrame(rows)
        sns.barplot(
            data=sig,
            x="pair",
            y="share",
            hue="variant",
            hue_order=order,
            order=list(dict.fromkeys(sig["pair"])),
            palette=palette,
            ax=ax2,
            legend=False,
        )
        width = 0.8 / max(len(order), 1)  # the same n/a places as the left panel
        for i, pair in enumerate(dict.fromkeys(sig["pair"])):
            there = set(sig.loc[sig["pair"] == pair, "variant"])
            for j, v in enumerate(order):
                if v not in there:
                    _na_text(
                        ax2,
                        _group_x(i, j, width),
                        0.04,
                        v,
                        palette,
                        ha="center",
                        va="bottom",
                        rotation=90,
                        fontsize=FONT - 3,
                    )
        ax2.set(title="steps with p < 0.05", xlabel="", ylabel="share of steps", ylim=(0, 1))
        ax2.tick_params(axis="x", labelsize=FONT - 2)
    else:
        ax2.axis("off")


def stat_distributions(
    steps: pd.DataFrame, columns: dict[str, str], palette: dict | None = None, title: str = ""
) -> Figure:
    """The generic figure of an ablation's per-step statistics (catalogue figure kind
    ``"stat_distributions"``): left, a box per model of each statistic's per-step values; right,
    for statistics that are 0 or 1 per step (shares), each model's mean with its 95 % bootstrap
    interval over examples (:func:`example_bootstrap_ci`).

    Args:
        steps: per-step rows with ``variant`` (and ``layer``, ``example_id``) and ``columns``.
        columns: per-step column → its label.
        title: the left panel's title.
    """
    cols = {c: lab for c, lab in columns.items() if c in steps.columns and steps[c].notna().any()}
    binary = [c for c in cols if steps[c].dropna().isin([0, 1]).all()]
    spread = [c for c in cols if c not in binary]
    fig, (ax, ax2) = _subplots(1, 2, figsize=(11, 4.4), width_ratios=[2.2, 1])
    if not cols:
        _note(ax, "no defined values (ablation not run, skipped, or undefined at every step)")
        ax2.axis("off")
        return fig
    base, palette = per_layer(steps[steps[list(cols)].notna().any(axis=1)], palette)
    order = _order(base, palette)
    if spread:
        d = base.melt(
            id_vars=["variant"], value_vars=spread, var_name="stat", value_name="value"
        ).dropna(subset=["value"])
        d["stat"] = d["stat"].map(cols)
        sns.boxplot(
            data=d,
            x="stat",
            y="value",
            hue="variant",
            hue_order=order,
            order=[cols[c] for c in spread],
            palette=palette,
            ax=ax,
            fliersize=1,
            legend=False,
        )
        ax.axhline(0, color="0.5", lw=0.8)
        ax.set(title=title, xlabel="", ylabel="per decoder step")
    else:
        ax.axis("off")
    if binary:
        rows = []
        for c in binary:
            for v, g in base.dropna(subset=[c]).groupby("variant", sort=False):
                mean, low, high = example_bootstrap_ci(g.rename(columns={c: "value"}))
                rows.append({"stat": cols[c], "variant": v, "mean": mean, "low": low, "high": high})
        share = pd.DataFrame(rows)
        sns.barplot(
            data=share,
            x="stat",
            y="mean",
            hue="variant",
            hue_order=[v for v in order if v in set(share["variant"])],
            palette=palette,
            ax=ax2,
            legend=False,
            errorbar=None,
        )
        for container, v in zip(ax2.containers, [o for o in order if o in set(share["variant"])]):
            for bar, (_, r) in zip(container, share[share["variant"] == v].iterrows()):
                x = bar.get_x() + bar.get_width() / 2
                ax2.plot([x, x], [r["low"], r["high"]], color="0.25", linewidth=1.4)
        ax2.set(title="share of steps", xlabel="", ylabel="share of steps", ylim=(0, 1))
        ax2.tick_params(axis="x", labelsize=FONT - 2)
    else:
        ax2.axis("off")
    _legend_below(
        fig,
        palette,
        order,
        note="boxes: per-step values; bars: share of steps with a 95 % bootstrap interval over "
        "examples",
        counts=base.groupby("variant").size().to_dict(),
    )
    return fig


@dataclass(frozen=True)
class FigureInput:
    """What an ablation's figure is drawn from (:data:`FIGURE_KINDS`).

    Attributes:
        steps: every per-step row of the study (both prefixes), with ``variant``.
        analysis: the rows of each model's analysis prefix.
        palette: model → colour (:func:`variant_palette`).
        eps: the adversarial search's ε when every model shares one, else None.
        columns: the ablation's per-step statistic columns → their labels (the generic kind).
        reference: whether the ablation reads the reference prefix (then ``steps`` of that
            prefix are drawn instead of ``analysis``).
        examples: every per-example row of the study (the per-example ablations'), with
            ``variant``; empty where none was read.
    """

    steps: pd.DataFrame
    analysis: pd.DataFrame
    palette: dict
    eps: float | None = None
    columns: dict = field(default_factory=dict)
    reference: bool = False
    examples: pd.DataFrame = field(default_factory=pd.DataFrame)


def _faithfulness_aopc(steps: pd.DataFrame, palette: dict) -> Figure:
    from .faithfulness import faithfulness_aopc

    return faithfulness_aopc(steps, palette)


def _alti_plus(d: FigureInput) -> Figure:
    from .alti_plus import source_share_along_output

    rows = d.steps
    if "prefix" in rows:
        rows = rows[rows["prefix"] == "reference"]
    return source_share_along_output(rows, d.palette)


def _source_prefix(d: FigureInput) -> Figure:
    from ..catalogue import get_ablation
    from .alti_plus import source_share_along_output

    rows = d.steps
    if "prefix" in rows:
        rows = rows[rows["prefix"] == "reference"]
    stats = get_ablation("source_prefix").stats  # the panels: its share statistics, in order
    columns = {s.column: s.label for k, s in stats.items() if k.startswith("share_")}
    return source_share_along_output(rows, d.palette, columns)


def _decoder_lens(d: FigureInput) -> Figure:
    from .decoder_lens import layers_known

    return layers_known(d.examples, d.palette)


def _generic(d: FigureInput, title: str) -> Figure:
    rows = d.steps
    if d.reference and "prefix" in rows:
        rows = rows[rows["prefix"] == "reference"]
    elif not d.reference:
        rows = d.analysis
    return stat_distributions(rows, d.columns, d.palette, title)


FIGURE_KINDS: dict[str, Callable[[FigureInput, str], Figure]] = {
    "permutation": lambda d, _: permutation_by_max_attention(d.analysis, d.palette),
    "adversarial": lambda d, _: adversarial_by_max_attention(d.analysis, d.palette, d.eps),
    "kendall_tau": lambda d, _: kendall_tau(d.analysis, d.palette),
    "erasure": lambda d, _: erasure_fractions(d.analysis, d.palette),
    "alignment_vs_ablation": lambda d, _: alignment_vs_ablation(d.steps, d.palette),
    "stat_distributions": _generic,
    "faithfulness": lambda d, _: _faithfulness_aopc(d.analysis, d.palette),
    "alti_plus": lambda d, _: _alti_plus(d),
    "decoder_lens": lambda d, _: _decoder_lens(d),
    "source_prefix": lambda d, _: _source_prefix(d),
}
"""How each kind of ablation figure (:class:`attnstudy.analysis.catalogue.Figure`) is drawn:
``draw(FigureInput, title) -> Figure``. ``stat_distributions`` is the generic kind, drawn from
the ablation's own statistics; the others are figures of their own."""


def example_bootstrap_ci(rows: pd.DataFrame, column: str = "value") -> tuple[float, float, float]:
    """The mean of ``column`` over steps with a 95 % percentile bootstrap interval resampling
    examples (``example_id``): the report tables' own estimator (:func:`suite.step_mean_ci`,
    1,000 resamples, seed 0), vectorised by SciPy. It is the statistic seaborn's ``units``
    bootstrap computes (resampled examples' steps pooled, then averaged), minutes faster.

    Returns:
        (mean, low, high); the interval is (nan, nan) with fewer than two examples.
    """
    from ..catalogue import AblationConfig
    from ..suite import step_mean_ci

    est = step_mean_ci(rows.dropna(subset=[column]), column, AblationConfig())
    return est if est is not None else (math.nan, math.nan, math.nan)


def _interval_bar(ax, bar, rows: pd.DataFrame) -> None:
    """Draw :func:`example_bootstrap_ci`'s interval on a horizontal bar."""
    mean, low, high = example_bootstrap_ci(rows)
    if math.isnan(low):
        return
    y = bar.get_y() + bar.get_height() / 2
    ax.plot([low, high], [y, y], color="0.25", linewidth=1.4, solid_capstyle="butt", zorder=3)


ERASURE_BAR_IN = 0.11
"""Least height of one bar of :func:`erasure_fractions` (inches): its 6-point step count fits."""


def erasure_fractions(steps: pd.DataFrame, palette: dict | None = None) -> Figure:
    """Erase until the decision flips (Serrano & Smith 2019, §4), per ranking: the share of steps
    whose decision never flipped (all but one position erased), and — over the steps that did
    flip, with their n printed — the fraction of positions and of attention mass erased first.

    Bars are means with 95 % intervals from a bootstrap over examples
    (:func:`example_bootstrap_ci`); a bar resting on fewer than :data:`MIN_N` steps is hatched
    and pale.
    """
    rankings = [r for r in RANKINGS if f"erase_{r}_never_flipped" in steps.columns]
    if not rankings or not _has(steps, f"erase_{rankings[0]}_never_flipped"):
        fig, axes = _subplots(1, 3, figsize=(11, 4.6), sharex=False)
        _note(axes[0], "no erasure results (no attention, or ablation not run)")
        axes[1].axis("off")
        axes[2].axis("off")
        return fig
    base, palette = per_layer(steps, palette)
    never = [f"erase_{r}_never_flipped" for r in rankings]
    base = base[base[never].notna().any(axis=1)]
    order = _order(base, palette)
    # every bar at least ERASURE_BAR_IN tall, so its step count stays legible beside it
    bars = len(order) * len(rankings)
    legend = 0.25 * math.ceil(len(order) / 4)
    height = max(4.6, 1.9 + legend + ERASURE_BAR_IN * bars)
    fig, axes = _subplots(1, 3, figsize=(11, height), sharex=False)
    for ax, what, label in (
        (axes[0], "never_flipped", "never flipped\n(share of all steps)"),
        (axes[1], "frac_positions", "positions erased before the flip\n(steps that flipped)"),
        (axes[2], "frac_mass", "attention mass erased before the flip\n(steps that flipped)"),
    ):
        cols = {f"erase_{r}_{what}": RANKINGS[r] for r in rankings}
        cols = {c: lab for c, lab in cols.items() if c in base.columns}
        d = base.melt(
            id_vars=["variant", "example_id"],
            value_vars=list(cols),
            var_name="ranking",
            value_name="value",
        ).dropna(subset=["value"])
        if d.empty:
            _note(ax, "no step flipped")
            continue
        d["ranking"] = d["ranking"].map(cols)
        ranking_order = [RANKINGS[r] for r in rankings]
        sns.barplot(
            data=d,
            y="ranking",
            x="value",
            hue="variant",
            hue_order=order,
            order=ranking_order,
            palette=palette,
            errorbar=None,  # intervals below: seaborn's `units` bootstrap loops in Python
            ax=ax,
            legend=False,
            orient="h",
        )
        groups = dict(iter(d.groupby(["ranking", "variant"], sort=False)))
        k = len(order)
        for container, v in zip(ax.containers, order):
            for bar, r in zip(container, ranking_order):
                if (r, v) not in groups:
                    continue
                n = len(groups[(r, v)])
                _interval_bar(ax, bar, groups[(r, v)])
                if n < MIN_N:
                    bar.set_alpha(0.35)
                    bar.set_hatch("///")
                ax.text(
                    1.01,
                    bar.get_y() + bar.get_height() / 2,
                    f"{n}",
                    va="center",
                    fontsize=FONT - 4 if k > 3 else FONT - 3,
                    color="0.3",
                    transform=ax.get_yaxis_transform(),
                )
        ax.set(title=label, xlabel="share" if what == "never_flipped" else "fraction", xlim=(0, 1))
        ax.set_ylabel("erasure order" if ax is axes[0] else "")
        if ax is not axes[0]:
            ax.set_yticklabels([])
    _legend_below(
        fig,
        palette,
        order,
        note=(
            "numbers: decoder steps behind each bar (middle and right: only steps that flipped); "
            f"hatched: fewer than {MIN_N}; error bars: 95 % bootstrap over examples"
        ),
    )
    return fig


def per_example_alignment(steps: pd.DataFrame) -> pd.DataFrame:
    """Per-sentence table: mean gold mass (reference prefix) beside mean permutation TVD and
    adversarial JSD (analysis prefix), so differently-prefixed steps are never paired."""
    keys = ["variant", "example_id"]
    if "alignment_gold_mass" not in steps.columns or steps.empty:
        return pd.DataFrame(columns=[*keys, "gold_mass", "permutation_tvd", "adversarial_jsd"])
    gold = steps.dropna(subset=["alignment_gold_mass"])
    out = gold.groupby(keys)["alignment_gold_mass"].mean().rename("gold_mass").reset_index()
    for col, name in (
        ("permutation_median_tvd", "permutation_tvd"),
        ("adversarial_max_jsd", "adversarial_jsd"),
    ):
        if col in steps.columns:
            out = out.merge(
                steps.groupby(keys)[col].mean().rename(name).reset_index(), on=keys, how="left"
            )
        else:
            out[name] = np.nan
    return out


def alignment_vs_ablation(steps: pd.DataFrame, palette: dict | None = None) -> Figure:
    """Per sentence and model: attention mass on gold links (reference prefix) against the mean
    permutation TVD and the mean adversarial JSD (analysis prefix), with Kendall τ-b, p and n in
    each panel's title; one row of panels per model with gold links."""
    d = per_example_alignment(steps) if len(steps) else pd.DataFrame()
    panels = (
        ("permutation_tvd", "mean permutation TVD (0–1)", "permutation"),
        ("adversarial_jsd", "mean adversarial max JSD (nats)", "adversarial"),
    )
    variants = [v for v in (palette or {}) if len(d) and v in set(d["variant"])] + (
        sorted(set(d["variant"]) - set(palette or {})) if len(d) else []
    )
    fig, axes = _subplots(
        max(len(variants), 1), 2, figsize=(11, 2.9 * max(len(variants), 1) + 0.4), squeeze=False
    )
    if not variants:
        for ax in axes[0]:
            _note(ax, "no gold alignments for these tasks")
        return fig
    palette = palette or variant_palette(variants)
    for row, v in zip(axes, variants):
        g_all = d[d["variant"] == v]
        for ax, (col, label, name) in zip(row, panels):
            g = g_all.dropna(subset=["gold_mass", col])
            if g.empty:
                _note(ax, f"{v}: {name} not run")
                continue
            rng = np.random.default_rng(0)
            x = g["gold_mass"].to_numpy() + rng.uniform(-0.008, 0.008, len(g))
            ax.scatter(x, g[col], s=16, alpha=0.6, color=palette.get(v, "#333333"), lw=0)
            if len(g) >= 3 and g["gold_mass"].nunique() > 1 and g[col].nunique() > 1:
                res = stats.kendalltau(g["gold_mass"], g[col])
                tau = f"τ = {res.statistic:.2f} (p = {res.pvalue:.2g}, n = {len(g)})"
            else:
                tau = f"τ undefined (n = {len(g)})"
            ax.set(
                title=f"{v}: gold mass vs {name}\n{tau}",
                xlabel="attention mass on gold links (0–1; jittered ±0.008)"
                if v == variants[-1]
                else "",
                ylabel=label,
                xlim=(-0.03, 1.03),
            )
            ax.title.set_fontsize(FONT - 1)
    return fig
