"""Report figures: tidy DataFrame in, matplotlib Figure out (seaborn, Agg backend, no ``show``).

Every function tolerates empty or single-value groups (it draws a note instead of failing) and
labels its axes with units. Column conventions are those of :mod:`attnstudy.analysis.suite` plus a
``variant`` column naming the model (e.g. ``g2p additive-bahdanau``).
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from scipy import stats  # noqa: E402

MAX_ATTENTION_BINS = [0.0, 0.25, 0.5, 0.75, 1.0 + 1e-9]
MAX_ATTENTION_LABELS = ["[0, .25)", "[.25, .5)", "[.5, .75)", "[.75, 1]"]
LENGTH_BINS = [0, 5, 10, 15, 20, 30, 50, 80, 10_000]
HEATMAP_CMAP = "viridis"
TAU_COLUMNS = {
    "importance_tau_attn_grad": "attention vs gradient",
    "importance_tau_attn_loo": "attention vs leave-one-out",
    "importance_tau_grad_loo": "gradient vs leave-one-out",
}

sns.set_theme(style="whitegrid", context="notebook")


def _subplots(nrows: int = 1, ncols: int = 1, figsize=(8, 4.5), squeeze: bool = True):
    """Like ``plt.subplots`` but the Figure is not kept by pyplot (no leak over many figures)."""
    fig = Figure(figsize=figsize)
    return fig, fig.subplots(nrows, ncols, squeeze=squeeze)


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


def max_attention_bin(values: pd.Series) -> pd.Series:
    """Bin max attention into [0, .25), [.25, .5), [.5, .75), [.75, 1] (Jain & Wallace 2019, fig. 3)."""
    return pd.cut(values, MAX_ATTENTION_BINS, right=False, labels=MAX_ATTENTION_LABELS)


def accuracy_by_length(preds: pd.DataFrame, ax=None) -> Figure:
    """Exact match by source-length bucket per variant, one panel per task (the bottleneck picture).

    Args:
        preds: columns ``task``, ``variant``, ``src_len`` (tokens), ``correct`` (bool).
    """
    tasks = sorted(preds["task"].unique()) if _has(preds, "task") else []
    fig, axes = _subplots(
        1, max(len(tasks), 1), figsize=(5.5 * max(len(tasks), 1), 4), squeeze=False
    )
    if not tasks:
        _note(axes[0, 0], "no test predictions")
        return fig
    for ax_, task in zip(axes[0], tasks):
        d = preds[preds["task"] == task].copy()
        d["length"] = pd.cut(d["src_len"], LENGTH_BINS, right=False)
        d["length"] = d["length"].map(
            lambda iv: (
                f"{int(iv.left)}–{int(iv.right) - 1}" if iv.right < 10_000 else f"{int(iv.left)}+"
            )
        )
        agg = (
            d.groupby(["variant", "length"], observed=True)["correct"].mean().mul(100).reset_index()
        )
        order = [c for c in d.sort_values("src_len")["length"].unique()]
        sns.pointplot(
            data=agg, x="length", y="correct", hue="variant", order=order, ax=ax_, markers="o"
        )
        ax_.set(
            title=f"{task}: exact match by source length",
            xlabel="source length (tokens)",
            ylabel="exact match (%)",
            ylim=(-2, 102),
        )
        ax_.legend(title="model", fontsize=8)
    fig.tight_layout()
    return fig


def _by_max_attention(steps: pd.DataFrame, column: str, ylabel: str, title: str) -> Figure:
    fig, ax = _subplots(figsize=(8, 4.5))
    if not _has(steps, column, "max_attention"):
        _note(ax, f"no {title.lower()} results (no attention, or ablation not run)")
        return fig
    d = steps.dropna(subset=[column, "max_attention"]).copy()
    d["max attention"] = max_attention_bin(d["max_attention"])
    sns.violinplot(
        data=d,
        x="max attention",
        y=column,
        hue="variant",
        cut=0,
        density_norm="width",
        inner="quartile",
        ax=ax,
        order=MAX_ATTENTION_LABELS,
    )
    counts = d.groupby("max attention", observed=False).size()
    ax.set_xticks(
        range(len(MAX_ATTENTION_LABELS)),
        [f"{lab}\n(n={counts.get(lab, 0)})" for lab in MAX_ATTENTION_LABELS],
    )
    ax.set(title=title, xlabel="maximum attention weight of the step", ylabel=ylabel)
    ax.legend(title="model", fontsize=8)
    fig.tight_layout()
    return fig


def permutation_by_max_attention(steps: pd.DataFrame) -> Figure:
    """Median output TVD under 100 permutations, by max-attention bin (Jain & Wallace 2019, fig. 3)."""
    return _by_max_attention(
        steps,
        "permutation_median_tvd",
        "median output TVD (0–1)",
        "Permuting attention: output change per decoder step",
    )


def adversarial_by_max_attention(steps: pd.DataFrame) -> Figure:
    """Max JSD of an adversarial attention within ε of the output, by max-attention bin (J&W 2019, fig. 5)."""
    return _by_max_attention(
        steps,
        "adversarial_max_jsd",
        "max attention JSD within ε (nats, ≤ ln 2)",
        "Adversarial attention: how different can attention be for the same output",
    )


def kendall_tau(steps: pd.DataFrame) -> Figure:
    """Distributions of Kendall τ-b: attention–gradient, attention–LOO, gradient–LOO (J&W 2019, fig. 2)."""
    fig, ax = _subplots(figsize=(8, 4.5))
    cols = [c for c in TAU_COLUMNS if c in steps.columns]
    d = (
        steps.melt(id_vars=["variant"], value_vars=cols, var_name="pair", value_name="tau").dropna()
        if cols
        else None
    )
    if d is None or d.empty:
        _note(ax, "no defined Kendall τ (importance not run, or constant attention)")
        return fig
    d["pair"] = d["pair"].map(TAU_COLUMNS)
    sns.boxplot(data=d, x="pair", y="tau", hue="variant", ax=ax, fliersize=1)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set(
        title="Agreement of importance measures per decoder step",
        xlabel="",
        ylabel="Kendall τ-b",
        ylim=(-1.05, 1.05),
    )
    ax.legend(title="model", fontsize=8)
    fig.tight_layout()
    return fig


def erasure_fractions(steps: pd.DataFrame) -> Figure:
    """Fraction of positions and of attention mass erased before the argmax flips, per ranking
    (Serrano & Smith 2019, fig. 4)."""
    fig, axes = _subplots(1, 2, figsize=(12, 4.5))
    for ax, what, label in (
        (axes[0], "frac_positions", "fraction of source positions erased"),
        (axes[1], "frac_mass", "fraction of attention mass erased"),
    ):
        cols = [c for c in steps.columns if c.startswith("erase_") and c.endswith("_" + what)]
        d = (
            steps.melt(
                id_vars=["variant"], value_vars=cols, var_name="ranking", value_name="value"
            ).dropna()
            if cols
            else None
        )
        if d is None or d.empty:
            _note(ax, "no erasure results (no attention, or never flipped)")
            continue
        d["ranking"] = (
            d["ranking"]
            .str.removeprefix("erase_")
            .str.removesuffix("_" + what)
            .str.replace("_", " ")
        )
        sns.barplot(data=d, x="ranking", y="value", hue="variant", ax=ax, errorbar=("ci", 95))
        ax.set(
            title=f"Erase until the decision flips: {label.split(' erased')[0].replace('fraction of ', '')}",
            xlabel="erasure order",
            ylabel=f"{label} (0–1)",
            ylim=(0, 1.05),
        )
        ax.tick_params(axis="x", rotation=20)
        ax.legend(title="model", fontsize=8)
    fig.tight_layout()
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


def alignment_vs_ablation(steps: pd.DataFrame) -> Figure:
    """Per sentence: attention mass on gold links against permutation TVD and adversarial JSD,
    one colour per model, with Kendall τ-b and its p-value printed on each panel."""
    fig, axes = _subplots(1, 2, figsize=(12, 4.8))
    d = per_example_alignment(steps) if len(steps) else pd.DataFrame()
    for ax, col, label in (
        (axes[0], "permutation_tvd", "mean permutation TVD (0–1)"),
        (axes[1], "adversarial_jsd", "mean adversarial max JSD (nats)"),
    ):
        sub = d.dropna(subset=["gold_mass", col]) if len(d) else d
        if sub is None or len(sub) == 0:
            _note(
                ax,
                "no gold alignments for these tasks"
                if len(d) == 0
                else "ablation not run on the models with gold alignments",
            )
            continue
        sns.scatterplot(data=sub, x="gold_mass", y=col, hue="variant", ax=ax, s=18, alpha=0.7)
        lines = []
        for variant, g in sub.groupby("variant"):
            if len(g) >= 3 and g["gold_mass"].nunique() > 1 and g[col].nunique() > 1:
                res = stats.kendalltau(g["gold_mass"], g[col])
                lines.append(
                    f"{variant}: τ = {res.statistic:.2f} (p = {res.pvalue:.2g}, n = {len(g)})"
                )
            else:
                lines.append(f"{variant}: τ undefined (n = {len(g)})")
        ax.text(
            0.02,
            0.98,
            "\n".join(lines),
            transform=ax.transAxes,
            va="top",
            fontsize=8,
            bbox=dict(boxstyle="round", fc="white", alpha=0.8),
        )
        ax.set(
            title="Alignment against ablation (per sentence)",
            xlabel="attention mass on gold links (0–1)",
            ylabel=label,
        )
        ax.legend(title="model", fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def attention_heatmaps(examples: list[dict]) -> Figure:
    """Original attention beside the most different adversarial attention that keeps the output.

    Args:
        examples: dicts with ``title``, ``source`` (T_x tokens), ``target`` (T_y tokens),
            ``attention`` (T_y × T_x), optional ``adversarial`` (T_y × T_x, NaN rows where none was
            found) and ``gold`` (list of (source, target) links, drawn as white boxes).
    """
    n = max(len(examples), 1)
    fig, axes = _subplots(n, 2, figsize=(12, 3.6 * n), squeeze=False)
    if not examples:
        _note(axes[0, 0], "no attention to show")
        axes[0, 1].axis("off")
        return fig
    for row, ex in zip(axes, examples):
        for ax, key, label in (
            (row[0], "attention", "model attention"),
            (row[1], "adversarial", "adversarial attention (same output, TVD ≤ ε)"),
        ):
            mat = ex.get(key)
            if mat is not None:  # rows without an adversary (None) are drawn blank
                width = len(ex["source"])
                mat = [[np.nan] * width if r is None else r for r in mat]
            if mat is None:
                _note(ax, "no adversarial attention for this example")
                continue
            sns.heatmap(
                np.asarray(mat, dtype=float),
                vmin=0,
                vmax=1,
                cmap=HEATMAP_CMAP,
                ax=ax,
                cbar=True,
                xticklabels=ex["source"],
                yticklabels=ex["target"],
                square=False,
                cbar_kws={"label": "attention weight"},
            )
            for s, t in ex.get("gold") or []:
                ax.add_patch(Rectangle((s, t), 1, 1, fill=False, ec="white", lw=1.5))
            ax.set_title(f"{ex['title']}\n{label}", fontsize=9)
            ax.set(xlabel="source token", ylabel="target token (step)")
            ax.tick_params(axis="y", rotation=0)
    fig.tight_layout()
    return fig


def seed_variance(df: pd.DataFrame) -> Figure:
    """Attention JSD between seeds against output TVD between seeds (Wiegreffe & Pinter 2019, fig. 3).

    Args:
        df: columns ``variant``, ``seed_variance_attention_jsd`` (nats), ``seed_variance_output_tvd``
            (0–1), as from :func:`attnstudy.analysis.seed_variance.seed_variance`.
    """
    fig, ax = _subplots(figsize=(6.5, 4.5))
    df = df.rename(
        columns={
            "seed_variance_attention_jsd": "attention_jsd",
            "seed_variance_output_tvd": "output_tvd",
        }
    )
    if not _has(df, "attention_jsd", "output_tvd"):
        _note(ax, "one seed per configuration: no seed variance to show")
        return fig
    sns.scatterplot(
        data=df, x="attention_jsd", y="output_tvd", hue="variant", s=12, alpha=0.6, ax=ax
    )
    ax.set(
        title="Seed variance: attention vs output difference",
        xlabel=f"attention JSD between seeds (nats, ≤ {math.log(2):.2f})",
        ylabel="output TVD between seeds (0–1)",
    )
    fig.tight_layout()
    return fig
