"""Run the configured ablation battery on one model → tidy per-step table + summary metrics.

Batches are prepared and consumed one at a time (:func:`attnstudy.analysis.batch.prepare_batches`); each
is reduced to per-example sums of the summary statistics and its per-step rows go to a sink (a
Parquet file when ``table_path`` is given), so memory stays flat in the number of examples. Prefix policy (docs/design.md §4): ``cfg.prefix`` for
permutation, uniform, erasure, adversarial and importance; the reference for alignment (gold
links index the reference target). When both prefixes are in use the table holds both sets of
steps, told apart by the ``prefix`` column. The summary holds micro-averages over steps (sums
over steps / number of defined steps) with 95 % bootstrap intervals that resample EXAMPLES
(:mod:`attnstudy.scoring.estimates`: :func:`scipy.stats.bootstrap`, percentile method, seeded by
``cfg.seed``); undefined values (NaN,
±inf, a ratio's zero denominator, a declared column the ablation did not write) are left out and
counted in ``<stat>_n_undefined``, so no NaN/inf reaches the summary (MLflow rejects them) and no
declared statistic is missing from it without its count.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import ALL, eval_mode
from attnstudy.runtime.progress import Progress
from attnstudy.runtime.signals import check_interrupt
from attnstudy.scoring import estimates

from .batch import (
    AblationContext,
    analysis_units,
    base_table,
    prepare_batches,
    table_index,
    unit_batch,
)
from .catalogue import AblationConfig, AblationSpec, get_ablation
from .contract import capabilities
from .suite_state import BatchState, UnitState

METRIC_NAME = re.compile(r"^[A-Za-z0-9_/.\-]+$")
KEYS = ["example_id", "prefix", "layer", "head", "step"]


@dataclass
class SuiteResult:
    """Output of :func:`run_suite`.

    Attributes:
        table: one row per real decoder step (``example_id``, ``prefix``, ``step``, the
            :func:`attnstudy.analysis.batch.base_table` columns, then every per-step ablation's columns);
            None when the suite streamed it to ``table_path``.
        examples: one row per example (``example_id`` and the per-example ablations, e.g.
            global permutation).
        summary: ``ablation/<name>/<stat>`` → finite float (with ``_ci_low``/``_ci_high``,
            ``n_steps``, ``<stat>_n_undefined`` per statistic, ``n_skipped``).
        skipped: ablation → reason it did not run.
        seconds: ablation → wall-clock seconds spent in its function, over every batch and
            analysed unit (preparing the traces is not in it); ``steps``: real decoder steps
            analysed per prefix (the analysis prefix and, for the alignment, the reference).
        primary_unit: the unit the plain ``ablation/<name>/<stat>`` keys hold, as a person reads
            it (:func:`unit_label`: ``"layer 2 of 2, all heads"``), or None for a model without
            attention.
        earlier_seconds: wall-clock seconds the processes before this one spent on the run, up
            to the last batch the journal put back (0 for a run that was not resumed): a run's
            whole time is this plus the resuming process's own.
    """

    table: pd.DataFrame | None
    examples: pd.DataFrame
    summary: dict[str, float] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    steps: dict[str, int] = field(default_factory=dict)
    primary_unit: str | None = None
    earlier_seconds: float = 0.0


def _skip_reason(model, spec: AblationSpec) -> str | None:
    """Why ``model`` cannot run ``spec`` (a capability it lacks), or None."""
    missing = [c for c in spec.requires if c not in capabilities(model)]
    if not missing:
        return None
    if "attention" in missing:
        return "the model has no attention (attention = 'none')"
    return f"the model lacks {', '.join(missing)} (see attnstudy.analysis.contract)"


def run_suite(
    model,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    cfg: AblationConfig,
    progress: bool = True,
    batch_size: int = 32,
    table_path: str | Path | None = None,
    label: str = "",
    info: dict | None = None,
    recorder=None,
    journal=None,
) -> SuiteResult:
    """Run ``cfg.ablations`` (catalogue entries) on the first ``cfg.n_examples`` examples.

    Every prepared batch is analysed, reduced to per-example sums of the summary statistics, and
    its per-step rows handed to a sink; nothing per-step is kept across batches when
    ``table_path`` is given, so memory stays flat in the number of examples.

    Args:
        model: the model (see :mod:`attnstudy.analysis.contract`); runs in eval mode, its previous
            mode is restored.
        examples: test examples (only the first ``cfg.n_examples`` are used).
        src_vocab, tgt_vocab: the model's vocabularies.
        cfg: which ablations and their settings.
        progress: show progress (one bar naming ``label``; plain lines outside a terminal).
        batch_size: examples per prepared batch (results do not depend on it).
        table_path: if given, the per-step table is streamed to this Parquet file (written
            atomically at the end) and ``SuiteResult.table`` is None; otherwise it is returned.
        label: what the progress line names (the model run).
        info: provenance stored in the streamed Parquet file's metadata (default: the resolved
            ablation config, the attnstudy version and the git commit).
        recorder: an :class:`attnstudy.analysis.heatmaps.Recorder`: every analysed batch is
            handed to it with what the ablations of its ``capture`` table computed (the
            adversarial search, the importance vectors), for heatmaps and the example browser.
        journal: an :class:`attnstudy.analysis.suite_state.Journal`: each finished batch's
            state is handed to it, and the batches an interrupted run finished
            (:meth:`~attnstudy.analysis.suite_state.Journal.restorable`) are put back from it
            instead of computed — the same tables, sums and records, bit for bit.

    Returns:
        :class:`SuiteResult`. An ablation the model lacks a capability for (the ``none`` model has
        no attention) is skipped, with the reason in ``skipped``.

    Raises:
        ValueError: for an empty example list. UnknownAblationError: an unknown ablation name.
        AblationSpecError: an ablation whose function cannot be loaded (never a silent skip).
    """
    examples = list(examples)[: cfg.n_examples]
    if not examples:
        raise ValueError("run_suite needs at least one example")
    active, skipped = _active(model, cfg)
    groups: dict[str, list[str]] = {cfg.prefix: []}
    for name, (spec, _, _) in active.items():
        groups.setdefault("reference" if spec.prefix == "reference" else cfg.prefix, []).append(
            name
        )
    groups = {p: names for p, names in groups.items() if names or p == cfg.prefix}
    rounds = len(groups)
    # each prefix is a pass over the examples: the count is examples × prefixes when there are two
    bar = Progress(
        len(examples) * rounds,
        f"ablations {label}".strip()
        + (f" on {len(examples)} examples × {rounds} prefixes" if rounds > 1 else ""),
        enabled=progress and bool(active),
        unit="example × prefix" if rounds > 1 else "example",
    )
    if info is None:
        from attnstudy import __version__
        from attnstudy.runtime.paths import git_commit

        info = {"config": cfg.resolved(), "version": __version__, "commit": git_commit()}
    run = _Battery(model, cfg, active, rounds, bar, _StepSink(table_path, info), recorder, journal)
    plan = [  # (prefix, example ids) of every batch, in the order they run
        (p, tuple(ex.id for ex in examples[s : s + batch_size]))
        for p in groups
        for s in range(0, len(examples), batch_size)
    ]
    restorable = journal.restorable(plan) if journal is not None else 0
    try:
        with eval_mode(model):
            for prefix, names in groups.items():
                run.run_prefix(
                    prefix,
                    names,
                    examples,
                    (src_vocab, tgt_vocab),
                    batch_size=batch_size,
                    restorable=restorable,
                )
        table = run.sink.close()
    finally:
        run.sink.discard()
        bar.close()
    return _result(run, examples, table, skipped)


def _active(model, cfg: AblationConfig) -> tuple[dict[str, tuple], dict[str, str]]:
    """The configured ablations the model can run → (spec, function, params), and those it
    cannot → the reason (a capability it lacks)."""
    skipped: dict[str, str] = {}
    active: dict[str, tuple[AblationSpec, Callable, object]] = {}
    for name in dict.fromkeys(cfg.ablations):
        spec = get_ablation(name)
        reason = _skip_reason(model, spec)
        if reason is not None:
            skipped[name] = reason
            continue
        active[name] = (spec, spec.function(), cfg.params_for(name))
    return active, skipped


@dataclass
class _Battery:
    """One run of the battery (:func:`run_suite`): what it runs, and what it has gathered so far
    — per-example sums and parts per analysis unit, seconds per ablation, steps per prefix."""

    model: object
    cfg: AblationConfig
    active: dict[str, tuple[AblationSpec, Callable, object]]
    rounds: int
    bar: Progress
    sink: _StepSink
    recorder: object = None
    journal: object = None
    sums: dict[tuple, list[pd.DataFrame]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    n_steps: dict[str, int] = field(default_factory=dict)
    example_parts: dict[tuple, dict[str, list[pd.DataFrame]]] = field(default_factory=dict)
    units: list[tuple] | None = None
    n_layers: int | None = None  # of cross-attention; None: the model has none
    primary: tuple | None = None
    position: int = 0  # the running batch's index in the plan
    earlier: float = 0.0  # seconds of the processes before this one (a resumed run)

    def __post_init__(self) -> None:
        self.ctx = AblationContext.of(self.cfg)
        self.seconds = dict.fromkeys(self.active, 0.0)
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        """Wall-clock seconds of the run so far, earlier processes included."""
        return self.earlier + time.perf_counter() - self.t0

    def parts(self, unit: tuple) -> dict[str, list[pd.DataFrame]]:
        """The per-example frames of the example-level ablations of ``unit``, so far."""
        return self.example_parts.setdefault(
            unit, {n: [] for n, (sp, _, _) in self.active.items() if sp.unit == "example"}
        )

    def put_back(self, state) -> None:
        """A batch an interrupted run finished (:mod:`attnstudy.analysis.suite_state`)."""
        self.n_steps[state.prefix] = self.n_steps.get(state.prefix, 0) + state.n_steps
        if self.units is None:
            self.units, self.n_layers = [tuple(u) for u in state.units], state.n_layers
            self.primary = _primary(self.units)
        for us in state.unit_states:
            parts = self.parts(us.unit)
            for name, frame in us.parts.items():
                parts[name].append(frame)
            self.sums.setdefault(us.unit, []).append(us.sums)
            self.sink.restore(us.steps)
        if self.recorder is not None:
            self.recorder.restore(state.records)
        self.earlier = max(self.earlier, state.elapsed)
        for name, s in state.seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + s
        self.bar.update(len(state.example_ids), note="")

    def run_prefix(
        self, prefix: str, names: list[str], examples, vocabs, *, batch_size: int, restorable: int
    ) -> None:
        """One pass over the examples with ``prefix``: the batches a journal holds put back,
        the others prepared and run."""
        step_specs = [self.active[n][0] for n in names if self.active[n][0].unit == "step"]
        skip = min(max(restorable - self.position, 0), len(range(0, len(examples), batch_size)))
        for _ in range(skip):
            self.put_back(self.journal.restore(self.position))
            self.position += 1
        for whole in prepare_batches(
            self.model, examples[skip * batch_size :], *vocabs, prefix, batch_size
        ):
            self.run_batch(whole, prefix, names, step_specs)

    def run_batch(self, whole, prefix: str, names: list[str], step_specs: list) -> None:
        """One prepared batch through every analysis unit; its state to the journal."""
        check_interrupt()
        batch_steps = int(whole.trace.step_mask.sum())
        self.n_steps[prefix] = self.n_steps.get(prefix, 0) + batch_steps
        before, unit_states = dict(self.seconds), []
        if self.units is None:
            self.units = headline_units(
                analysis_units(whole.trace, self.cfg.layers, self.cfg.heads)
            )
            self.primary = _primary(self.units)
            cross = whole.trace.cross_attention
            self.n_layers = None if cross is None else int(cross.size(1))
        for unit in self.units:
            unit_states.append(
                self.run_unit(whole, unit, prefix=prefix, names=names, step_specs=step_specs)
            )
        if self.journal is not None:
            ids = tuple(ex.id for ex in whole.examples)
            self.journal.finished(
                BatchState(
                    self.position,
                    prefix,
                    ids,
                    batch_steps,
                    self.units,
                    self.n_layers,
                    unit_states,
                    self.recorder.part(ids) if self.recorder is not None else {},
                    {n: self.seconds[n] - before[n] for n in names},
                    self.elapsed(),
                )
            )
        self.position += 1
        self.bar.update(len(whole.examples), note="")  # between batches nothing runs

    def run_unit(self, whole, unit: tuple, *, prefix: str, names: list[str], step_specs: list):
        """The ablations ``names`` on one analysis unit of a batch: their per-step columns
        merged into the base table and streamed, their per-example sums kept; returns the unit's
        state for the journal (None without one)."""
        batch = unit_batch(whole, *unit)
        steps = base_table(batch)
        steps.insert(1, "prefix", prefix)
        parts = self.parts(unit)
        # the recorder sees the primary unit's batch and what its ablations computed
        record = self.recorder is not None and unit == self.primary
        captured = {}
        for name in names:
            spec, fn, params = self.active[name]
            running = name if len(self.units) == 1 else f"{name} {_unit(unit)}"
            where = f", {prefix} prefix" if self.rounds > 1 else ""
            self.bar.update(0, note=running + where)  # what runs now
            t0 = time.perf_counter()
            if record and name in self.recorder.capture:
                frame, captured[name] = self.recorder.capture[name](
                    self.model, batch, params, self.ctx
                )
            else:
                frame = fn(self.model, batch, params, self.ctx)
            self.seconds[name] += time.perf_counter() - t0
            if spec.unit == "example":
                parts[name].append(frame)
            else:
                frame.insert(1, "prefix", prefix)
                frame.insert(2, "layer", steps["layer"].iloc[0] if len(steps) else 0)
                frame.insert(3, "head", steps["head"].iloc[0] if len(steps) else ALL)
                steps = steps.merge(frame, on=KEYS, how="left", validate="one_to_one")
        if record:
            self.recorder.add(batch, captured)
        self.sums.setdefault(unit, []).append(example_sums(steps, step_specs))
        self.sink.write(steps)
        if self.journal is None:
            return None
        return UnitState(
            unit,
            self.sink.last_bytes(steps),
            self.sums[unit][-1],
            {n: parts[n][-1] for n in names if n in parts},
        )


def _result(run: _Battery, examples: list[Example], table, skipped: dict) -> SuiteResult:
    """The battery's result: the summary (the primary unit's statistics, and every unit's under
    its infix), the per-example frame of every unit, the step table, times and step counts."""
    units = run.units or [(0, ALL)]
    specs = [run.active[n][0] for n in run.active]
    summary: dict[str, float] = {}
    frames = []
    primary = _primary(units)
    for unit in units:
        per_unit = pd.DataFrame({"example_id": [ex.id for ex in examples]})
        unit_sums = run.sums.get(unit, [])
        for name, parts in run.example_parts.get(unit, {}).items():
            frame = pd.concat(parts, ignore_index=True)
            per_unit = per_unit.merge(frame, on="example_id", how="left", validate="one_to_one")
            unit_sums.append(example_sums(per_unit, [run.active[name][0]]))
        unit_summary = summary_from_sums(_combine(unit_sums), specs, run.cfg) if unit_sums else {}
        if unit == primary:
            summary.update(unit_summary)
        if len(units) > 1:
            infix = _unit(unit)
            summary.update(
                {
                    k.replace("ablation/", f"ablation/{infix}/", 1): v
                    for k, v in unit_summary.items()
                }
            )
            per_unit.insert(1, "layer", table_index(unit[0]))
            per_unit.insert(2, "head", table_index(unit[1]))
        frames.append(per_unit)
    per_example = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return SuiteResult(
        table,
        per_example,
        summary,
        skipped,
        run.seconds,
        run.n_steps,
        None if run.n_layers is None else unit_label(primary, run.n_layers),
        run.earlier,
    )


def _unit(unit: tuple) -> str:
    """A unit's name in metric keys: ``layer1``, ``layer1/head2``, ``all_layers``."""
    layer, head = unit
    name = "all_layers" if layer == ALL else f"layer{layer}"
    return name if head == ALL else f"{name}/head{head}"


