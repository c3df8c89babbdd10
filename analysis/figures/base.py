"""What every figure shares: the constants (bins, colour maps, :data:`MIN_N`, labels of the
τ pairs, erasure orders and metrics), the seaborn theme, a Figure that pyplot does not keep
(:func:`_subplots`), notes in place of an empty axis, one colour per model
(:func:`variant_palette`) and its shades per layer (:func:`per_layer`), Wilson intervals, and the
models' legend under the figure (:func:`_legend_below`)."""

from __future__ import annotations

import math
import textwrap
import unicodedata

import matplotlib

matplotlib.use("Agg")
import colorsys  # noqa: E402

import matplotlib.colors as mcolors  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

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
    "token_error_rate": ("token error rate", ", lower is better"),
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


MODEL_COLOURS = (
    "#0173b2",
    "#de8f05",
    "#cc78bc",
    "#029e73",
    "#a20000",
    "#7400a2",
    "#5d5d00",
    "#b9d12e",
    "#00d1ff",
    "#949494",
    "#ff5d46",
    "#005d5d",
    "#b9005d",
)
"""The models' colours: any two differ by a CIEDE2000 colour difference of at least 23 (15 is the
requirement, tested), so 13 models stay apart in one figure. The first four are seaborn's
colour-blind blue, orange, pink and green; the rest were picked greedily from an sRGB grid (lightness
30–80, visible on white) to keep the smallest difference as large as possible."""


def variant_palette(variants) -> dict[str, tuple]:
    """One fixed colour per model, in the order given (:data:`MODEL_COLOURS`, then husl beyond 13).

    Pass the same mapping to every figure of a report so a colour means one model everywhere.
    """
    names = list(dict.fromkeys(variants))
    base = [mcolors.to_rgb(c) for c in MODEL_COLOURS]
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


def layer_label(variant: str, layer: int) -> str:
    """A model's layer as a legend names it, counted from 1 as the report's tables count layers
    (``layer`` is the stored 0-based index; −1, all layers at once: ``all layers``)."""
    return f"{variant} · " + ("all layers" if layer < 0 else f"layer {int(layer) + 1}")


def per_layer(df: pd.DataFrame, palette: dict | None = None) -> tuple[pd.DataFrame, dict]:
    """Models with several layers get one label per layer (:func:`layer_label`: ``model · layer
    l``, l from 1) and one shade of the model's colour per layer; single-layer models keep their
    name and colour."""
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
            label = layer_label(v, layer)
            palette[label] = _shade(palette.get(v, (0.3, 0.3, 0.3)), k, len(layers))
        mask = df["variant"] == v
        df.loc[mask, "variant"] = df.loc[mask].apply(
            lambda r: layer_label(r["variant"], r["layer"]), axis=1
        )
    return df, palette


NA = "n/a"
"""The mark a figure draws where a model has no value (it keeps its place on the axis)."""


def not_available(models, present) -> list[str]:
    """The ``models`` (in order) with no label among ``present``: neither their own name nor one
    of their layers' (``model · layer l``, :func:`per_layer`)."""
    present = set(present)
    return [
        m for m in models if m not in present and not any(p.startswith(f"{m} · ") for p in present)
    ]


def _mark_na(fig, model: str, labels: list[str]) -> None:
    """Record on ``fig`` (``fig.attnstudy_na``: model → labels) that it shows ``model`` as n/a for
    ``labels`` (the statistics or pairs; ``[]``: everything the figure shows), for its caption."""
    if not hasattr(fig, "attnstudy_na"):
        fig.attnstudy_na = {}
    fig.attnstudy_na.setdefault(model, [])
    fig.attnstudy_na[model] += [x for x in labels if x not in fig.attnstudy_na[model]]


def _na_text(ax, x: float, y: float, model: str, palette: dict, *, fallback: str = "0.3", **style):
    """Draw ``model``'s n/a mark at ``(x, y)`` in its palette colour (``fallback`` when it has
    none); its ``gid`` ``na:<model>`` is how captions' tests find it. ``style``: Matplotlib text
    settings (alignment, rotation, size, transform)."""
    return ax.text(x, y, NA, color=palette.get(model, fallback), gid=f"na:{model}", **style)


def _group_x(group: int, member: int, width: float) -> float:
    """x of member ``member`` of group ``group`` in seaborn's dodged layout (groups 0.8 wide)."""
    return group - 0.4 + width * (member + 0.5)


def _with_na(order: list[str], missing: list[str], palette: dict) -> list[str]:
    """``order`` with the ``missing`` models in their palette places (the rest after)."""
    rank = {v: i for i, v in enumerate(palette)}
    every = list(dict.fromkeys(order + missing))
    base = {v: v.split(" · ")[0] for v in every}
    return sorted(every, key=lambda v: (rank.get(base[v], len(rank)), every.index(v)))


def _order(df: pd.DataFrame, palette: dict) -> list[str]:
    present = set(df["variant"])
    return [v for v in palette if v in present] + sorted(present - set(palette))


def visible_tokens(tokens) -> list[str]:
    """Tick labels with every character visible: a space as ``␣``, an empty token as ``∅``, and
    an invisible or control character (Unicode categories Cf, Cc, Zl, Zp and spaces other than
    U+0020: the right-to-left mark U+200F of Arabic dates, a zero-width space, a no-break space)
    as its code point, ``⟨U+200F⟩``."""

    def char(c: str) -> str:
        if c == " ":
            return SPACE
        if unicodedata.category(c) in ("Cf", "Cc", "Zl", "Zp", "Zs"):
            return f"⟨U+{ord(c):04X}⟩"
        return c

    return ["".join(map(char, t)) if t else "∅" for t in tokens]


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
    na: set[str] | frozenset[str] = frozenset(),
) -> None:
    """The models' colours in one legend under the figure (constrained layout makes room).

    Args:
        note: how to read the figure (what the numbers are, what a hatch means); it becomes the
            legend's title, wrapped to the figure's width, so the layout keeps it clear of the
            plot and of the entries (a free-standing note would run over a legend of many rows,
            or off the figure).
        counts: model → decoder steps; each entry then says ``model (n steps)``.
        na: models of ``order`` the figure has no value for: a hollow entry ``model (n/a)``.
    """
    handles = [
        Patch(facecolor="none", edgecolor=palette[v], hatch="//", label=f"{v} (n/a)")
        if v in na
        else Patch(color=palette[v], label=f"{v} ({counts.get(v, 0)} steps)" if counts else v)
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
