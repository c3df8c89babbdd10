"""Figures of a model or the whole study at a glance: the learning curve of a training run
(:func:`learning_curve`), every statistic with its 95 % interval (:func:`estimates_plot`, a forest
plot per statistic past :data:`FOREST_ABOVE` models) and task accuracy by source length
(:func:`accuracy_by_length`)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .base import (
    FONT,
    LENGTH_BINS,
    METRIC_NAMES,
    MIN_N,
    _has,
    _legend_below,
    _mark_na,
    _na_text,
    _note,
    _order,
    _subplots,
    variant_palette,
    wilson,
)

# ----------------------------------------------------------------------------- training


def learning_curve(history: list[dict], metric: str, best_epoch: int | None = None) -> Figure:
    """Train and dev loss, and the dev early-stopping metric, per epoch (one model run).

    Args:
        history: one dict per epoch with ``train/loss``, ``dev/loss`` (nats per target token) and
            ``dev/<metric>``.
        metric: the early-stopping metric (``per``, ``exact_match`` …).
        best_epoch: the epoch whose weights were kept (marked), 1-based.
    """
    fig, (ax1, ax2) = _subplots(1, 2, figsize=(11, 3.6))
    if not history:
        _note(ax1, "no epochs")
        ax2.axis("off")
        return fig
    epochs = np.arange(1, len(history) + 1)
    for key, label, colour in (
        ("train/loss", "train", "#0173b2"),
        ("dev/loss", "dev", "#de8f05"),
    ):
        ax1.plot(epochs, [h.get(key, np.nan) for h in history], "o-", label=label, color=colour)
    ax1.set(
        title="Loss per epoch",
        xlabel="epoch",
        ylabel="cross-entropy (nats per target token)",
    )
    ax1.legend(fontsize=FONT - 1)
    values = [h.get(f"dev/{metric}", np.nan) for h in history]
    ax2.plot(epochs, values, "o-", color="#029e73")
    name, better = METRIC_NAMES.get(metric, (metric.replace("_", " "), ""))
    ax2.set(title=f"dev {name} per epoch (early stopping){better}", xlabel="epoch", ylabel=name)
    for ax in (ax1, ax2):
        ax.set_xticks(epochs)
        if best_epoch:
            ax.axvline(best_epoch, color="0.5", ls="--", lw=1)
    if best_epoch:
        ax2.annotate(
            f"kept: epoch {best_epoch}",
            (best_epoch, values[best_epoch - 1]),
            xytext=(5, 8),
            textcoords="offset points",
            fontsize=FONT - 1,
        )
    return fig


# ----------------------------------------------------------------------------- summaries


def estimates_plot(
    table: pd.DataFrame,
    palette: dict | None = None,
    title: str = "",
    *,
    models: list[str] | None = None,
) -> Figure:
    """Point estimates with their 95 % intervals, one panel per question.

    Up to :data:`FOREST_ABOVE` models, a statistic is one row of its question's panel with one
    line per model, labelled ``value [low, high], n=…`` and coloured as in every figure (legend
    below). With more models that layout would need a colour legend of dozens of near-alike
    colours and grow by ``0.3 in × models`` per statistic, so each statistic becomes a forest plot
    of its own (:func:`_forest_plot`): the models named on the y axis, three panels a row, one
    block per question.

    Args:
        table: columns ``group`` (panel: the question, e.g. "is attention used?"), ``label`` (the
            statistic), ``value``, ``low``, ``high`` (NaN: no interval), ``n`` (examples) and
            optionally ``variant`` (one colour per model, :func:`variant_palette`), ``scale``
            (x-axis label of the panel).
        palette: model → colour; title: the figure's title ("" for none).
        models: every model the figure shows, in order (default: the table's ``variant`` s); a
            model without a statistic keeps its line there, marked "n/a" (recorded in the
            figure's ``attnstudy_na``: model → the statistics' labels).
    """
    groups = list(dict.fromkeys(table["group"])) if len(table) else []
    if not groups:
        fig, ax = _subplots(figsize=(11, 2))
        _note(ax, "no statistics")
        return fig
    sizes = [table[table["group"] == g]["label"].nunique() for g in groups]
    variants = list(dict.fromkeys(table["variant"])) if "variant" in table else [""]
    if models is not None and "variant" in table:
        variants = list(dict.fromkeys([*models, *variants]))
    if len(variants) > FOREST_ABOVE:
        return _forest_plot(table, groups, variants, palette or variant_palette(variants), title)
    # each model gets its own line within a statistic's row, tall enough for its label
    row = 0.3 + 0.3 * len(variants)
    fig = Figure(figsize=(11, 1.2 + row * sum(sizes) + 0.5 * len(groups)), layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False, height_ratios=[max(s, 1) for s in sizes])
    palette = palette or variant_palette(variants)
    for ax, group in zip(axes[:, 0], groups):
        sub = table[table["group"] == group]
        labels = list(dict.fromkeys(sub["label"]))
        k = len(variants)
        for j, v in enumerate(variants):
            rows = sub if v == "" else sub[sub["variant"] == v]
            _draw_model(fig, ax, rows, v, slot=(j, k), labels=labels, palette=palette)
        _panel_axes(fig, ax, sub, labels=labels, group=group)
    if title:
        fig.suptitle(title)
    if variants != [""]:
        _legend_below(fig, palette, variants, na=set(variants) - set(table["variant"]))
    fig.attnstudy_labels = list(dict.fromkeys(table["label"]))
    return fig


FOREST_ABOVE = 8
"""More models than this and :func:`estimates_plot` draws one forest plot per statistic."""
FOREST_COLUMNS = 3


def _draw_model(fig: Figure, ax, rows: pd.DataFrame, v: str, *, slot, labels, palette) -> None:
    """One model's line in each statistic's row (``slot``: its index among ``k`` models): its
    estimate, interval and label, or "n/a" where it has no value."""
    j, k = slot
    for label in labels if v else []:  # no value: the model's line says so
        if (rows["label"] == label).any():
            continue
        y = labels.index(label) + (j - (k - 1) / 2) * (0.7 / max(k, 1))
        _na_text(
            ax,
            0.005,
            y,
            v,
            palette,
            fallback="#333333",
            ha="left",
            va="center",
            fontsize=FONT - 2,
            transform=ax.get_yaxis_transform(),
        )
        _mark_na(fig, v, [label])
    for _, r in rows.iterrows():
        y = labels.index(r["label"]) + (j - (k - 1) / 2) * (0.7 / max(k, 1))
        colour = palette.get(v, "#333333") if v else "#333333"
        if np.isfinite(r["low"]) and np.isfinite(r["high"]):
            ax.plot([r["low"], r["high"]], [y, y], color=colour, lw=2)
        ax.plot(r["value"], y, "o", color=colour, ms=6)
        # the label right of the interval, on the model's own line: never on another's
        end = r["high"] if np.isfinite(r["high"]) else r["value"]
        ax.annotate(
            _fmt_estimate(r),
            (max(end, r["value"]), y),
            xytext=(4, 0),
            textcoords="offset points",
            ha="left",
            va="center",
            fontsize=FONT - 2,
            color=colour,
        )


def _panel_axes(fig: Figure, ax, sub: pd.DataFrame, *, labels, group: str) -> None:
    """A question's panel: the statistics (each with its scale where they differ), and an x
    range with room for the n/a marks left and the labels right, ticks only under values."""
    scales = _panel_scales(sub, labels)
    if len(set(scales.values())) > 1:  # each statistic says its own scale and direction
        ax.set_yticks(range(len(labels)), [f"{lab}\n{scales[lab]}" for lab in labels])
        xlabel = ""
    else:
        ax.set_yticks(range(len(labels)), labels)
        xlabel = next(iter(scales.values()), "")
    ax.set_ylim(len(labels) - 0.5, -0.5)
    ax.set(title=group, xlabel=xlabel)
    lo = np.nanmin([sub["low"].min(), sub["value"].min()])
    hi = np.nanmax([sub["high"].max(), sub["value"].max()])
    pad = max((hi - lo) * 0.08, 0.02)
    if getattr(fig, "attnstudy_na", None):  # room for the n/a marks left of the values
        pad += max((hi - lo) * 0.08, 0.05)
    ax.set_xlim(lo - pad, hi + max((hi - lo) * 0.45, 0.2))  # room for the labels
    # no tick beyond the largest value shown: the room on the right holds labels, not a scale
    ticks = [t for t in ax.get_xticks() if lo - pad <= t <= hi + 1e-9]
    ax.set_xticks(ticks)


def _forest_plot(
    table: pd.DataFrame, groups: list[str], variants: list[str], palette: dict, title: str
) -> Figure:
    """:func:`estimates_plot` for many models: one panel per statistic, the models on its y axis
    in the table's order (shared by every panel, named on the first panel of each row), the 95 %
    interval as a bar, grouped into one block of up to :data:`FOREST_COLUMNS` panels a row per
    question. A model without the statistic has "n/a" on its line. The values are the summary
    table's; the panels carry no value labels."""
    k = len(variants)
    panel_h = 0.9 + 0.19 * k  # one model a line at 8-point type, plus title and x axis
    labels_of = {g: list(dict.fromkeys(table.loc[table["group"] == g, "label"])) for g in groups}
    rows_of = {g: math.ceil(len(labels_of[g]) / FOREST_COLUMNS) for g in groups}
    fig = Figure(
        figsize=(11, 0.6 + sum(0.45 + panel_h * rows_of[g] for g in groups)), layout="constrained"
    )
    blocks = fig.subfigures(
        len(groups), 1, squeeze=False, height_ratios=[0.45 + panel_h * rows_of[g] for g in groups]
    )[:, 0]
    y_of = {v: i for i, v in enumerate(variants)}
    for block, group in zip(blocks, groups):
        block.suptitle(group, fontsize=FONT + 1, fontweight="bold", ha="left", x=0.01)
        axes = block.subplots(rows_of[group], FOREST_COLUMNS, squeeze=False, sharey=True)
        sub = table[table["group"] == group]
        scales = _panel_scales(sub, labels_of[group])
        for i, ax in enumerate(axes.flat):
            if i >= len(labels_of[group]):
                ax.set_visible(False)
                continue
            label = labels_of[group][i]
            rows = sub[sub["label"] == label]
            for _, r in rows.iterrows():
                y, colour = y_of[r["variant"]], palette.get(r["variant"], "#333333")
                if np.isfinite(r["low"]) and np.isfinite(r["high"]):
                    ax.plot([r["low"], r["high"]], [y, y], color=colour, lw=2)
                ax.plot(r["value"], y, "o", color=colour, ms=4)
            for v in variants:  # no value: the model's line says so
                if v in set(rows["variant"]):
                    continue
                _na_text(
                    ax,
                    0.01,
                    y_of[v],
                    v,
                    palette,
                    fallback="#333333",
                    ha="left",
                    va="center",
                    fontsize=FONT - 3,
                    transform=ax.get_yaxis_transform(),
                )
                _mark_na(fig, v, [label])
            ax.set_title(label, fontsize=FONT - 1)
            ax.set_xlabel(scales[label], fontsize=FONT - 2)
            ax.tick_params(axis="x", labelsize=FONT - 2)
            ax.set_yticks(range(k), variants, fontsize=FONT - 2)
            ax.set_ylim(k - 0.5, -0.5)
    if title:
        fig.suptitle(title)
    fig.attnstudy_labels = list(dict.fromkeys(table["label"]))
    return fig


def _panel_scales(sub: pd.DataFrame, labels: list[str]) -> dict[str, str]:
    """The x-axis scale of each statistic of one panel (its ``scale`` column, else "")."""
    if "scale" not in sub:
        return {lab: "" for lab in labels}
    first = sub.drop_duplicates("label").set_index("label")["scale"]
    return {lab: str(first.get(lab, "") or "") for lab in labels}


def _fmt_estimate(r) -> str:
    n = f", n={int(r['n'])}" if "n" in r and pd.notna(r.get("n")) else ""
    if np.isfinite(r["low"]) and np.isfinite(r["high"]):
        return f"{r['value']:.3g} [{r['low']:.3g}, {r['high']:.3g}]{n}"
    return f"{r['value']:.3g}{n}"


# ----------------------------------------------------------------------------- accuracy


def accuracy_by_length(preds: pd.DataFrame, palette: dict | None = None) -> Figure:
    """Exact match by source-length bucket per model, one panel per task, with Wilson 95 %
    intervals and n per point; buckets with fewer than :data:`MIN_N` examples are hollow.

    Args:
        preds: columns ``task``, ``variant``, ``src_len`` (tokens), ``correct`` (bool).
    """
    tasks = sorted(preds["task"].unique()) if _has(preds, "task") else []
    ncols = max(len(tasks), 1)
    fig, axes = _subplots(1, ncols, figsize=(11, 4.2), squeeze=False)
    if not tasks:
        _note(axes[0, 0], "no test predictions")
        return fig
    palette = palette or variant_palette(preds["variant"])
    for ax, task in zip(axes[0], tasks):
        d = preds[preds["task"] == task].copy()
        d["bin"] = pd.cut(d["src_len"], LENGTH_BINS, right=False)
        bins = [b for b in d["bin"].cat.categories if (d["bin"] == b).any()]
        labels = [
            f"{int(b.left)}–{int(b.right) - 1}" if b.right < 10_000 else f"{int(b.left)}+"
            for b in bins
        ]
        variants = _order(d, palette)
        k = len(variants)
        for j, v in enumerate(variants):
            sub = d[d["variant"] == v]
            xs, ys, lo, hi, ns = [], [], [], [], []
            for i, b in enumerate(bins):
                g = sub[sub["bin"] == b]
                n, c = len(g), int(g["correct"].sum())
                if n == 0:
                    continue
                low, high = wilson(c, n)
                xs.append(i + (j - (k - 1) / 2) * 0.2)
                ys.append(100 * c / n)
                lo.append(100 * low)
                hi.append(100 * high)
                ns.append(n)
            colour = palette[v]
            ax.plot(xs, ys, "-", color=colour, lw=1.5, label=v)
            for x, y, a, b_, n in zip(xs, ys, lo, hi, ns):
                ax.plot([x, x], [a, b_], color=colour, lw=1, alpha=0.7)
                ax.plot(
                    x,
                    y,
                    "o",
                    color=colour,
                    mfc=colour if n >= MIN_N else "white",
                    ms=6,
                )
                ax.annotate(
                    f"{n}",
                    (x, b_),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    fontsize=FONT - 3,
                    color=colour,
                )
        ax.set_xticks(range(len(bins)), labels)
        ax.set(
            title=f"task: {task}",  # a task, never read as a model's name
            xlabel="source length (tokens)",
            ylabel="exact match (%)",
            ylim=(-2, 105),
        )
    for ax in axes[0][len(tasks) :]:
        ax.axis("off")
    order = _order(preds, palette)
    baseline = any(v.split()[1].startswith("none-") for v in order if " " in v)
    _legend_below(
        fig,
        palette,
        order,
        note=(
            f"bars: Wilson 95 % intervals; numbers: test examples per point; hollow: n < {MIN_N}"
            + ("; models named none-…: the no-attention baseline" if baseline else "")
        ),
    )
    return fig