def headline_units(units: list[tuple]) -> list[tuple]:
    """``units`` (of :func:`~attnstudy.analysis.batch.analysis_units`) with the unit of the plain
    keys added where heads are analysed one at a time: the top analysed layer with all its heads
    jointly, after that layer's single heads (one more unit computed, so the plain keys never
    hold one head)."""
    if any(head == ALL for _, head in units):
        return units
    top = max(layer for layer, _ in units)
    last = max(i for i, (layer, _) in enumerate(units) if layer == top)
    return [*units[: last + 1], (top, ALL), *units[last + 1 :]]


def _primary(units: list[tuple]) -> tuple:
    """The unit whose metrics also go under the plain ``ablation/<name>/<stat>`` keys: the top
    analysed single layer with all heads jointly (:func:`headline_units`), else all layers at
    once (``ablation.layers = "all"``), the only unit then."""
    joint = [u for u in units if u[1] == ALL and u[0] != ALL]
    return max(joint) if joint else units[0]


def unit_label(unit: tuple, n_layers: int) -> str:
    """A unit as the report and the ``ablation.primary_unit`` tag name it, layers counted from
    1: ``"layer 2 of 2, all heads"``, ``"layer 1 of 2, head 3"``, ``"all 2 layers at once, all
    heads"``."""
    layer, head = unit
    where = f"all {n_layers} layers at once" if layer == ALL else f"layer {layer + 1} of {n_layers}"
    return f"{where}, {'all heads' if head == ALL else f'head {head + 1}'}"


