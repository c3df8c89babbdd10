"""A model against other models: the seed variance of one configuration (:func:`seed_variance`)
and the trained, model-consistent adversaries beside the per-instance one
(:func:`trained_adversaries`)."""

from __future__ import annotations

import math

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from .base import _has, _note, _order, _subplots, variant_palette


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
