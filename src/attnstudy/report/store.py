"""Reading a study from the tracking store: its model and ablation runs with their tables
(:class:`ModelEntry`, :class:`StudyData`, :func:`load_study`, :func:`latest_study`), the trained
adversaries as a frame (:func:`adversary_frame`), and the ``_try_*`` readers of an artifact that
may be missing."""

from __future__ import annotations

import json
import math
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnstudy.pages.run_pages import config_name, variant_name
from attnstudy.runtime.notices import notice
from attnstudy.study.adversaries import STATS as ADVERSARY_STATS

from ..data.tasks import report_metrics
from ..tracking import Artifact, Tag, Tracker, store


@dataclass
class ModelEntry:
    """One model of the study, with its ablation run, as read from the store."""

    variant: str
    task: str
    attention: str
    flow: str
    seed: str
    model_run_id: str
    model_status: str
    config: str
    """The variant without its seed (:func:`config_name`): the seeds of one configuration share it."""
    model_error: str = ""
    model_metrics: dict = field(default_factory=dict)
    model_params: dict = field(default_factory=dict)
    registered: str = ""
    ablation_run_id: str | None = None
    ablation_status: str | None = None
    ablation_error: str = ""
    ablation_metrics: dict = field(default_factory=dict)
    ablation_params: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    primary_unit: str | None = None
    """The unit its plain ``ablation/<name>/<stat>`` metrics hold (the ablation run's
    ``ablation.primary_unit`` tag: ``"layer 2 of 2, all heads"``); None where the run has none."""
    predictions: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    examples: pd.DataFrame | None = None
    records: list = field(default_factory=list)
    legacy_heatmaps: list = field(default_factory=list)
    has_browser: bool = False
    has_alignments: bool = False

    @property
    def ablations_run(self) -> list[str]:
        return json.loads(self.ablation_params.get("ablation.ablations", "[]"))

    @property
    def analysis_prefix(self) -> str:
        return self.ablation_params.get("ablation.prefix", "greedy")


@dataclass
class StudyData:
    """Everything the report needs, read from the store."""

    experiment: str
    experiment_id: str
    study_id: str
    entries: list[ModelEntry]
    seed_variance: pd.DataFrame
    config_text: str
    status: str = "FINISHED"
    notes: list[str] = field(default_factory=list)
    experiment_json: dict = field(default_factory=dict)
    adversaries: pd.DataFrame = field(default_factory=pd.DataFrame)
    references: list[dict] = field(default_factory=list)
    """The reference aligners' scores (:mod:`attnstudy.study.reference_alignment`), one dict each."""

    @property
    def predictions(self) -> pd.DataFrame:
        parts = [
            e.predictions.assign(variant=e.variant, task=e.task)
            for e in self.entries
            if e.predictions is not None
        ]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @property
    def steps(self) -> pd.DataFrame:
        parts = [
            e.steps.assign(variant=e.variant, task=e.task, analysis_prefix=e.analysis_prefix)
            for e in self.entries
            if e.steps is not None
        ]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @property
    def examples(self) -> pd.DataFrame:
        """Every model's per-example ablation rows, with ``variant`` and ``task``."""
        parts = [
            e.examples.assign(variant=e.variant, task=e.task)
            for e in self.entries
            if e.examples is not None and len(e.examples)
        ]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def latest_study(tracker: Tracker, experiment: str) -> str:
    """Run id of the newest FINISHED study run of ``experiment`` (else the newest study, with a notice).

    Raises:
        LookupError: no such experiment, or it has no study run.
    """
    study_id, note = store.latest_study(tracker, experiment)
    if note:
        notice(note)
    return study_id


_NO_ATTENTION_STATS = re.compile(
    r"^ablation/attribution_alignment/(aer|precision|recall)_attention"
)


def _without_false_attention(attention: str, metrics: dict) -> dict:
    """A model without attention has no attention statistics: runs stored before the fix kept
    ``attribution_alignment``'s attention recall as 0 (its undefined link counts summed as 0), so
    its attention keys are dropped when read (the report then says "no attention")."""
    if attention != "none":
        return metrics
    return {k: v for k, v in metrics.items() if not _NO_ATTENTION_STATS.match(k)}