class _StepSink:
    """Per-batch step tables: kept in memory, or streamed to Parquet part files and joined at the end.

    Batches of the two prefix groups carry different ablation columns, so the parts are joined
    under :func:`pyarrow.unify_schemas` (missing columns become nulls), one part in memory at a time.
    """

    def __init__(self, path: str | Path | None, info: dict | None = None):
        self.path = None if path is None else Path(path)
        self.info = info or {}
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

    def last_bytes(self, frame: pd.DataFrame) -> bytes:
        """The Parquet bytes of the part just written (``frame``'s, when kept in memory)."""
        if self._tmp is None:
            buf = io.BytesIO()
            frame.to_parquet(buf, index=False)
            return buf.getvalue()
        return self.parts[-1].read_bytes()

    def restore(self, data: bytes) -> None:
        """A part an interrupted run wrote (:meth:`last_bytes`), put back in its place."""
        if self._tmp is None:
            self.frames.append(pd.read_parquet(io.BytesIO(data)))
            return
        part = Path(self._tmp.name) / f"part-{len(self.parts):06d}.parquet"
        part.write_bytes(data)
        self.parts.append(part)

    def close(self) -> pd.DataFrame | None:
        if self._tmp is None:
            return pd.concat(self.frames, ignore_index=True)
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.unify_schemas(
            [pq.read_schema(p).remove_metadata() for p in self.parts], promote_options="permissive"
        ).with_metadata({b"attnstudy": json.dumps(self.info, default=str).encode()})
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
    """Σ num / Σ den over groups (examples) with a 95 % percentile bootstrap interval resampling
    groups: :func:`attnstudy.scoring.estimates.ratio_ci` with the config's resamples and seed.

    Args:
        num, den: per-example sums, shape (n_examples,); examples with den = 0 are left out.
        cfg: ``bootstrap_resamples`` and ``seed``.
        transform: optional map applied to the ratio (e.g. ``1 − r`` for AER).

    Returns:
        (value, ci_low, ci_high); the interval is (nan, nan) with fewer than two contributing
        examples; None if Σ den = 0 (undefined).
    """
    return estimates.ratio_ci(
        num, den, resamples=cfg.bootstrap_resamples, seed=cfg.seed, transform=transform
    )


