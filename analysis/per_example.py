"""Per-example summaries of a suite's tidy tables, and the choice of examples to show.

Pure pandas (no torch): the example browser lists every analysed example with these columns, the
report picks its heatmap examples with :func:`pick_shown`, and both say which criterion they use.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MEANS = {
    "permutation_flip_rate": "perm_flip",
    "permutation_median_tvd": "perm_tvd",
    "uniform_flip": "uniform_flip",
    "uniform_tvd": "uniform_tvd",
    "erase_max_flip": "erase_max_flip",
    "adversarial_max_jsd": "adv_jsd",
    "adversarial_found": "adv_found",
    "importance_tau_attn_grad": "tau_attn_grad",
    "importance_tau_attn_loo": "tau_attn_loo",
    "importance_tau_grad_loo": "tau_grad_loo",
}
"""Per-step column → per-example mean column (over the steps where it is defined)."""

LABELS = {
    "n_steps": "steps",
    "perm_flip": "permutation flip rate",
    "perm_tvd": "permutation median TVD",
    "uniform_flip": "uniform flip",
    "uniform_tvd": "uniform TVD",
    "erase_max_flip": "erase-max flip",
    "adv_jsd": "adversarial max JSD",
    "adv_found": "adversary found",
    "tau_attn_grad": "τ attn–grad",
    "tau_attn_loo": "τ attn–LOO",
    "tau_grad_loo": "τ grad–LOO",
    "gold_mass": "gold mass",
    "aer": "AER",
    "global_changed": "global permutation changed output",
    "global_edit_distance": "global permutation edit distance",
}

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
    """One row per analysed example (and layer): means over its steps, its AER and gold mass.

    Args:
        steps: a suite's per-step table (``example_id``, ``prefix``, ``step``, ``layer`` and the
            ablation columns); the analysis prefix's rows give the ablation means, the reference
            rows (alignment) the gold mass and AER.
        examples: the suite's per-example table (global permutation), optional.
        analysis_prefix: ``greedy`` or ``reference`` (default: greedy if present).

    Returns:
        Columns ``example_id``, ``layer``, ``head`` (when the table has it), ``n_steps`` (analysis-prefix steps, ``<eos>``
        included), the means of :data:`MEANS` present (NaN where no step defines them), ``gold_mass``
        (mean over linked target tokens), ``aer`` (the example's own AER, Och & Ney 2003 eq. 7, from
        its summed counts; NaN without gold links), ``global_changed`` and
        ``global_edit_distance`` (global permutation), in the order of first appearance.
    """
    if steps is None or steps.empty:
        return pd.DataFrame(columns=["example_id", "layer", "n_steps"])
    steps = steps if "layer" in steps.columns else steps.assign(layer=0)
    # one row per analysed unit: a layer (all heads jointly, head −1) or one head of it
    keys = ["example_id", "layer"] + (["head"] if "head" in steps.columns else [])
    rows = analysis_rows(steps, analysis_prefix)
    out = rows.groupby(keys, sort=False).size().rename("n_steps").reset_index()
    cols = {c: name for c, name in MEANS.items() if c in rows.columns}
    if cols:
        means = rows.groupby(keys, sort=False)[list(cols)].agg(lambda s: s.astype(float).mean())
        out = out.merge(means.rename(columns=cols).reset_index(), on=keys, how="left")
    if "alignment_n_hyp" in steps.columns:
        ref = steps[(steps["prefix"] == "reference") & steps["alignment_n_sure"].notna()]
        if len(ref):
            g = ref.groupby(keys, sort=False)
            num = g["alignment_n_hyp_sure"].sum() + g["alignment_n_hyp_possible"].sum()
            den = g["alignment_n_hyp"].sum() + g["alignment_n_sure"].sum()
            align = pd.DataFrame(
                {
                    "gold_mass": g["alignment_gold_mass"].mean(),
                    "aer": (1.0 - num / den.where(den > 0)).astype(float),
                }
            ).reset_index()
            out = out.merge(align, on=keys, how="left")
    if examples is not None and len(examples) and "permutation_global_changed" in examples:
        on = ["example_id"] + [k for k in ("layer", "head") if k in examples and k in out]
        glob = examples[on].assign(
            global_changed=examples["permutation_global_changed"].astype(float),
            global_edit_distance=examples["permutation_global_edit_distance"].astype(float),
        )
        out = out.merge(glob, on=on, how="left", validate="many_to_one")
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