def load_study(tracker: Tracker, study_id: str) -> StudyData:
    """Read a study's runs and tables from the store: exactly the model and ablation runs the study
    recorded (:func:`attnstudy.tracking.store.study_runs`), so ad-hoc ablations run later never
    change a study's report.

    Raises:
        LookupError: ``study_id`` is not a study run (or no run).
    """
    runs = store.study_runs(tracker, study_id)
    study = runs.study
    art = _Artifacts(tracker)  # each run's folders listed once
    entries, notes = [], []
    for run in runs.models:
        t = run.tags
        e = ModelEntry(
            variant=variant_name(t),
            config=config_name(t),
            task=t.get(Tag.TASK, "?"),
            attention=t.get(Tag.ATTENTION, "?"),
            flow=t.get(Tag.FLOW, "?"),
            seed=t.get(Tag.SEED, ""),
            model_run_id=run.run_id,
            model_status=run.status,
            model_error=t.get(Tag.ERROR_MESSAGE, ""),
            # the token error rate also as test/per, whatever the task logs it as
            model_metrics=report_metrics(t.get(Tag.TASK, "?"), run.metrics),
            model_params=dict(run.params),
            registered=t.get(Tag.REGISTERED_MODEL, ""),
        )
        if run.status == "FINISHED":
            e.predictions = _try_table(art, run, Artifact.PREDICTIONS)
            if e.predictions is None:
                notes.append(
                    f"{e.variant}: its test predictions ({Artifact.PREDICTIONS} of run "
                    f"{run.run_id}) are missing from the store"
                )
            e.has_alignments = art.has(run, f"{Artifact.ALIGNMENTS_DIR}/test.pharaoh")
        abl = runs.ablations.get(run.run_id)
        if abl is not None:
            e.ablation_run_id, e.ablation_status = abl.run_id, abl.status
            e.ablation_error = abl.tags.get(Tag.ERROR_MESSAGE, "")
            e.ablation_params = dict(abl.params)
            e.primary_unit = abl.tags.get(Tag.PRIMARY_UNIT)
            e.skipped = {
                k[len(Tag.SKIPPED_PREFIX) :]: v
                for k, v in abl.tags.items()
                if k.startswith(Tag.SKIPPED_PREFIX)
            }
            if abl.status == "FINISHED":
                e.ablation_metrics = _without_false_attention(e.attention, dict(abl.metrics))
                e.steps = _try_table(art, abl, Artifact.STEPS)
                if e.steps is None:
                    notes.append(
                        f"{e.variant}: its per-step ablation table ({Artifact.STEPS} of run "
                        f"{abl.run_id}) is missing from the store; its figures are empty"
                    )
                e.examples = _try_table(art, abl, Artifact.EXAMPLES)
                for rec in _try_json(art, abl, Artifact.HEATMAPS) or []:
                    (e.records if "rows" in rec else e.legacy_heatmaps).append(rec)
                e.has_browser = art.has(abl, Artifact.BROWSER)
        entries.append(e)
    seed_var = _try_table(art, study, Artifact.SEED_VARIANCE)
    adversaries = adversary_frame(runs.adversaries, {e.model_run_id: e.variant for e in entries})
    config_text = _try_text(art, study, Artifact.EXPERIMENT_TOML) or ""
    exp_json = _try_json(art, study, Artifact.EXPERIMENT_JSON) or {}
    return StudyData(
        study.tags.get(Tag.EXPERIMENT, "study"),
        study.experiment_id,
        study_id,
        entries,
        seed_var if seed_var is not None else pd.DataFrame(),
        config_text,
        status=study.status,
        notes=notes,
        experiment_json=exp_json,
        adversaries=adversaries,
        references=[
            ref | {"run_id": r.run_id}
            for r in runs.references
            if (ref := _try_json(art, r, Artifact.REFERENCE_ALIGNMENT))
        ],
    )


def adversary_frame(runs: list, variants: dict[str, str]) -> pd.DataFrame:
    """One row per trained adversary run (:mod:`attnstudy.study.adversaries`): ``variant``,
    ``model_run_id``, ``run_id``, ``status``, ``lambda``, ``init``, ``epochs``, ``n_examples``,
    ``n_steps`` and, per statistic of :data:`ADVERSARY_STATS`, its value with ``_ci_low`` /
    ``_ci_high`` (NaN where the run has none)."""
    rows = []
    for r in runs:
        m = r.metrics
        row = {
            "variant": variants.get(r.tags.get(Tag.SOURCE_RUN_ID, ""), variant_name(r.tags)),
            "model_run_id": r.tags.get(Tag.SOURCE_RUN_ID, ""),
            "run_id": r.run_id,
            "status": r.status,
            "lambda": float(r.params.get("lambda", r.tags.get(Tag.LAMBDA, "nan"))),
            "init": r.params.get("init", ""),
            "epochs": int(r.params.get("epochs", 0) or 0),
            "n_examples": m.get("adversary/n_examples", math.nan),
            "n_steps": m.get("adversary/n_steps", math.nan),
        }
        for stat in ADVERSARY_STATS:
            for suffix in ("", "_ci_low", "_ci_high"):
                row[f"{stat}{suffix}"] = m.get(f"adversary/{stat}{suffix}", math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


class _Artifacts:
    """The artifact files of a study's runs as one report read sees them: each run folder listed
    once, at the run's own artifact location (:meth:`Tracker.run_files`: no lookup of the run,
    where ``has_artifact`` made one per file: six per model of a 2,000-model study)."""

    def __init__(self, tracker):
        self.tracker = tracker
        self._listed: dict[tuple[str, str], set[str] | None] = {}

    def _files(self, run, path: str) -> set[str] | None:
        parent = str(Path(path).parent)
        key = (run.run_id, "" if parent == "." else parent)
        if key not in self._listed:
            try:
                self._listed[key] = self.tracker.run_files(run, key[1])
            except Exception:  # noqa: BLE001 - None: see missing and has
                self._listed[key] = None
        return self._listed[key]

    def missing(self, run, path: str) -> bool:
        """The run has no such file (False when the listing failed: the store's error is then
        reported by the load that follows)."""
        files = self._files(run, path)
        return files is not None and path not in files

    def has(self, run, path: str) -> bool:
        """The run has the file (False when the listing failed: the report does not link it)."""
        files = self._files(run, path)
        return files is not None and path in files


def _try_table(art: _Artifacts, run, path: str):
    """The artifact table, or None when the run has no such artifact (not run); other errors propagate."""
    if art.missing(run, path):
        return None
    return art.tracker.load_table(run.run_id, path)


def _try_text(art: _Artifacts, run, path: str) -> str | None:
    if art.missing(run, path):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        local = art.tracker.download_artifact(run.run_id, path, tmp)
        return Path(local).read_text(encoding="utf-8")


def _try_json(art: _Artifacts, run, path: str):
    text = _try_text(art, run, path)
    return json.loads(text) if text else None