def step_mean_ci(
    table: pd.DataFrame, column: str, cfg: AblationConfig, by: str = "example_id"
) -> tuple[float, float, float] | None:
    """The micro-average of a per-step column (Σ value / number of steps, NaN values counted as
    steps that add nothing) with a 95 % percentile bootstrap resampling the groups ``by``
    (examples): :func:`ratio_ci` of the per-group sums and step counts.

    Args:
        table: one row per decoder step, with ``by`` and ``column``.
        cfg: ``bootstrap_resamples`` and ``seed``.

    Returns:
        (value, ci_low, ci_high) as :func:`ratio_ci`; None for an empty table.
    """
    groups = table.groupby(by, sort=False)[column]
    sums = groups.agg(lambda v: float(v.astype(float).sum())).to_numpy()
    return ratio_ci(sums, groups.size().to_numpy().astype(float), cfg)


def put_estimate(
    out: dict[str, float], key: str, result: tuple[float, float, float] | None
) -> None:
    """Store ``(value, ci_low, ci_high)`` as ``out[key]``, ``key_ci_low`` and ``key_ci_high``;
    the interval only where both ends are finite, nothing where ``result`` is None."""
    if result is None:
        return
    value, low, high = result
    out[key] = value
    if math.isfinite(low) and math.isfinite(high):
        out[f"{key}_ci_low"], out[f"{key}_ci_high"] = low, high


