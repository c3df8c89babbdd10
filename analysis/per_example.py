"""Per-example summaries of a suite's tidy tables, and the choice of examples to show.

Pure pandas (no torch): the example browser lists every analysed example with the per-example
columns the catalogue's entries declare (:func:`attnstudy.analysis.catalogue.example_columns`),
the report picks its heatmap examples with :func:`pick_shown`, and both say which criterion they
use.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import catalogue

SHOW_CRITERION = "tau_attn_loo"
"""What orders examples for the report's heatmaps: the example's mean Kendall τ between attention
and leave-one-out importance (its steps' mean), best = highest agreement."""


def analysis_rows(steps: pd.DataFrame, analysis_prefix: str | None = None) -> pd.DataFrame:
    """The rows of the analysis prefix (the suite also holds reference-prefix rows for alignment)."""
    if steps.empty or "prefix" not in steps.columns:
        return steps
    prefix = analysis_prefix or (
        "greedy" if (steps["prefix"] == "greedy").any() else steps["prefix"].iloc[0]
    )
    return steps[steps["prefix"] == prefix]


def per_example_summary(
    steps: pd.DataFrame,
    examples: pd.DataFrame | None = None,
    analysis_prefix: str | None = None,
) -> pd.DataFrame:
    """One row per analysed example (and unit): its decoder steps and the per-example columns the
    catalogue declares (:func:`attnstudy.analysis.catalogue.example_columns`) that the tables
    hold.

    Args:
        steps: a suite's per-step table (``example_id``, ``prefix``, ``step``, ``layer`` and the
            ablation columns); a step ablation's columns are read on the analysis prefix's rows,
            or on the reference's for an ablation with the reference prefix (alignment).
        examples: the suite's per-example table (the per-example ablations' columns), optional.
        analysis_prefix: ``greedy`` or ``reference`` (default: greedy if present).

    Returns:
        Columns ``example_id``, ``layer``, ``head`` (when the table has it), ``n_steps``
        (analysis-prefix steps, ``<eos>`` included), then each listed
        :class:`~attnstudy.analysis.example_spec.ExampleColumn` whose columns are there, under
        its ``key``, in the catalogue's order: a mean over the example's rows where defined, a
        ratio of its sums (NaN where the denominator sums to 0, e.g. AER without gold links), or
        a per-example ablation's value; NaN where the example has none.
    """
    if steps is None or steps.empty:
        return pd.DataFrame(columns=["example_id", "layer", "n_steps"])
    steps = steps if "layer" in steps.columns else steps.assign(layer=0)
    # one row per analysed unit: a layer (all heads jointly, head −1) or one head of it
    keys = ["example_id", "layer"] + (["head"] if "head" in steps.columns else [])
    rows = analysis_rows(steps, analysis_prefix)
    reference = (
        steps[steps["prefix"] == "reference"] if "prefix" in steps.columns else steps.iloc[:0]
    )
    out = rows.groupby(keys, sort=False).size().rename("n_steps").reset_index()
    for spec, col in catalogue.example_columns():
        if not col.listed:
            continue
        if spec.unit == "example":
            if examples is None or not len(examples) or col.column not in examples:
                continue
            on = ["example_id"] + [k for k in ("layer", "head") if k in examples and k in out]
            values = examples[on].assign(**{col.key: examples[col.column].astype(float)})
            out = out.merge(values, on=on, how="left", validate="many_to_one")
            continue
        source = reference if spec.prefix == "reference" else rows
        if not len(source) or not set(col.columns) <= set(source.columns):
            continue
        g = source.groupby(keys, sort=False)
        if col.column is not None:
            value = g[col.column].agg(lambda s: s.astype(float).mean())
        else:
            num = sum(g[c].sum() for c in col.num)
            den = sum(g[c].sum() for c in col.den)
            value = (num / den.where(den > 0)).astype(float)
            value = 1.0 - value if col.complement else value
        out = out.merge(value.rename(col.key).reset_index(), on=keys, how="left")
    return out


def pick_shown(summary: pd.DataFrame, n: int = 3, criterion: str = SHOW_CRITERION) -> list[dict]:
    """The examples a report shows: best, median and worst by ``criterion`` (higher = better).

    Falls back to the number of steps (longest, median, shortest) when no example defines the
    criterion (a model without attention or without the importance ablation).

    Returns:
        Up to ``n`` dicts ``{"example_id", "rank": "best"|"median"|"worst", "criterion",
        "value"}``, distinct examples, in that order.
    """
    if summary.empty:
        return []
    crit = criterion if criterion in summary and summary[criterion].notna().any() else "n_steps"
    # one row per example: the layer mean of the criterion
    per = summary.groupby("example_id", sort=False)[crit].mean().dropna()
    if per.empty:
        return []
    ordered = per.sort_values(ascending=False, kind="stable")
    picks = [("best", 0), ("median", len(ordered) // 2), ("worst", len(ordered) - 1)]
    out, seen = [], set()
    for rank, i in picks[:n]:
        ex = ordered.index[i]
        if ex in seen:
            continue
        seen.add(ex)
        out.append(
            {"example_id": ex, "rank": rank, "criterion": crit, "value": float(ordered.iloc[i])}
        )
    return out


def finite_or_none(value) -> float | None:
    """A JSON-ready number: None for NaN/inf/None."""
    if value is None:
        return None
    v = float(value)
    return v if np.isfinite(v) else None


def gold_mass_by_offset(
    records: list[dict], offsets: tuple[int, ...] = (-1, 0, 1)
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Attention mass on the gold links moved by ``k`` source positions, per example.

    For each target token t with possible gold links P_t (reference prefix, ``<eos>`` excluded),
    m_t(k) = Σ_{s ∈ P_t, 0 ≤ s+k < T_x} α_{t, s+k}; k = 0 is the gold mass of the alignment
    ablation. A model whose attention sits one position off (typical of a Bahdanau-flow decoder,
    whose query s_{t−1} precedes the emitted token) has m(+1) or m(−1) far above m(0).

    Args:
        records: from :func:`attnstudy.analysis.heatmaps.example_records` (those with ``gold``).
        offsets: the shifts k.

    Returns:
        k → (Σ_t m_t(k) per example, number of linked target tokens per example), arrays aligned
        on the records with gold links; empty without any.
    """
    sums = {k: [] for k in offsets}
    counts = []
    for rec in records:
        if not rec.get("gold") or "reference_attention" not in rec:
            continue
        att = np.array(
            [[np.nan if v is None else v for v in row] for row in rec["reference_attention"]],
            dtype=float,
        )
        n_src = att.shape[1]
        links: dict[int, set[int]] = {}
        for s, t, _ in rec["gold"]:
            links.setdefault(t, set()).add(s)
        rows = [t for t in links if t < att.shape[0] and rec["reference_rows"][t] != "<eos>"]
        counts.append(float(len(rows)))
        for k in offsets:
            sums[k].append(
                float(sum(att[t, s + k] for t in rows for s in links[t] if 0 <= s + k < n_src))
            )
    if not counts:
        return {}
    return {k: (np.array(v), np.array(counts)) for k, v in sums.items()}
