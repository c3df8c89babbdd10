"""Heatmaps of single examples: a model's best, median and worst example with attention, its
adversary, gradient and leave-one-out importance and gold links (:func:`example_heatmaps`), and
the heatmap records of earlier versions (:func:`attention_heatmaps`)."""

from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from .base import FONT, HEATMAP_CMAP, IMPORTANCE_CMAP, _note, _subplots, visible_tokens

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


ROW_LABEL_PT = FONT - 2
"""Type size of an example's row labels and its label (points)."""
LABEL_CHARS = 24
"""An example's label is wrapped to lines of at most this many characters."""


def _prefix_text(rec: dict) -> str:
    return (
        "rows: the model's own prediction (greedy prefix)"
        if rec.get("prefix") == "greedy"
        else "rows: the reference (teacher-forced)"
    )


def _example_label(rec: dict, pick: dict, *, with_prefix: bool) -> str:
    """An example's y-axis label: its id, which pick it is (``best by tau attn loo = 0.25``), and
    the prefix its rows are when the examples differ in it; wrapped to :data:`LABEL_CHARS`."""
    which = (
        f" — {pick['rank']} by {pick['criterion'].replace('_', ' ')} = {pick['value']:.2f}"
        if pick
        else ""
    )
    lines = textwrap.wrap(f"{rec['id']}{which}", LABEL_CHARS, break_on_hyphens=False)
    if with_prefix:
        lines += textwrap.wrap(_prefix_text(rec), LABEL_CHARS)
    return "\n".join(lines)


def _label_height(label: str) -> float:
    """Inches a vertical label of :data:`ROW_LABEL_PT` type needs along its axis (about 0.6 em
    a character, its longest line) plus a margin."""
    longest = max((len(x) for x in label.split("\n")), default=0)
    return longest * 0.62 * ROW_LABEL_PT / 72 + 0.15


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
    # every source token is labelled (the figure widens with the source: example_heatmaps);
    # upright only where the labels fit side by side (about 24 characters across a panel)
    rotate = len(xt) > 14 or max(map(len, xt), default=0) * len(xt) > 24
    ax.set_xticks(range(len(xt)), xt, fontsize=FONT - 2, rotation=90 if rotate else 0)
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
    For subword tokens (records with ``reference_words``) the last panel is the grid the alignment
    ablation scores, source words × target words, with the gold links between words.

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
    cols = _columns(records, eps)
    steps = [max(len(r["rows"]), len(r.get("reference_rows", []))) for r in records]
    longest = max(len(r["source"]) for r in records)
    # wide enough for every source token's label side by side (about 0.13 in each, vertical)
    width = max(11.0, len(cols) * (0.13 * longest + 0.7))
    prefixes = {r.get("prefix") == "greedy" for r in records}
    ylabels = [
        _example_label(rec, (shown or [{}] * len(records))[i], with_prefix=len(prefixes) > 1)
        for i, rec in enumerate(records)
    ]
    # each example's panels as tall as its rows' tick labels and its own (vertical) label need,
    # so a short example's label does not run into the next example's
    heights = [
        max(0.28 * h, h * ROW_LABEL_PT * 1.5 / 72, _label_height(label))
        for h, label in zip(steps, ylabels)
    ]
    fig = Figure(figsize=(width, 1.0 + sum(h + 0.9 for h in heights)), layout="constrained")
    axes = fig.subplots(len(records), len(cols), squeeze=False, height_ratios=heights)
    last = None
    for i, rec in enumerate(records):
        src = visible_tokens(rec["source"])
        for j, (key, label) in enumerate(cols):
            ax = axes[i, j]
            im = _panel(ax, rec, key, src, row_labels=_row_labels(rec) if j == 0 else [])
            if im is None:
                continue
            if key not in ("gradient", "loo"):
                last = im
            if j > 0 and key != "reference_attention":
                ax.set_yticks(range(len(rec["rows"])), [""] * len(rec["rows"]))
            if i == 0:
                ax.set_title(label, fontsize=FONT - 1)
            if i == len(records) - 1:
                words = key == "reference_attention" and "reference_words" in rec
                ax.set_xlabel("source word" if words else "source token", fontsize=FONT - 2)
        axes[i, 0].set_ylabel(ylabels[i], fontsize=ROW_LABEL_PT)
    if last is not None:
        fig.colorbar(
            last,
            ax=axes[:, 0].tolist(),
            location="left",
            shrink=0.6,
            label="attention weight",
            pad=0.1,
        )
    _legend(fig, records, one_prefix=len(prefixes) == 1)
    fig.suptitle(title)
    return fig


def _columns(records: list[dict], eps: float | None) -> list[tuple[str, str]]:
    """The panels the records have: (key, two-line title)."""
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
        words = all("reference_words" in r for r in records if "gold" in r)
        cols.append(
            (
                "reference_attention",
                "attention on the reference\nbetween words, gold links"
                if words
                else "attention on the reference\nwith gold links",
            )
        )
    return cols


def _panel(ax, rec: dict, key: str, src: list[str], *, row_labels: list[str]):
    """One example's panel ``key`` (attention, adversarial, gradient, leave-one-out, attention on
    the reference); returns its image, or None where the record has no such matrix (noted)."""
    if key == "attention":
        layer = rec.get("layer", 0)
        mat = rec["attention"][layer if layer < len(rec["attention"]) else -1]
    else:
        mat = rec.get(key)
    if mat is None:
        _note(ax, "not run" if key != "reference_attention" else "no gold links")
        return None
    if key in ("gradient", "loo"):
        arr = np.array([[np.nan if v is None else v for v in r] for r in mat], float)
        with np.errstate(invalid="ignore", divide="ignore"):
            arr = arr / np.nanmax(np.where(np.isfinite(arr), arr, np.nan), 1, keepdims=True)
        mat = arr.tolist()
        im = _draw(ax, mat, src, row_labels, IMPORTANCE_CMAP)
    elif key == "reference_attention" and "reference_words" in rec:
        # subword tokens: the word grid the alignment ablation scores, gold word links
        words = rec["reference_words"]
        im = _draw(
            ax,
            words["attention"],
            visible_tokens(words["source"]),
            visible_tokens(words["rows"]),
            HEATMAP_CMAP,
            gold=words["gold"],
        )
    elif key == "reference_attention":
        im = _draw(
            ax,
            mat,
            src,
            visible_tokens(rec["reference_rows"]),
            HEATMAP_CMAP,
            gold=rec.get("gold"),
        )
    else:
        im = _draw(ax, mat, src, row_labels, HEATMAP_CMAP)
    return im


def _legend(fig: Figure, records: list[dict], *, one_prefix: bool) -> None:
    """The legend under the panels: gold links' boxes, the prefix (when every example has the
    same), what the marks and blank rows mean."""
    handles = []
    if any("gold" in r for r in records):
        handles = [
            Line2D([], [], color="0.2", lw=1.6, label="sure gold link (white box)"),
            Line2D([], [], color="0.2", lw=1.6, ls="--", label="possible gold link (dashed box)"),
        ]
    if one_prefix:  # said once for every example
        handles.append(Patch(color="none", label=_prefix_text(records[0])))
    handles.append(
        Patch(
            color="none",
            label="␣ = space; ⟨U+…⟩ = an invisible character; ≠ : prediction differs from the "
            "reference (– : past its end)",
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