def example_sums(rows: pd.DataFrame, specs: Sequence[AblationSpec]) -> pd.DataFrame:
    """Per-example sums of everything the summary needs, for the ablations ``specs`` in ``rows``.

    Args:
        rows: per-step rows of one prefix (or the per-example table for per-example ablations).
        specs: ablations whose statistics to sum (their :attr:`AblationSpec.derive` is applied first).

    Returns:
        DataFrame indexed by ``example_id`` (order of first appearance) with columns
        ``<name>|n``, ``<name>|n_skipped``, ``<name>|<count>``, ``<name>|<stat>_n_undefined`` and
        ``<name>|<stat>|num`` / ``<name>|<stat>|den`` (a micro-average's numerator and its count of
        defined rows, or a ratio's numerator and denominator); a ratio reported as its complement
        (AER) is marked ``<name>|<stat>|num~``. Every statistic of :meth:`AblationSpec.all_stats`
        has its columns, except an ``optional`` one whose column ``rows`` lack (left out by the
        ablation's settings); a row is undefined for a statistic where its value is NaN or ±inf,
        a ratio's numerator or denominator is not finite or the denominator is ≤ 0, or the
        statistic's column is missing.
    """
    cols: dict[str, pd.Series] = {}
    rows = rows.copy()  # one block per dtype: a step table built column by column has hundreds,
    # and each derive's new columns would be inserted into it one at a time (pandas warns)
    for spec in specs:
        name = spec.name
        derive = spec.derive_function()
        r = derive(rows) if derive is not None else rows
        cols[f"{name}|n"] = pd.Series(1.0, index=r.index)
        skipped = (
            r[spec.skipped].astype("boolean").fillna(False).astype(bool)
            if spec.skipped in r.columns
            else pd.Series(False, index=r.index)
        )
        cols[f"{name}|n_skipped"] = skipped.astype(float)
        for count in spec.counts:
            if count in r.columns:
                cols[f"{name}|{count.removeprefix(name + '_')}"] = (
                    r[count].astype(float).fillna(0.0)
                )
        for stat, st in spec.all_stats(r.columns).items():
            mark = "~" if st.complement else ""
            if not all(c in r.columns for c in st.columns):
                if st.optional:
                    continue  # not selected by the ablation's settings (a ranking left out)
                # declared but not computed on these rows: undefined at each, counted (a
                # statistic never vanishes from the summary without a trace)
                none = pd.Series(0.0, index=r.index)
                cols[f"{name}|{stat}_n_undefined"] = (~skipped).astype(float)
                cols[f"{name}|{stat}|num{mark}"] = none
                cols[f"{name}|{stat}|den"] = none
                continue
            if st.column is not None:
                v = r[st.column].astype(float)
                # ±inf is undefined as NaN is (MLflow takes neither; a sum with it is no number)
                v = v.where(np.isfinite(v))
                # undefined per statistic: τ attn–grad may be, τ grad–LOO not
                cols[f"{name}|{stat}_n_undefined"] = (v.isna() & ~skipped).astype(float)
                cols[f"{name}|{stat}|num"] = v.fillna(0.0)
                cols[f"{name}|{stat}|den"] = v.notna().astype(float)
            else:
                num = r[st.num].astype(float)
                den = r[st.den].astype(float)
                # a row whose denominator is 0 (AER at <eos>) adds nothing to the ratio: the
                # statistic is not computed on it (attnstudy.verdict.findings.steps_computed_on);
                # nor on
                # a row whose numerator or denominator is no finite number
                defined = np.isfinite(num) & np.isfinite(den) & (den > 0)
                cols[f"{name}|{stat}_n_undefined"] = (~defined & ~skipped).astype(float)
                cols[f"{name}|{stat}|num{mark}"] = num.where(defined, 0.0)
                cols[f"{name}|{stat}|den"] = den.where(defined, 0.0)
    frame = pd.DataFrame(cols, index=rows.index)
    frame["example_id"] = rows["example_id"].to_numpy()
    return frame.groupby("example_id", sort=False).sum()


