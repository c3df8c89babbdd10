"""Run the configured ablation battery on one model → tidy per-step table + summary metrics.

Batches are prepared and consumed one at a time (:func:`analysis.common.prepare_batches`); each
is reduced to per-example sums of the summary statistics and its per-step rows go to a sink (a
Parquet file when ``table_path`` is given), so memory stays flat in the number of examples. Prefix policy (DESIGN.md §4): ``cfg.prefix`` for
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
import os
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats
from tqdm.auto import tqdm

from attnstudy.config import AblationConfig
from attnstudy.data.tasks import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import Seq2Seq, eval_mode
from attnstudy.signals import check_interrupt

from .common import base_table, prepare_batches
from .erasure import RANKINGS

BOOTSTRAP_ELEMENTS = 1_000_000
"""Resampled values per vectorised bootstrap call (≈ 8 MB per array), whatever the number of examples."""
METRIC_NAME = re.compile(r"^[A-Za-z0-9_/.\-]+$")
KEYS = ["example_id", "prefix", "step"]


@dataclass
class SuiteResult:
    """Output of :func:`run_suite`.

    Attributes:
        table: one row per real decoder step (``example_id``, ``prefix``, ``step``, the
            :func:`analysis.common.base_table` columns, then every per-step ablation's columns);
            None when the suite streamed it to ``table_path``.
        examples: one row per example (``example_id`` and the per-example ablations, e.g.
            global permutation).
        summary: ``ablation/<name>/<stat>`` → finite float (with ``_ci_low``/``_ci_high``,
            ``n_steps``, ``<stat>_n_undefined`` per statistic, ``n_skipped``).
        skipped: ablation → reason it did not run.
    """

    table: pd.DataFrame | None
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
    "erase_until_flip": {
        f"{r}_{s}": f"erase_{r}_{s}"
        for r in RANKINGS
        for s in ("frac_positions", "frac_mass", "never_flipped")
    },
    "adversarial": {"max_jsd": "adversarial_max_jsd", "found_rate": "adversarial_found"},
    "importance": {
        "tau_attn_grad": "importance_tau_attn_grad",
        "tau_attn_loo": "importance_tau_attn_loo",
        "tau_grad_loo": "importance_tau_grad_loo",
    },
    "alignment": {"gold_mass": "alignment_gold_mass", "argmax_on_gold": "alignment_argmax_on_gold"},
}
SKIP_COLUMN = {"erase_until_flip": "erase_until_flip_skipped"}


def run_suite(
    model: Seq2Seq,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    cfg: AblationConfig,
    progress: bool = True,
    batch_size: int = 32,
    table_path: str | Path | None = None,
) -> SuiteResult:
    """Run ``cfg.ablations`` on the first ``cfg.n_examples`` examples.

    Every prepared batch is analysed, reduced to per-example sums of the summary statistics, and
    its per-step rows handed to a sink; nothing per-step is kept across batches when
    ``table_path`` is given, so memory stays flat in the number of examples.

    Args:
        model: the model; runs in eval mode, its previous mode is restored.
        examples: test examples (only the first ``cfg.n_examples`` are used).
        src_vocab, tgt_vocab: the model's vocabularies.
        cfg: which ablations and their settings.
        progress: show one tqdm bar per ablation.
        batch_size: examples per prepared batch (results do not depend on it).
        table_path: if given, the per-step table is streamed to this Parquet file (written
            atomically at the end) and ``SuiteResult.table`` is None; otherwise it is returned.

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
        groups.setdefault("reference" if SPECS[name].reference_only else cfg.prefix, []).append(
            name
        )

    bars = {
        n: tqdm(
            total=len(examples), desc=f"ablation {n}", disable=not progress, position=i, leave=True
        )
        for i, n in enumerate(active)
    }
    sink = _StepSink(table_path)
    sums: list[pd.DataFrame] = []
    example_parts: dict[str, list[pd.DataFrame]] = {n: [] for n in active if SPECS[n].per_example}
    try:
        with eval_mode(model):
            for prefix, names in groups.items():
                if not names and prefix != cfg.prefix:
                    continue
                step_names = [n for n in names if not SPECS[n].per_example]
                for batch in prepare_batches(
                    model, examples, src_vocab, tgt_vocab, prefix, batch_size
                ):
                    check_interrupt()
                    steps = base_table(batch)
                    steps.insert(1, "prefix", prefix)
                    for name in names:
                        frame = active[name](model, batch, cfg)
                        if SPECS[name].per_example:
                            example_parts[name].append(frame)
                        else:
                            frame.insert(1, "prefix", prefix)
                            steps = steps.merge(frame, on=KEYS, how="left", validate="one_to_one")
                        bars[name].update(len(batch.examples))
                    sums.append(example_sums(steps, step_names))
                    sink.write(steps)
        table = sink.close()
    finally:
        sink.discard()
        for bar in bars.values():
            bar.close()

    per_example = pd.DataFrame({"example_id": [ex.id for ex in examples]})
    for name, frames in example_parts.items():
        frame = pd.concat(frames, ignore_index=True)
        per_example = per_example.merge(frame, on="example_id", how="left", validate="one_to_one")
        sums.append(example_sums(per_example, [name]))
    summary = summary_from_sums(_combine(sums), list(active), cfg)
    return SuiteResult(table, per_example, summary, skipped)


class _StepSink:
    """Per-batch step tables: kept in memory, or streamed to Parquet part files and joined at the end.

    Batches of the two prefix groups carry different ablation columns, so the parts are joined
    under :func:`pyarrow.unify_schemas` (missing columns become nulls), one part in memory at a time.
    """

    def __init__(self, path: str | Path | None):
        self.path = None if path is None else Path(path)
        self.frames: list[pd.DataFrame] = []
        self.parts: list[Path] = []
        self._tmp = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = tempfile.TemporaryDirectory(
                dir=self.path.parent, prefix=f".{self.path.name}-"
            )

    def write(self, frame: pd.DataFrame) -> None:
        if self._tmp is None:
            self.frames.append(frame)
            return
        part = Path(self._tmp.name) / f"part-{len(self.parts):06d}.parquet"
        frame.to_parquet(part, index=False)
        self.parts.append(part)

    def close(self) -> pd.DataFrame | None:
        if self._tmp is None:
            return pd.concat(self.frames, ignore_index=True)
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.unify_schemas(
            [pq.read_schema(p).remove_metadata() for p in self.parts], promote_options="permissive"
        )
        tmp_out = Path(self._tmp.name) / "joined.parquet"
        with pq.ParquetWriter(tmp_out, schema) as writer:
            for part in self.parts:
                t = pq.read_table(part).replace_schema_metadata(None)
                columns = [
                    t.column(f.name).cast(f.type)
                    if f.name in t.column_names
                    else pa.nulls(len(t), f.type)
                    for f in schema
                ]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))
        os.replace(tmp_out, self.path)
        return None

    def discard(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


# ----------------------------------------------------------------------------- summary


def ratio_ci(
    num: np.ndarray,
    den: np.ndarray,
    cfg: AblationConfig,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[float, float, float] | None:
    """Σ num / Σ den over groups (examples) with a 95 % percentile bootstrap interval resampling groups.

    Args:
        num, den: per-example sums, shape (n_examples,); examples with den = 0 are left out.
        cfg: ``bootstrap_resamples`` and ``seed``.
        transform: optional map applied to the ratio (e.g. ``1 − r`` for AER).

    Returns:
        (value, ci_low, ci_high); the interval is (nan, nan) with fewer than two contributing
        examples; None if Σ den = 0 (undefined).
    """
    num, den = np.asarray(num, float), np.asarray(den, float)
    keep = den > 0
    n, d = num[keep], den[keep]
    if len(n) == 0:
        return None
    f = transform or (lambda r: r)
    value = float(f(np.asarray(n.sum() / d.sum())))
    if len(n) < 2:
        return value, math.nan, math.nan
    # resamples are drawn `batch` at a time: memory O(batch · n_examples), bounded, same numbers
    batch = max(1, min(cfg.bootstrap_resamples, BOOTSTRAP_ELEMENTS // len(n)))
    res = stats.bootstrap(
        (n, d),
        lambda a, b, axis: f(a.sum(axis) / b.sum(axis)),
        paired=True,
        vectorized=True,
        n_resamples=cfg.bootstrap_resamples,
        method="percentile",
        confidence_level=0.95,
        rng=np.random.default_rng(cfg.seed),
        batch=batch,
    )
    return value, float(res.confidence_interval.low), float(res.confidence_interval.high)


def _put(out: dict[str, float], key: str, result: tuple[float, float, float] | None) -> None:
    if result is None:
        return
    value, low, high = result
    out[key] = value
    if math.isfinite(low) and math.isfinite(high):
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = low, high


def example_sums(rows: pd.DataFrame, names: Sequence[str]) -> pd.DataFrame:
    """Per-example sums of everything the summary needs, for the ablations ``names`` in ``rows``.

    Args:
        rows: per-step rows of one prefix (or the per-example table for per-example ablations).
        names: ablations whose statistics to sum.

    Returns:
        DataFrame indexed by ``example_id`` (order of first appearance) with columns
        ``<name>|n``, ``<name>|n_skipped``, ``<name>|<stat>_n_undefined`` and ``<name>|<stat>|num`` /
        ``<name>|<stat>|den`` (a micro-average's numerator and its count of defined rows).
    """
    cols: dict[str, pd.Series] = {}
    for name in names:
        stats_of = {s: c for s, c in STATS.get(name, {}).items() if c in rows.columns}
        cols[f"{name}|n"] = pd.Series(1.0, index=rows.index)
        skip_col = SKIP_COLUMN.get(name, f"{name}_skipped")
        skipped = (
            rows[skip_col].astype("boolean").fillna(False).astype(bool)
            if skip_col in rows.columns
            else pd.Series(False, index=rows.index)
        )
        cols[f"{name}|n_skipped"] = skipped.astype(float)
        values = {stat: rows[col].astype(float) for stat, col in stats_of.items()}
        for (
            stat,
            v,
        ) in values.items():  # undefined per statistic: τ attn–grad may be, τ grad–LOO not
            cols[f"{name}|{stat}_n_undefined"] = (v.isna() & ~skipped).astype(float)
        if name == "permutation" and "permutation_n_identity" in rows.columns:
            cols[f"{name}|n_identity"] = rows["permutation_n_identity"].astype(float).fillna(0.0)
        if name == "permutation_global" and {"exact_match_original", "exact_match_permuted"} <= set(
            stats_of
        ):
            values["exact_match_drop"] = (
                values["exact_match_original"] - values["exact_match_permuted"]
            )
        for stat, v in values.items():
            cols[f"{name}|{stat}|num"] = v.fillna(0.0)
            cols[f"{name}|{stat}|den"] = v.notna().astype(float)
        if name == "alignment" and "alignment_n_sure" in rows.columns:
            ok = rows["alignment_n_sure"].notna()
            linked = (
                ok & rows["alignment_linked"].astype("boolean").fillna(False).astype(bool)
                if "alignment_linked" in rows.columns
                else ok
            )
            heads = sorted(
                {
                    int(m.group(1))
                    for c in rows.columns
                    if (m := re.match(r"alignment_head(\d+)_n_hyp$", c))
                }
            )
            # corpus AER from summed counts (Och & Ney 2003): 1 − (|A∩S| + |A∩P|) / (|A| + |S|); standard
            # over every predicted link, "linked" over the target tokens that have gold links only
            for label, pre in [("", "alignment_")] + [
                (f"_head{h}", f"alignment_head{h}_") for h in heads
            ]:
                num = rows[f"{pre}n_hyp_sure"].astype(float) + rows[f"{pre}n_hyp_possible"].astype(
                    float
                )
                den = rows[f"{pre}n_hyp"].astype(float) + rows["alignment_n_sure"].astype(float)
                for stat, keep in ((f"aer{label}", ok), (f"aer_linked{label}", linked)):
                    cols[f"{name}|{stat}|num"] = num.where(keep, 0.0)
                    cols[f"{name}|{stat}|den"] = den.where(keep, 0.0)
    frame = pd.DataFrame(cols, index=rows.index)
    frame["example_id"] = rows["example_id"].to_numpy()
    return frame.groupby("example_id", sort=False).sum()


def _combine(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Per-example sums of several batches/prefixes → one frame (missing sums are 0)."""
    frame = pd.concat(parts)
    return frame.groupby(level=0, sort=False).sum()


def summary_from_sums(
    sums: pd.DataFrame, names: Sequence[str], cfg: AblationConfig
) -> dict[str, float]:
    """Summary metrics ``ablation/<name>/<stat>`` from :func:`example_sums` (see module docstring).

    Raises:
        ValueError: if a metric name has a character MLflow rejects (a bug, never user input).
    """
    out: dict[str, float] = {}
    for name in names:
        key = f"ablation/{name}"
        if f"{name}|n" not in sums.columns:
            continue
        out[f"{key}/n_examples" if SPECS[name].per_example else f"{key}/n_steps"] = float(
            sums[f"{name}|n"].sum()
        )
        out[f"{key}/n_skipped"] = float(sums[f"{name}|n_skipped"].sum())
        for col in sums.columns:
            extra = col.split("|", 1)[1] if col.startswith(f"{name}|") else ""
            if extra == "n_identity" or (extra.endswith("_n_undefined") and "|" not in extra):
                out[f"{key}/{extra}"] = float(sums[col].sum())
        for col in sums.columns:
            parts = col.split("|")
            if len(parts) != 3 or parts[0] != name or parts[2] != "num":
                continue
            stat = parts[1]
            transform = (lambda r: 1.0 - r) if stat.startswith("aer") else None
            _put(
                out,
                f"{key}/{stat}",
                ratio_ci(
                    sums[col].to_numpy(), sums[f"{name}|{stat}|den"].to_numpy(), cfg, transform
                ),
            )
    for k, v in list(out.items()):
        if not METRIC_NAME.match(k):
            raise ValueError(f"metric name {k!r} has characters MLflow rejects")
        if not math.isfinite(v):
            del out[k]
    return out


def summarize(
    table: pd.DataFrame,
    per_example: pd.DataFrame,
    names: Sequence[str],
    prefix_of: dict[str, str],
    cfg: AblationConfig,
) -> dict[str, float]:
    """Summary metrics of whole in-memory tables (the streaming suite uses :func:`example_sums`).

    Args:
        table: per-step rows (column ``prefix`` tells the prefix groups apart).
        per_example: one row per example (per-example ablations).
        names: ablations to summarise; ``prefix_of`` maps each to its prefix group.

    Raises:
        ValueError: if a metric name has a character MLflow rejects.
    """
    parts = []
    for name in names:
        rows = per_example if SPECS[name].per_example else table[table["prefix"] == prefix_of[name]]
        parts.append(example_sums(rows, [name]))
    return summary_from_sums(_combine(parts) if parts else pd.DataFrame(), names, cfg)
