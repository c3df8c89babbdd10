"""Run the configured ablation battery on one model → tidy per-step table + summary metrics.

Batches are prepared and consumed one at a time (:func:`analysis.common.prepare_batches`), so
memory stays flat in the number of examples. Prefix policy (DESIGN.md §4): ``cfg.prefix`` for
permutation, uniform, erasure, adversarial and importance; the reference for alignment (gold
links index the reference target). When both prefixes are in use the table holds both sets of
steps, told apart by the ``prefix`` column. The summary holds micro-averages over steps (sums
over steps / number of defined steps) with 95 % bootstrap intervals that resample EXAMPLES
(:func:`scipy.stats.bootstrap`, percentile method, seeded by ``cfg.seed``); undefined values are
left out and counted, so no NaN/inf reaches the summary (MLflow rejects them).
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats
from tqdm.auto import tqdm

from attnstudy.config import AblationConfig
from attnstudy.data.tasks import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import Seq2Seq, eval_mode

from .common import base_table, prepare_batches
from .erasure import RANKINGS

METRIC_NAME = re.compile(r"^[A-Za-z0-9_/.\-]+$")
KEYS = ["example_id", "prefix", "step"]


@dataclass
class SuiteResult:
    """Output of :func:`run_suite`.

    Attributes:
        table: one row per real decoder step (``example_id``, ``prefix``, ``step``, the
            :func:`analysis.common.base_table` columns, then every per-step ablation's columns).
        examples: one row per example (``example_id`` and the per-example ablations, e.g.
            global permutation).
        summary: ``ablation/<name>/<stat>`` → finite float (with ``_ci_low``/``_ci_high``,
            ``n_steps``, ``n_undefined``, ``n_skipped``).
        skipped: ablation → reason it did not run.
    """

    table: pd.DataFrame
    examples: pd.DataFrame
    summary: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Spec:
    module: str
    function: str
    per_example: bool = False
    needs_attention: bool = True
    reference_only: bool = False

    def load(self) -> Callable:
        return getattr(importlib.import_module(f".{self.module}", __package__), self.function)


SPECS: dict[str, _Spec] = {
    "permutation": _Spec("permutation", "run_permutation"),
    "permutation_global": _Spec("permutation", "run_permutation_global", per_example=True),
    "uniform": _Spec("permutation", "run_uniform"),
    "erase_max": _Spec("erasure", "run_erase_max"),
    "erase_until_flip": _Spec("erasure", "run_erase_until_flip"),
    "adversarial": _Spec("adversarial", "run_adversarial"),
    "importance": _Spec("importance", "run_importance", needs_attention=False),
    "alignment": _Spec("alignment", "run_alignment", reference_only=True),
}
"""Ablation name → where its function lives and how it is scheduled (modules imported lazily)."""

# summary stat → table column (micro-average over steps)
STATS: dict[str, dict[str, str]] = {
    "permutation": {"flip_rate": "permutation_flip_rate", "median_tvd": "permutation_median_tvd"},
    "permutation_global": {
        "changed_rate": "permutation_global_changed",
        "edit_distance": "permutation_global_edit_distance",
        "exact_match_original": "permutation_global_exact_original",
        "exact_match_permuted": "permutation_global_exact_permuted",
    },
    "uniform": {"flip_rate": "uniform_flip", "tvd": "uniform_tvd"},
    "erase_max": {"flip_rate": "erase_max_flip", "tvd": "erase_max_tvd"},
    "erase_until_flip": {f"{r}_{s}": f"erase_{r}_{s}" for r in RANKINGS
                         for s in ("frac_positions", "frac_mass", "never_flipped")},
    "adversarial": {"max_jsd": "adversarial_max_jsd", "found_rate": "adversarial_found"},
    "importance": {"tau_attn_grad": "importance_tau_attn_grad", "tau_attn_loo": "importance_tau_attn_loo",
                   "tau_grad_loo": "importance_tau_grad_loo"},
    "alignment": {"gold_mass": "alignment_gold_mass", "argmax_on_gold": "alignment_argmax_on_gold"},
}
SKIP_COLUMN = {"erase_until_flip": "erase_until_flip_skipped"}


def run_suite(model: Seq2Seq, examples: Sequence[Example], src_vocab: Vocab, tgt_vocab: Vocab,
              cfg: AblationConfig, progress: bool = True, batch_size: int = 32) -> SuiteResult:
    """Run ``cfg.ablations`` on the first ``cfg.n_examples`` examples.

    Args:
        model: the model; runs in eval mode, its previous mode is restored.
        examples: test examples (only the first ``cfg.n_examples`` are used).
        src_vocab, tgt_vocab: the model's vocabularies.
        cfg: which ablations and their settings.
        progress: show one tqdm bar per ablation.
        batch_size: examples per prepared batch (results do not depend on it).

    Returns:
        :class:`SuiteResult`. The ``none`` model skips every attention-based ablation (reason in
        ``skipped``); an ablation whose module is not installed is skipped likewise.

    Raises:
        ValueError: for an empty example list or an unknown ablation name.
    """
    examples = list(examples)[: cfg.n_examples]
    if not examples:
        raise ValueError("run_suite needs at least one example")
    skipped: dict[str, str] = {}
    active: dict[str, Callable] = {}
    for name in dict.fromkeys(cfg.ablations):
        if name not in SPECS:
            raise ValueError(f"unknown ablation {name!r}; valid: {', '.join(SPECS)}")
        spec = SPECS[name]
        if spec.needs_attention and not model.has_attention:
            skipped[name] = "the model has no attention (attention = 'none')"
            continue
        try:
            active[name] = spec.load()
        except (ImportError, AttributeError) as err:
            skipped[name] = f"not available: {err}"
    groups: dict[str, list[str]] = {cfg.prefix: []}
    for name in active:
        groups.setdefault("reference" if SPECS[name].reference_only else cfg.prefix, []).append(name)
    prefix_of = {n: p for p, names in groups.items() for n in names}

    bars = {n: tqdm(total=len(examples), desc=f"ablation {n}", disable=not progress, position=i, leave=True)
            for i, n in enumerate(active)}
    base_parts: list[pd.DataFrame] = []
    parts: dict[str, list[pd.DataFrame]] = {n: [] for n in active}
    try:
        with eval_mode(model):
            for prefix, names in groups.items():
                if not names and prefix != cfg.prefix:
                    continue
                for batch in prepare_batches(model, examples, src_vocab, tgt_vocab, prefix, batch_size):
                    base = base_table(batch)
                    base.insert(1, "prefix", prefix)
                    base_parts.append(base)
                    for name in names:
                        parts[name].append(active[name](model, batch, cfg))
                        bars[name].update(len(batch.examples))
    finally:
        for bar in bars.values():
            bar.close()

    table = pd.concat(base_parts, ignore_index=True)
    per_example = pd.DataFrame({"example_id": [ex.id for ex in examples]})
    for name in active:
        frame = pd.concat(parts[name], ignore_index=True)
        if SPECS[name].per_example:
            per_example = per_example.merge(frame, on="example_id", how="left", validate="one_to_one")
        else:
            frame.insert(1, "prefix", prefix_of[name])
            table = table.merge(frame, on=KEYS, how="left", validate="one_to_one")
    summary = summarize(table, per_example, list(active), prefix_of, cfg)
    return SuiteResult(table, per_example, summary, skipped)


# ----------------------------------------------------------------------------- summary


def ratio_with_ci(num: pd.Series, den: pd.Series, groups: pd.Series, cfg: AblationConfig,
                  transform: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[float, float, float] | None:
    """Σ num / Σ den with a 95 % bootstrap interval resampling groups (examples).

    Args:
        num, den: per-row numerator and denominator (e.g. value and 1 for a micro-average).
        groups: per-row example id; rows of one example are resampled together.
        cfg: ``bootstrap_resamples`` and ``seed``.
        transform: optional map applied to the ratio (e.g. ``1 − r`` for AER).

    Returns:
        (value, ci_low, ci_high); the interval is (nan, nan) with fewer than two contributing
        examples; None if Σ den = 0 (undefined).
    """
    sums = pd.DataFrame({"n": num.to_numpy(float), "d": den.to_numpy(float), "g": groups.to_numpy()}
                        ).groupby("g", sort=False)[["n", "d"]].sum()
    sums = sums[sums["d"] > 0]
    if sums.empty:
        return None
    f = transform or (lambda r: r)
    n, d = sums["n"].to_numpy(), sums["d"].to_numpy()
    value = float(f(np.asarray(n.sum() / d.sum())))
    if len(n) < 2:
        return value, math.nan, math.nan
    res = stats.bootstrap((n, d), lambda a, b, axis: f(a.sum(axis) / b.sum(axis)), paired=True,
                          vectorized=True, n_resamples=cfg.bootstrap_resamples, method="percentile",
                          confidence_level=0.95, rng=np.random.default_rng(cfg.seed))
    return value, float(res.confidence_interval.low), float(res.confidence_interval.high)


def _put(out: dict[str, float], key: str, result: tuple[float, float, float] | None) -> None:
    if result is None:
        return
    value, low, high = result
    out[key] = value
    if math.isfinite(low) and math.isfinite(high):
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = low, high


def summarize(table: pd.DataFrame, per_example: pd.DataFrame, names: Sequence[str],
              prefix_of: dict[str, str], cfg: AblationConfig) -> dict[str, float]:
    """Summary metrics ``ablation/<name>/<stat>`` of a suite's tables (see module docstring).

    Raises:
        ValueError: if a metric name has a character MLflow rejects (a bug, never user input).
    """
    out: dict[str, float] = {}
    for name in names:
        stats_of = {s: c for s, c in STATS.get(name, {}).items()
                    if c in (per_example if SPECS[name].per_example else table).columns}
        key = f"ablation/{name}"
        if SPECS[name].per_example:
            rows = per_example
            out[f"{key}/n_examples"] = float(len(rows))
        else:
            rows = table[table["prefix"] == prefix_of[name]]
            out[f"{key}/n_steps"] = float(len(rows))
        skip_col = SKIP_COLUMN.get(name, f"{name}_skipped")
        skipped = rows[skip_col].fillna(False).astype(bool) if skip_col in rows.columns else pd.Series(False, index=rows.index)
        out[f"{key}/n_skipped"] = float(skipped.sum())
        if stats_of:
            undefined = rows[list(stats_of.values())].isna().any(axis=1) & ~skipped
            out[f"{key}/n_undefined"] = float(undefined.sum())
        for stat, col in stats_of.items():
            values = rows[col].astype(float)
            ok = values.notna()
            _put(out, f"{key}/{stat}", ratio_with_ci(values[ok], pd.Series(1.0, index=values[ok].index),
                                                     rows["example_id"][ok], cfg))
        if name == "permutation" and "permutation_n_identity" in rows.columns:
            out[f"{key}/n_identity"] = float(rows["permutation_n_identity"].fillna(0).sum())
        if name == "permutation_global" and {"permutation_global_exact_original",
                                             "permutation_global_exact_permuted"} <= set(rows.columns):
            drop = rows["permutation_global_exact_original"].astype(float) - rows["permutation_global_exact_permuted"].astype(float)
            _put(out, f"{key}/exact_match_drop",
                 ratio_with_ci(drop, pd.Series(1.0, index=rows.index), rows["example_id"], cfg))
        if name == "alignment":
            _alignment_summary(out, rows, cfg)
    for k, v in list(out.items()):
        if not METRIC_NAME.match(k):
            raise ValueError(f"metric name {k!r} has characters MLflow rejects")
        if not math.isfinite(v):
            del out[k]
    return out


def _alignment_summary(out: dict[str, float], rows: pd.DataFrame, cfg: AblationConfig) -> None:
    """Corpus AER from summed counts (Och & Ney 2003), overall and per head."""
    ok = rows["alignment_n_sure"].notna()
    r = rows[ok]
    heads = sorted({int(m.group(1)) for c in rows.columns if (m := re.match(r"alignment_head(\d+)_n_hyp$", c))})
    for label, prefix in [("aer", "alignment_")] + [(f"aer_head{h}", f"alignment_head{h}_") for h in heads]:
        num = r[f"{prefix}n_hyp_sure"] + r[f"{prefix}n_hyp_possible"]
        den = r[f"{prefix}n_hyp"] + r["alignment_n_sure"]
        _put(out, f"ablation/alignment/{label}", ratio_with_ci(num, den, r["example_id"], cfg, lambda x: 1.0 - x))