def _combine(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Per-example sums of several batches/prefixes → one frame (missing sums are 0)."""
    frame = pd.concat(parts)
    return frame.groupby(level=0, sort=False).sum()


def summary_from_sums(
    sums: pd.DataFrame, specs: Sequence[AblationSpec], cfg: AblationConfig
) -> dict[str, float]:
    """Summary metrics ``ablation/<name>/<stat>`` from :func:`example_sums` (see module docstring).

    Every statistic :func:`example_sums` summed yields its ``<stat>_n_undefined`` count, and its
    value (with ``_ci_low``/``_ci_high`` where the interval is finite) wherever one row defines
    it: a statistic without a value is one whose every analysed row was undefined.

    Raises:
        ValueError: if a metric name has a character MLflow rejects, or a value is not finite
            (a bug, never user input).
    """
    out: dict[str, float] = {}
    for spec in specs:
        name = spec.name
        key = f"ablation/{name}"
        if f"{name}|n" not in sums.columns:
            continue
        out[f"{key}/n_examples" if spec.unit == "example" else f"{key}/n_steps"] = float(
            sums[f"{name}|n"].sum()
        )
        out[f"{key}/n_skipped"] = float(sums[f"{name}|n_skipped"].sum())
        for col in sums.columns:
            parts = col.split("|")
            if len(parts) == 2 and parts[0] == name and parts[1] not in ("n", "n_skipped"):
                out[f"{key}/{parts[1]}"] = float(sums[col].sum())  # counts and *_n_undefined
        for col in sums.columns:
            parts = col.split("|")
            if len(parts) != 3 or parts[0] != name or parts[2] not in ("num", "num~"):
                continue
            stat = parts[1]
            transform = (lambda r: 1.0 - r) if parts[2] == "num~" else None
            put_estimate(
                out,
                f"{key}/{stat}",
                ratio_ci(
                    sums[col].to_numpy(), sums[f"{name}|{stat}|den"].to_numpy(), cfg, transform
                ),
            )
    for k, v in out.items():
        if not METRIC_NAME.match(k):
            raise ValueError(f"metric name {k!r} has characters MLflow rejects")
        if not math.isfinite(v):
            # the rows are finite (example_sums counts the others as undefined) and an interval
            # end that is not is left out (put_estimate): never dropped without a trace
            raise ValueError(f"summary metric {k!r} is {v} although its rows are finite")
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
    specs = [get_ablation(n) for n in names]
    parts = []
    for spec in specs:
        rows = (
            per_example
            if spec.unit == "example"
            else table[table["prefix"] == prefix_of[spec.name]]
        )
        parts.append(example_sums(rows, [spec]))
    return summary_from_sums(_combine(parts) if parts else pd.DataFrame(), specs, cfg)
