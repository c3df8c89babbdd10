"""Report figures: tidy DataFrame in, matplotlib Figure out (seaborn, Agg backend, no ``show``).

Rules every figure follows (they are what keeps a figure from misleading):

* one fixed colour per model across every figure (:func:`variant_palette`, passed as ``palette``);
* n printed per group, and groups with fewer than :data:`MIN_N` values drawn as points (or hollow
  markers), never as a full-size violin or a solid bar that looks as sure as one of 400;
* empty groups are left out, not drawn as empty space;
* a model with several layers of cross-attention is drawn per layer (``model · layer l``);
* an empty or undefined input draws a note, not an empty or broken axis;
* the models' legend sits under the figure and its title is the figure's reading note (what the
  numbers and hatches mean), so neither runs over the other or off the figure, whatever the number
  of models; past :data:`FOREST_ABOVE` models the summary names them on its axes instead.

Column conventions are those of :mod:`attnstudy.analysis.suite` plus a ``variant`` column naming the
model (e.g. ``g2p additive-bahdanau``) and a ``task`` column.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import colorsys  # noqa: E402

import matplotlib.colors as mcolors  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402
from scipy import stats  # noqa: E402

MAX_ATTENTION_BINS = [0.0, 0.25, 0.5, 0.75, 1.0 + 1e-9]
MAX_ATTENTION_LABELS = ["[0, .25)", "[.25, .5)", "[.5, .75)", "[.75, 1]"]
LENGTH_BINS = [0, 5, 10, 15, 20, 30, 50, 80, 10_000]
HEATMAP_CMAP = "viridis"
IMPORTANCE_CMAP = "magma"
MIN_N = 20
"""Groups with fewer values are drawn as single points (violins, bars) or hollow markers (accuracy)."""
TAU_COLUMNS = {
    "importance_tau_attn_grad": "attention vs gradient",
    "importance_tau_attn_loo": "attention vs leave-one-out",
    "importance_tau_grad_loo": "gradient vs leave-one-out",
}
TAU_P = {
    "importance_tau_attn_grad": "importance_p_attn_grad",
    "importance_tau_attn_loo": "importance_p_attn_loo",
    "importance_tau_grad_loo": "importance_p_grad_loo",
}
RANKINGS = {
    "attn_desc": "attention ↓",
    "attn_asc": "attention ↑",
    "random": "random",
    "grad_desc": "gradient ↓",
    "grad_attn_desc": "gradient × attention ↓",
}
"""Erasure orders (Serrano & Smith 2019, §4): by attention weight (descending, ascending), random,
by the gradient of the predicted token's log-probability w.r.t. the attention weight, and by that
gradient times the weight."""
SPACE = "␣"
METRIC_NAMES = {
    "per": ("PER", ", lower is better"),
    "wer": ("WER", ", lower is better"),
    "exact_match": ("exact match", ", higher is better"),
    "token_accuracy": ("token accuracy", ", higher is better"),
    "loss": ("loss", ", lower is better"),
}
FONT = 10

sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)


# ----------------------------------------------------------------------------- helpers


def _subplots(nrows: int = 1, ncols: int = 1, figsize=(11, 4.5), squeeze: bool = True, **kw):
    """Like ``plt.subplots`` but the Figure is not kept by pyplot (no leak over many figures).

    The default width, 11 in at 100 dpi, is the report's column width: figures are shown at their
    own size, so 10 pt text stays 10 pt on screen.
    """
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze, **kw)


def _note(ax, text: str) -> None:
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=11,
        color="0.35",
        wrap=True,
    )
    ax.set_xticks([])
    ax.set_yticks([])


def _has(df: pd.DataFrame | None, *cols: str) -> bool:
    return (
        df is not None
        and len(df) > 0
        and all(c in df.columns for c in cols)
        and df[list(cols)].notna().all(axis=1).any()
    )


def variant_palette(variants) -> dict[str, tuple]:
    """One fixed colour per model, in the order given (seaborn's colour-blind palette, then husl).

    Pass the same mapping to every figure of a report so a colour means one model everywhere.
    """
    names = list(dict.fromkeys(variants))
    base = sns.color_palette("colorblind", 10)
    extra = sns.color_palette("husl", max(len(names) - len(base), 0))
    colours = [*base, *extra]
    return {v: colours[i] for i, v in enumerate(names)}


def _shade(colour, k: int, n: int) -> tuple:
    """The k-th of n shades of a colour (layers of one model: lighter = lower layer)."""
    if n <= 1:
        return colour
    h, l_, s = colorsys.rgb_to_hls(*mcolors.to_rgb(colour))
    light = 0.25 + 0.5 * (1 - k / (n - 1))
    return colorsys.hls_to_rgb(h, min(0.85, l_ * 0.5 + light * 0.5), s)


def per_layer(df: pd.DataFrame, palette: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """Models with several layers get one label per layer (``model · layer l``) and one shade of
    the model's colour per layer; single-layer models keep their name and colour."""
    palette = dict(palette or variant_palette(df["variant"] if "variant" in df else []))
    if df.empty or "layer" not in df.columns or "variant" not in df.columns:
        return df, palette
    n_layers = df.groupby("variant")["layer"].nunique()
    multi = set(n_layers[n_layers > 1].index)
    if not multi:
        return df, palette
    df = df.copy()
    for v in multi:
        layers = sorted(df.loc[df["variant"] == v, "layer"].unique())
        for k, layer in enumerate(layers):
            label = f"{v} · layer {layer}"
            palette[label] = _shade(palette.get(v, (0.3, 0.3, 0.3)), k, len(layers))
        mask = df["variant"] == v
        df.loc[mask, "variant"] = df.loc[mask].apply(
            lambda r: f"{r['variant']} · layer {r['layer']}", axis=1
        )
    return df, palette


def _order(df: pd.DataFrame, palette: dict) -> list[str]:
    present = set(df["variant"])
    return [v for v in palette if v in present] + sorted(present - set(palette))


def visible_tokens(tokens) -> list[str]:
    """Tick labels with spaces visible (``␣``) and empty tokens shown as ``∅``."""
    return [SPACE if t == " " else (t.replace(" ", SPACE) if t else "∅") for t in tokens]


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95 % interval of a proportion k/n (Wilson 1927); (nan, nan) for n = 0."""
    if n == 0:
        return math.nan, math.nan
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def max_attention_bin(values: pd.Series) -> pd.Series:
    """Bin max attention into [0, .25), [.25, .5), [.5, .75), [.75, 1] (Jain & Wallace 2019, fig. 3)."""
    return pd.cut(values, MAX_ATTENTION_BINS, right=False, labels=MAX_ATTENTION_LABELS)


def _legend_columns(fig, labels: list[str], most: int = 4) -> int:
    """As many legend columns (up to ``most``) as the longest label lets fit the figure's width
    (about 0.55 em a character at the legend's size, and 4 characters for the swatch)."""
    if not labels:
        return 1
    chars = fig.get_figwidth() * 72 / (0.55 * (FONT - 1))
    return max(1, min(most, len(labels), int(chars // (max(map(len, labels)) + 4))))


def _legend_below(
    fig,
    palette: dict,
    order: list[str],
    title: str = "model",
    note: str = "",
    counts: dict | None = None,
) -> None:
    """The models' colours in one legend under the figure (constrained layout makes room).

    Args:
        note: how to read the figure (what the numbers are, what a hatch means); it becomes the
            legend's title, wrapped to the figure's width, so the layout keeps it clear of the
            plot and of the entries (a free-standing note would run over a legend of many rows,
            or off the figure).
        counts: model → decoder steps; each entry then says ``model (n steps)``.
    """
    handles = [
        Patch(color=palette[v], label=f"{v} ({counts.get(v, 0)} steps)" if counts else v)
        for v in order
    ]
    if not handles and not note:
        return
    size = FONT - 1 if not note else FONT - 2
    if note:  # about 0.6 em a character
        title = textwrap.fill(note, int(fig.get_figwidth() * 72 / (0.6 * size)))
    legend = fig.legend(
        handles=handles,
        title=title,
        loc="outside lower center",
        ncols=_legend_columns(fig, [h.get_label() for h in handles]),
        fontsize=FONT - 1,
        title_fontsize=size,
        frameon=False,
        alignment="left" if note else "center",
    )
    if note:
        legend.get_title().set_color("0.3")


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


def estimates_plot(table: pd.DataFrame, palette: dict | None = None, title: str = "") -> Figure:
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
    """
    groups = list(dict.fromkeys(table["group"])) if len(table) else []
    if not groups:
        fig, ax = _subplots(figsize=(11, 2))
        _note(ax, "no statistics")
        return fig
    sizes = [table[table["group"] == g]["label"].nunique() for g in groups]
    variants = list(dict.fromkeys(table["variant"])) if "variant" in table else [""]
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
        ax.set_xlim(lo - pad, hi + max((hi - lo) * 0.45, 0.2))  # room for the labels
        # no tick beyond the largest value shown: the room on the right holds labels, not a scale
        ticks = [t for t in ax.get_xticks() if lo - pad <= t <= hi + 1e-9]
        ax.set_xticks(ticks)
    if title:
        fig.suptitle(title)
    if variants != [""]:
        _legend_below(fig, palette, variants)
    return fig


FOREST_ABOVE = 8
"""More models than this and :func:`estimates_plot` draws one forest plot per statistic."""
FOREST_COLUMNS = 3


def _forest_plot(
    table: pd.DataFrame, groups: list[str], variants: list[str], palette: dict, title: str
) -> Figure:
    """:func:`estimates_plot` for many models: one panel per statistic, the models on its y axis
    in the table's order (shared by every panel, named on the first panel of each row), the 95 %
    interval as a bar, grouped into one block of up to :data:`FOREST_COLUMNS` panels a row per
    question. A model without the statistic leaves its line empty. The values are the summary
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
            ax.set_title(label, fontsize=FONT - 1)
            ax.set_xlabel(scales[label], fontsize=FONT - 2)
            ax.tick_params(axis="x", labelsize=FONT - 2)
            ax.set_yticks(range(k), variants, fontsize=FONT - 2)
            ax.set_ylim(k - 0.5, -0.5)
    if title:
        fig.suptitle(title)
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
        has_baseline = any(v.split()[1].startswith("none-") for v in variants if " " in v)
        ax.set(
            title=f"{task}" + (" (none: the no-attention baseline)" if has_baseline else ""),
            xlabel="source length (tokens)",
            ylabel="exact match (%)",
            ylim=(-2, 105),
        )
    for ax in axes[0][len(tasks) :]:
        ax.axis("off")
    order = _order(preds, palette)
    _legend_below(
        fig,
        palette,
        order,
        note=(
            f"bars: Wilson 95 % intervals; numbers: test examples per point; hollow: n < {MIN_N}"
        ),
    )
    return fig


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
    d = steps.dropna(subset=[column, "max_attention"]).copy()
    d, palette = per_layer(d, palette)
    d["bin"] = max_attention_bin(d["max_attention"])
    tasks = sorted(d["task"].unique()) if "task" in d else [""]
    fig, axes = _subplots(
        1, len(tasks), figsize=(11, 4.4), squeeze=False, sharey=True, width_ratios=None
    )
    for ax, task in zip(axes[0], tasks):
        sub = d[d["task"] == task] if task else d
        bins = [b for b in MAX_ATTENTION_LABELS if (sub["bin"] == b).any()]
        variants = _order(sub, palette)
        k = len(variants)
        width = 0.8 / max(k, 1)
        for i, b in enumerate(bins):
            for j, v in enumerate(variants):
                vals = sub.loc[(sub["bin"] == b) & (sub["variant"] == v), column].to_numpy(float)
                if len(vals) == 0:
                    continue
                x = i - 0.4 + width * (j + 0.5)
                colour = palette[v]
                if len(vals) >= MIN_N and np.ptp(vals) > 0:
                    parts = ax.violinplot(
                        vals, [x], widths=width * 0.95, showextrema=False, showmedians=True
                    )
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
                    rotation=90 if k > 3 else 0,
                    transform=ax.get_xaxis_transform(),
                )
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
        _order(d, palette),
        note=(
            f"numbers under the axis: decoder steps per group; groups with fewer than {MIN_N} steps are "
            "drawn as points; black line: median; empty bins are left out"
        ),
    )
    return fig


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
    d, palette = per_layer(d, palette)
    order = _order(d, palette)
    d["pair"] = d["pair"].map(TAU_COLUMNS)
    sns.boxplot(
        data=d,
        x="pair",
        y="tau",
        hue="variant",
        hue_order=order,
        order=[TAU_COLUMNS[c] for c in cols],
        palette=palette,
        ax=ax,
        fliersize=1,
        legend=False,
    )
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set(
        title="Agreement of importance measures per decoder step",
        xlabel="",
        ylabel="Kendall τ-b",
        ylim=(-1.05, 1.05),
    )
    ax.tick_params(axis="x", labelsize=FONT - 1)
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
            hue_order=[v for v in order if v in set(sig["variant"])],
            palette=palette,
            ax=ax2,
            legend=False,
        )
        ax2.set(title="steps with p < 0.05", xlabel="", ylabel="share of steps", ylim=(0, 1))
        ax2.tick_params(axis="x", labelsize=FONT - 2)
    else:
        ax2.axis("off")
    defined, _ = per_layer(steps[steps[cols].notna().any(axis=1)], palette)
    _legend_below(fig, palette, order, counts=defined.groupby("variant").size().to_dict())
    return fig


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
    """

    steps: pd.DataFrame
    analysis: pd.DataFrame
    palette: dict
    eps: float | None = None
    columns: dict = field(default_factory=dict)
    reference: bool = False


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
    from .catalogue import AblationConfig
    from .suite import step_mean_ci

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


# ----------------------------------------------------------------------------- heatmaps


def _row_labels(rec: dict) -> list[str]:
    """Row labels: the analysed prefix token; for a greedy prefix, ``pred≠ref`` marks a step whose
    predicted token differs from the reference token at that position."""
    rows = visible_tokens(rec["rows"])
    if rec.get("prefix") != "greedy":
        return rows
    ref = [*rec.get("reference", []), "<eos>"]
    return [
        r
        if i < len(ref) and rec["rows"][i] == ref[i]
        else f"{r} ≠ {ref[i] if i < len(ref) else '–'}"
        for i, r in enumerate(rows)
    ]


def _draw(ax, mat, xt, yt, cmap, vmin=0.0, vmax=1.0, gold=None, cbar_label=None, fig=None):
    """Draw a T × T_x matrix (a null row, e.g. a step without an adversary, is left blank)."""
    width = len(xt) or max((len(r) for r in mat if r is not None), default=0)
    arr = np.array(
        [
            [np.nan] * width if row is None else [np.nan if v is None else v for v in row]
            for row in mat
        ],
        dtype=float,
    )
    im = ax.imshow(arr, vmin=vmin, vmax=vmax, cmap=cmap, aspect="auto", interpolation="nearest")
    # upright labels only where they fit (about 24 characters across a panel); past 24 columns
    # even vertical labels overlap, so every k-th column is labelled
    rotate = len(xt) > 14 or max(map(len, xt), default=0) * len(xt) > 24
    k = -(-len(xt) // 24) if xt else 1
    shown = [t if i % k == 0 else "" for i, t in enumerate(xt)]
    ax.set_xticks(range(len(xt)), shown, fontsize=FONT - 2, rotation=90 if rotate else 0)
    ax.set_yticks(range(len(yt)), yt, fontsize=FONT - 2)
    ax.grid(False)
    for s, t, sure in gold or []:
        if t < arr.shape[0] and s < arr.shape[1]:
            ax.add_patch(
                Rectangle(
                    (s - 0.5, t - 0.5),
                    1,
                    1,
                    fill=False,
                    ec="white",
                    lw=1.6,
                    ls="-" if sure else "--",
                )
            )
    return im


def example_heatmaps(
    records: list[dict],
    title: str,
    eps: float | None = None,
    shown: list[dict] | None = None,
) -> Figure:
    """One model's examples: a row per example, columns attention · adversarial attention ·
    gradient × input · leave-one-out · attention over the reference with gold links.

    Rows are the analysed prefix (the model's own greedy prediction when ``prefix = greedy``,
    marked as such; a step whose prediction differs from the reference token says ``pred ≠ ref``);
    spaces show as ``␣``; attention and adversarial share the 0–1 scale; gradient and leave-one-out
    are scaled per row (each step's largest value = 1), since their units differ (nats, TVD).

    Args:
        records: from :func:`attnstudy.analysis.heatmaps.example_records`.
        title: the model.
        eps: ε_eval of the adversarial search (stated in the panel title).
        shown: the pick of each record (``rank``, ``criterion``, ``value``) in the same order,
            from :func:`attnstudy.analysis.per_example.pick_shown`.
    """
    if not records:
        fig, ax = _subplots(figsize=(11, 2))
        _note(ax, f"{title}: no attention to show")
        return fig
    # two-line titles: five panels share 11 inches
    cols = [("attention", "attention\n(analysed prefix)")]
    if any("adversarial" in r for r in records):
        cols.append(
            (
                "adversarial",
                "adversarial attention\n"
                + (f"(output TVD ≤ ε = {eps:g})" if eps is not None else ""),
            )
        )
    if any("gradient" in r for r in records):
        cols += [
            ("gradient", "|gradient × input|\n(row max = 1)"),
            ("loo", "leave-one-out TVD\n(row max = 1)"),
        ]
    if any("gold" in r for r in records):
        cols.append(("reference_attention", "attention on the reference\nwith gold links"))
    heights = [max(len(r["rows"]), len(r.get("reference_rows", []))) for r in records]
    fig = Figure(figsize=(11, 1.0 + sum(0.28 * h + 0.9 for h in heights)), layout="constrained")
    axes = fig.subplots(len(records), len(cols), squeeze=False, height_ratios=heights)
    last = None
    for i, rec in enumerate(records):
        pick = (shown or [{}] * len(records))[i]
        src = visible_tokens(rec["source"])
        for j, (key, label) in enumerate(cols):
            ax = axes[i, j]
            if key == "attention":
                layer = rec.get("layer", 0)
                mat = rec["attention"][layer if layer < len(rec["attention"]) else -1]
            else:
                mat = rec.get(key)
            if mat is None:
                _note(ax, "not run" if key != "reference_attention" else "no gold links")
                continue
            if key in ("gradient", "loo"):
                arr = np.array([[np.nan if v is None else v for v in r] for r in mat], float)
                with np.errstate(invalid="ignore", divide="ignore"):
                    arr = arr / np.nanmax(np.where(np.isfinite(arr), arr, np.nan), 1, keepdims=True)
                mat = arr.tolist()
                im = _draw(ax, mat, src, _row_labels(rec) if j == 0 else [], IMPORTANCE_CMAP)
            elif key == "reference_attention":
                im = _draw(
                    ax,
                    mat,
                    src,
                    visible_tokens(rec["reference_rows"]),
                    HEATMAP_CMAP,
                    gold=rec.get("gold"),
                )
                last = im
            else:
                im = _draw(ax, mat, src, _row_labels(rec) if j == 0 else [], HEATMAP_CMAP)
                last = im
            if j > 0 and key != "reference_attention":
                ax.set_yticks(range(len(rec["rows"])), [""] * len(rec["rows"]))
            if i == 0:
                ax.set_title(label, fontsize=FONT - 1)
            if i == len(records) - 1:
                ax.set_xlabel("source token", fontsize=FONT - 2)
        prefix = (
            "rows: the model's own prediction (greedy prefix)"
            if rec.get("prefix") == "greedy"
            else "rows: the reference (teacher-forced)"
        )
        which = (
            f" — {pick['rank']} by {pick['criterion'].replace('_', ' ')} = {pick['value']:.2f}"
            if pick
            else ""
        )
        axes[i, 0].set_ylabel(f"{rec['id']}{which}\n{prefix}", fontsize=FONT - 2)
    if last is not None:
        fig.colorbar(
            last,
            ax=axes[:, 0].tolist(),
            location="left",
            shrink=0.6,
            label="attention weight",
            pad=0.1,
        )
    handles = []
    if any("gold" in r for r in records):
        handles = [
            Line2D([], [], color="0.2", lw=1.6, label="sure gold link (white box)"),
            Line2D([], [], color="0.2", lw=1.6, ls="--", label="possible gold link (dashed box)"),
        ]
    handles.append(
        Patch(
            color="none",
            label="␣ = space; ≠ : prediction differs from the reference (– : past its end)",
        )
    )
    handles.append(
        Patch(
            color="none",
            label="blank row: no adversary within ε, or every importance 0 (row max undefined)",
        )
    )
    fig.legend(
        handles=handles, loc="outside lower center", ncols=2, fontsize=FONT - 2, frameon=False
    )
    fig.suptitle(title)
    return fig


def attention_heatmaps(examples: list[dict]) -> Figure:
    """Original attention beside the most different adversarial attention that keeps the output
    (records of earlier versions: ``title``, ``source``, ``target``, ``attention``, optional
    ``adversarial`` with null rows and ``gold`` [source, target] links, on the reference prefix)."""
    records = [
        {
            "id": ex.get("title", "example"),
            "source": ex["source"],
            "reference": [t for t in ex["target"] if t != "<eos>"],
            "rows": ex["target"],
            "prefix": "reference",
            "attention": [ex["attention"]],
            **({"adversarial": ex["adversarial"]} if ex.get("adversarial") is not None else {}),
            **(
                {
                    "reference_rows": ex["target"],
                    "reference_attention": ex["attention"],
                    "gold": [[s, t, True] for s, t in ex["gold"]],
                }
                if ex.get("gold")
                else {}
            ),
        }
        for ex in examples
    ]
    return example_heatmaps(records, "attention heatmaps" if records else "heatmaps")


def seed_variance(df: pd.DataFrame, palette: dict | None = None) -> Figure:
    """Attention JSD between seeds against output TVD between seeds (Wiegreffe & Pinter 2019, fig. 3).

    Args:
        df: columns ``variant``, ``seed_variance_attention_jsd`` (nats), ``seed_variance_output_tvd``
            (0–1), as from :func:`attnstudy.analysis.seed_variance.seed_variance`.
    """
    fig, ax = _subplots(figsize=(8, 4.5))
    df = df.rename(
        columns={
            "seed_variance_attention_jsd": "attention_jsd",
            "seed_variance_output_tvd": "output_tvd",
        }
    )
    if not _has(df, "attention_jsd", "output_tvd"):
        _note(ax, "one seed per configuration: no seed variance to show")
        return fig
    palette = palette or variant_palette(df["variant"])
    sns.scatterplot(
        data=df,
        x="attention_jsd",
        y="output_tvd",
        hue="variant",
        hue_order=_order(df, palette),
        palette=palette,
        s=12,
        alpha=0.6,
        ax=ax,
    )
    ax.set(
        title="Seed variance: attention vs output difference",
        xlabel=f"attention JSD between seeds (nats, ≤ {math.log(2):.2f})",
        ylabel="output TVD between seeds (0–1)",
    )
    return fig


def trained_adversaries(
    adversaries: pd.DataFrame,
    per_instance: pd.DataFrame | None = None,
    seed_variance: pd.DataFrame | None = None,
    palette: dict | None = None,
) -> Figure:
    """Model-consistent adversaries as a curve over λ, beside Jain & Wallace's per-instance
    adversary and the seed variance (Wiegreffe & Pinter 2019, §4 and fig. 5): x the attention JSD
    from the base model (nats, ≤ ln 2), y the output TVD from it (0–1), one colour per model.

    Args:
        adversaries: one row per adversary (:func:`attnstudy.report.adversary_frame`):
            ``variant``, ``lambda``, ``status``, ``attention_jsd`` / ``output_tvd`` with their
            ``_ci_low`` / ``_ci_high``.
        per_instance: ``variant``, ``attention_jsd``, ``output_tvd`` (one row per model).
        seed_variance: the seed-variance table (``variant``, ``seed_variance_attention_jsd``,
            ``seed_variance_output_tvd``), drawn as its mean per model.
    """
    fig, ax = _subplots(figsize=(11, 5))
    df = adversaries[adversaries["status"] == "FINISHED"] if len(adversaries) else adversaries
    if not _has(df, "attention_jsd", "output_tvd"):
        _note(ax, "no finished trained adversary in this study")
        return fig
    palette = palette or variant_palette(df["variant"])
    # each model's λ labels on their own side of its points, so curves that meet keep them apart
    offsets = [(5, 5), (5, -11), (-38, 5), (-38, -11)]
    for i, (variant, part) in enumerate(df.sort_values("lambda").groupby("variant", sort=False)):
        color = palette.get(variant)
        x, y = part["attention_jsd"], part["output_tvd"]
        ax.errorbar(
            x,
            y,
            xerr=[x - part["attention_jsd_ci_low"], part["attention_jsd_ci_high"] - x],
            yerr=[y - part["output_tvd_ci_low"], part["output_tvd_ci_high"] - y],
            fmt="-o",
            color=color,
            capsize=3,
            label=f"{variant}: trained adversary",
        )
        dx, dy = offsets[i % len(offsets)]
        for j, (lam, xi, yi) in enumerate(zip(part["lambda"], x, y)):
            ax.annotate(
                f"λ={lam:g}",
                (xi, yi),
                xytext=(dx, dy if j % 2 == 0 else -6 - dy),  # neighbours: one above, one below
                textcoords="offset points",
                fontsize=8,
                color=color,
            )
    if per_instance is not None and len(per_instance):
        for _, r in per_instance.iterrows():
            if r["variant"] in set(df["variant"]):
                ax.scatter(
                    r["attention_jsd"],
                    r["output_tvd"],
                    marker="*",
                    s=160,
                    color=palette.get(r["variant"]),
                    edgecolor="black",
                    label=f"{r['variant']}: per-instance adversary (J&W)",
                )
    if _has(seed_variance, "seed_variance_attention_jsd", "seed_variance_output_tvd"):
        means = seed_variance.groupby("variant")[
            ["seed_variance_attention_jsd", "seed_variance_output_tvd"]
        ].mean()
        for variant, r in means.iterrows():
            if variant in set(df["variant"]):
                ax.scatter(
                    r["seed_variance_attention_jsd"],
                    r["seed_variance_output_tvd"],
                    marker="s",
                    s=70,
                    color=palette.get(variant),
                    edgecolor="black",
                    label=f"{variant}: other seeds",
                )
    ax.set(
        title="Can another model attend differently and predict the same?",
        xlabel=f"attention JSD from the base model (nats, ≤ {math.log(2):.2f})",
        ylabel="output TVD from the base model (symlog)",
        xlim=(0, math.log(2) * 1.02),
    )
    # output changes that matter span 0.001–1: a symmetric-log axis keeps the small ones apart
    ax.set_yscale("symlog", linthresh=0.01, linscale=0.5)
    ax.set_ylim(0, 1.05)
    fig.legend(fontsize=8, loc="outside right upper")  # beside the axes: it hides no point
    return fig
