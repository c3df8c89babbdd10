"""A study: one study run that trains what is missing, ablates every model, compares seeds and
trained adversaries, and reports; its result, its failures, its key for ``--resume``, and the
executor interface a cluster implements.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd

from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.config import ConfigError, RunSpec
from attnstudy.experiment import ExperimentConfig
from attnstudy.models.devices import resolve_device
from attnstudy.pages import run_pages
from attnstudy.runtime.notices import notice
from attnstudy.runtime.paths import git_commit
from attnstudy.runtime.progress import check_intervals, stage, task
from attnstudy.study import adversaries, reference_alignment
from attnstudy.study.ablation_runs import ablate_run, ablation_key
from attnstudy.study.adversaries import run_trained_adversaries
from attnstudy.study.model_runs import (
    ModelRun,
    load_model,
    model_key,
    model_task,
    open_tracker,
    train_spec,
)
from attnstudy.study.task_data import task_data
from attnstudy.tracking import Artifact, Role, Tag, Tracker, store
from attnstudy.tracking.schema import Metric as MetricName


@dataclass
class Failure:
    """One part of a study that failed: which variant, in which phase, and why."""

    name: str
    phase: str
    error: str
    run_id: str | None = None

    def __str__(self) -> str:
        return f"{self.name} ({self.phase}: {self.error})"


@dataclass
class StudyResult:
    """What :func:`run` did.

    Attributes:
        study_run_id: the study run.
        models: the trained or reused models.
        ablations: model run id → ablation run id.
        report: path of report.html, or None.
        failures: what failed (the study run is then FAILED).
        resumed: True if an interrupted study was continued.
    """

    study_run_id: str
    models: list[ModelRun] = field(default_factory=list)
    ablations: dict[str, str] = field(default_factory=dict)
    report: Path | None = None
    failures: list[Failure] = field(default_factory=list)
    resumed: bool = False

    def __getitem__(self, key: str):  # dict-style access, as earlier versions returned a dict
        return {
            "study_run_id": self.study_run_id,
            "models": self.models,
            "ablations": self.ablations,
            "report": self.report,
        }[key]


class StudyFailedError(RuntimeError):
    """Some variants of a study failed; the others ran. ``result`` holds everything."""

    def __init__(self, result: StudyResult):
        self.result = result
        from attnstudy.runtime.failure_causes import study_failed_line

        # the causes first, with what to do (restart, then --resume), each part cut between words
        super().__init__(study_failed_line([str(f) for f in result.failures]))


def error_text(err: BaseException) -> str:
    """One line for a failed part of a study: a cluster cause first (database down, tracking
    server down, worker died), cut between words
    (:func:`attnstudy.runtime.failure_causes.error_line`)."""
    from attnstudy.runtime.failure_causes import error_line

    return error_line(err)


def study_key(cfg: ExperimentConfig, keys: list[str]) -> str:
    """A study's identity for ``--resume``: the experiment name, its models' keys and the ablation config."""
    blob = json.dumps(
        {
            "experiment": cfg.experiment.name,
            "models": keys,
            "ablation": cfg.ablation.resolved(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class StudyOptions:
    """How a study runs: :func:`run_study`'s settings of the same names, passed on as one.

    Attributes:
        retrain: train every model, even one whose finished run could be reused.
        resume: continue the newest interrupted study of the same configuration.
        progress: show progress bars.
        config_text: the experiment's TOML, logged to the study run (None: not logged).
        report: the report built at the end (None: none).
        executor: where the trainings and ablations run (None: in this process).
    """

    retrain: bool = False
    resume: bool = False
    progress: bool = True
    config_text: str | None = None
    report: Reporter | None = None
    executor: Executor | None = None


@dataclass
class StudyContext:
    """What an executor needs to train and ablate a study's variants inside its open study run.

    Attributes:
        cfg, specs: the experiment and its variants × seeds (in order).
        tracker, experiment_id, study_id: the store, the experiment and the open study run.
        result: where the executor records what it did: ``models`` (in ``specs`` order),
            ``ablations`` (model run id → ablation run id) and ``failures``.
        options: as :func:`run_study`'s (``retrain``, ``resume`` and ``progress`` are also
            attributes of the context).
        done: model run id → its FINISHED ablation run of a resumed study (reused, not run again).
        recorded: what :meth:`record` has written to the store (made on its first call).
    """

    cfg: ExperimentConfig
    specs: list[RunSpec]
    tracker: Tracker
    experiment_id: str
    study_id: str
    result: StudyResult
    options: StudyOptions = field(default_factory=StudyOptions)
    done: dict[str, str] = field(default_factory=dict)
    recorded: store.StudyRecord | None = field(default=None, repr=False)

    @property
    def retrain(self) -> bool:
        return self.options.retrain

    @property
    def resume(self) -> bool:
        return self.options.resume

    @property
    def progress(self) -> bool:
        return self.options.progress

    def record(self) -> None:
        """Record ``result``'s runs as the study's members (call it as they come in): the report
        reads exactly these, so an ad-hoc ablation run later never changes a finished study's
        report. Each run's tag names its role and the position of its variant × seed in
        ``specs`` (:class:`attnstudy.tracking.store.StudyRecord`: only what changed is written)."""
        place = {spec.name: i for i, spec in enumerate(self.specs)}
        n = len(self.specs)
        members: dict[str, tuple[Role, int]] = {}
        for m in self.result.models:
            members[m.run_id] = (Role.MODEL, place.get(m.spec.name, n))
        for model_run_id, ablation_run_id in self.result.ablations.items():
            members[ablation_run_id] = (Role.ABLATION, members.get(model_run_id, ("", n))[1])
        for f in self.result.failures:
            if f.run_id:
                members.setdefault(f.run_id, (Role.FAILED, place.get(f.name, n)))
        if self.recorded is None:
            self.recorded = store.StudyRecord(self.tracker, self.study_id, self.experiment_id)
        self.recorded.write(members, (Role.MODEL, Role.ABLATION, Role.FAILED))


class Reporter(Protocol):
    """The report a study builds at its end (:class:`attnstudy.report.StudyReport`), passed in:
    the report reads the study from the store and sits above it, so the study imports none of it.
    """

    def check(self, cfg: ExperimentConfig, tracker: Tracker) -> None:
        """Refuse, before the study starts, what would make the report fail at its end."""

    def build(self, tracker: Tracker, study_id: str) -> Path:
        """Build the report of study ``study_id``; returns its ``report.html``."""


class Executor(Protocol):
    """Where a study's trainings and ablations run (the local process, or a cluster:
    :class:`attnstudy.executors.distributed.RayExecutor`)."""

    def prepare(self, cfg: ExperimentConfig, tracker: Tracker, experiment_id: str) -> None:
        """Check that the study can run there (before the study run exists); raise if not."""

    def run_variants(self, ctx: StudyContext) -> None:
        """Train and ablate every variant of ``ctx.specs``, recording into ``ctx.result``;
        a variant's failure is recorded, never raised."""

    def close(self) -> None:
        """Release what :meth:`prepare` acquired (always called)."""


def _check_step_scores(ablation: AblationConfig, *, in_workers: bool) -> None:
    """Check every step score the selected ablations name — each ``scores`` entry and each
    ``score`` (occlusion's, also where a method's settings are nested, as in
    attribution_agreement) — against the step-score registry before a study trains (the config's
    own check runs only once the registry, and so torch, is imported; a study trained every
    model, then failed each one's ablation). With ``in_workers`` (the work runs in worker
    processes), user-registered scores must also travel to them
    (:func:`attnstudy.analysis.step_scores.user_scores_payload`); a one-process study needs no
    pickling.

    Raises:
        ConfigError: one line naming the setting and the unknown score, with the registered
            names; or the user scores that cannot be sent to worker processes.
    """
    from pydantic import BaseModel

    from attnstudy.analysis.step_scores import (
        BUILT_IN,
        UnknownStepScoreError,
        get_step_score,
        user_scores_payload,
    )

    def named(params: BaseModel, where: str):
        for key, value in params:
            if key == "scores" and isinstance(value, tuple | list):
                yield from ((f"{where}.scores", v) for v in value)
            elif key == "score" and isinstance(value, str):
                yield f"{where}.score", value
            elif isinstance(value, BaseModel):
                yield from named(value, f"{where}.{key}")

    user = False
    for name in ablation.ablations:
        for setting, score in named(ablation.params_for(name), f"ablation.{name}"):
            try:
                get_step_score(score)
            except UnknownStepScoreError as err:
                raise ConfigError(f"{setting}: {err}") from None
            user = user or score not in BUILT_IN
    if user and in_workers:
        try:
            user_scores_payload()
        except ValueError as err:
            raise ConfigError(str(err)) from None


def run_study(
    cfg: ExperimentConfig,
    *,
    retrain: bool = False,
    progress: bool = True,
    config_text: str | None = None,
    report: Reporter | None = None,
    resume: bool = False,
    executor: Executor | None = None,
) -> StudyResult:
    """The main job: a study run that trains what is missing, ablates every model, and reports.

    Config and data of every variant are checked before anything is written. A runtime failure of
    one variant (training or ablation) is isolated: its run is FAILED and tagged with the error,
    the other variants go on, the report is still built, and the study run ends FAILED with
    ``study/n_ok`` / ``study/n_failed`` and the list. Ctrl-C (or SIGTERM) stops the whole study
    (KILLED). With ``resume``, the newest interrupted study of the same experiment, models and
    ablation settings is continued: finished models and their finished ablations are reused, an
    interrupted training resumes from its checkpoint.

    Args:
        report: the report built at the end (:func:`attnstudy.api.run` passes
            :class:`attnstudy.report.StudyReport`); its folder is checked before the study starts.
            None: no report.
        executor: where the trainings and ablations run; None: in this process, one after
            another (:func:`attnstudy.api.run` passes the local executor's worker processes,
            :mod:`attnstudy.executors.local_workers`, for ``experiment.workers`` > 1); the devices
            are
            checked here first for both. Seed variance, the trained adversaries and the report
            are computed here from the store either way.

    Returns:
        :class:`StudyResult`.

    Raises:
        DataError, TrackingError, DeviceError: before anything is written.
        StudyFailedError: some variants failed (its ``result`` holds what was done).
    """
    check_intervals()  # $ATTNSTUDY_PROGRESS_SECONDS and its metric twin, before anything runs
    adversaries.check_selection(cfg, cfg.runs())
    _check_step_scores(cfg.ablation, in_workers=executor is not None)
    reference_alignment.check_study(cfg)  # its aligner installed, before anything trains
    # the work runs on this machine (in this process or its worker processes): devices first
    here = executor is None or getattr(executor, "on_this_machine", False)
    tracker = open_tracker(cfg, devices_here=here)
    if report is not None:  # a report folder that would be refused at the end, refused now
        report.check(cfg, tracker)
    exp_id = tracker.experiment_id(cfg.experiment.name)
    try:
        if executor is not None:
            executor.prepare(cfg, tracker, exp_id)
        options = StudyOptions(
            retrain=retrain,
            resume=resume,
            progress=progress,
            config_text=config_text,
            report=report,
            executor=executor,
        )
        return _run(cfg, tracker, exp_id, options)
    finally:
        if executor is not None:
            executor.close()


def _run(
    cfg: ExperimentConfig, tracker: Tracker, exp_id: str, options: StudyOptions
) -> StudyResult:
    """:func:`run_study` once the store is open and the executor ready."""
    resume = options.resume
    store.reconcile_orphans(tracker, exp_id)
    specs = cfg.runs()
    skey = study_key(cfg, [model_key(spec) for spec in specs])
    study_id = store.find_resumable_study(tracker, exp_id, skey) if resume else None
    resumed = study_id is not None
    if resume and not resumed:
        other = store.interrupted_studies(tracker, exp_id)
        found = (
            f"has this configuration (the newest, {other[0]}, has another study key: a config, "
            "data or ablation setting changed since)"
            if other
            else "to continue"
        )
        notice(
            f"--resume: no interrupted study of experiment {cfg.experiment.name!r} {found}; "
            "starting a new study (a model's interrupted training still resumes from its "
            "checkpoint)"
        )
    if resumed:
        tracker.reopen_run(study_id)
    else:
        study_id = store.start_study(tracker, exp_id, cfg.experiment.name, skey, git_commit())
    result = StudyResult(study_id, resumed=resumed)
    ctx = StudyContext(cfg, specs, tracker, exp_id, study_id, result, options)
    try:
        with tracker.active(study_id):
            _run_study(ctx)
    except StudyFailedError:
        pass  # the study run is FAILED with the list; the report is still built
    if options.report is not None:
        try:  # minutes on a big study: its start line and running lines (a sign of life)
            with task(f"report {cfg.experiment.name}", options.progress):
                result.report = options.report.build(tracker, study_id)
        except Exception as err:
            result.failures.append(Failure("report", "report", error_text(err)))
            tracker.set_tags(study_id, {Tag.FAILED: "; ".join(map(str, result.failures))[:5000]})
            tracker.end_run(study_id, "FAILED")
    if result.failures:
        raise StudyFailedError(result)
    return result


def _run_study(ctx: StudyContext) -> None:
    """Train, ablate and compare inside the open study run (see :func:`run_study`).

    Raises:
        StudyFailedError: some variants failed (after every other variant ran).
    """
    cfg, tracker, study_id, specs, result = (
        ctx.cfg,
        ctx.tracker,
        ctx.study_id,
        ctx.specs,
        ctx.result,
    )
    if ctx.options.config_text:
        tracker.log_text(study_id, ctx.options.config_text, Artifact.EXPERIMENT_TOML)
    tracker.log_text(study_id, cfg.model_dump_json(indent=2), Artifact.EXPERIMENT_JSON)
    if not result.resumed:
        tracker.log_params(
            study_id,
            {"experiment": cfg.experiment.name, "n_models": len(specs), **cfg.ablation.flat()},
        )
    tracker.set_tags(
        study_id,
        {
            Tag.NOTE: run_pages.describe_study(
                cfg.experiment.name, len(specs), cfg.ablation.resolved()
            )
        },
    )
    akey = ablation_key(cfg.ablation)
    if result.resumed:
        ctx.done = store.finished_ablations(tracker, study_id, akey)
    if ctx.options.executor is None:
        _run_variants_here(ctx)
    else:
        ctx.options.executor.run_variants(ctx)
    try:
        _seed_variance(result.models, cfg.ablation, tracker, study_id)
    except Exception as err:
        result.failures.append(Failure("seed variance", "analysis", error_text(err)))
    if cfg.trained_adversary.enabled:
        try:
            run_trained_adversaries(cfg, result.models, tracker, study_id, progress=ctx.progress)
        except Exception as err:
            result.failures.append(Failure("trained adversary", "analysis", error_text(err)))
    try:  # the reference aligner's row (eflomal), once per data settings
        reference_alignment.ensure_references(cfg, tracker, ctx.experiment_id, study_id)
    except Exception as err:
        result.failures.append(Failure("reference aligner", "analysis", error_text(err)))
    n_ok = len(specs) - len(
        {f.name for f in result.failures if f.phase in ("training", "ablation")}
    )
    tracker.log_metrics(
        study_id, {MetricName.STUDY_N_OK: n_ok, MetricName.STUDY_N_FAILED: len(specs) - n_ok}
    )
    if result.failures:
        tracker.set_tags(study_id, {Tag.FAILED: "; ".join(map(str, result.failures))[:5000]})
        raise StudyFailedError(result)


def _run_variants_here(ctx: StudyContext) -> None:
    """The local executor: every training, then every ablation, one after another in this process."""
    cfg, tracker, exp_id, study_id, result = (
        ctx.cfg,
        ctx.tracker,
        ctx.experiment_id,
        ctx.study_id,
        ctx.result,
    )
    retrain, resume, progress, done, record = (
        ctx.retrain,
        ctx.resume,
        ctx.progress,
        ctx.done,
        ctx.record,
    )
    position = {spec.name: f"model {k} of {len(ctx.specs)}" for k, spec in enumerate(ctx.specs, 1)}
    for spec in ctx.specs:
        try:
            with (
                stage(position[spec.name]),
                task(f"{model_task(spec)} {spec.name}", progress),
            ):
                result.models.append(
                    train_spec(
                        spec,
                        tracker,
                        experiment_id=exp_id,
                        study_id=study_id,
                        retrain=retrain,
                        resume=resume,
                        progress=progress,
                    )
                )
        except Exception as err:  # isolated: the run is FAILED with the error; the others go on
            result.failures.append(
                Failure(spec.name, "training", error_text(err), getattr(err, "failed_run_id", None))
            )
        record()
    for m in result.models:
        if m.run_id in done:
            result.ablations[m.run_id] = done[m.run_id]
            continue
        try:
            _, loaded = load_model(f"runs:/{m.run_id}", tracker)
            with stage(position.get(m.spec.name, "")), task(f"ablate {m.spec.name}", progress):
                result.ablations[m.run_id], _ = ablate_run(
                    m.run_id,
                    loaded,
                    cfg.ablation,
                    tracker,
                    study_id=study_id,
                    progress=progress,
                    thresholds=cfg.report.verdict,
                    resume=resume,  # an interrupted ablation continues from its last batch
                )
        except Exception as err:
            result.failures.append(
                Failure(
                    m.spec.name, "ablation", error_text(err), getattr(err, "failed_run_id", None)
                )
            )
        record()


def _seed_variance(
    models: list[ModelRun], cfg: AblationConfig, tracker: Tracker, study_id: str
) -> None:
    """For every configuration trained with several seeds: attention JSD vs output TVD between
    seeds (Wiegreffe & Pinter 2019), logged to the study run."""
    from attnstudy.analysis.seed_variance import seed_variance

    variant_name = run_pages.variant_name

    groups: dict[str, list[ModelRun]] = {}
    for m in models:
        groups.setdefault(model_key(m.spec.model_copy(update={"seed": 0})), []).append(m)
    tables, metrics = [], {}
    for runs in groups.values():
        if len(runs) < 2:
            continue
        loaded = [load_model(f"runs:/{m.run_id}", tracker)[1] for m in runs]
        device = resolve_device(cfg.device, "ablation.device")
        for lm in loaded:
            lm.model.to(device)
        if any(
            lm.src_vocab != loaded[0].src_vocab or lm.tgt_vocab != loaded[0].tgt_vocab
            for lm in loaded
        ):
            continue
        if not loaded[0].model.has_attention:
            continue
        examples = task_data(runs[0].spec).splits.test[: cfg.n_examples]
        table = seed_variance(
            [lm.model for lm in loaded],
            examples,
            loaded[0].src_vocab,
            loaded[0].tgt_vocab,
            seeds=[m.spec.seed for m in runs],
        )
        spec = runs[0].spec
        name = variant_name({Tag.TASK: spec.data.task, Tag.VARIANT: spec.label})
        tables.append(table.assign(variant=name))
        slug = f"{spec.data.task}_{spec.label}".replace("-", "_")
        metrics[f"seed_variance/{slug}/attention_jsd"] = float(
            table["seed_variance_attention_jsd"].mean()
        )
        metrics[f"seed_variance/{slug}/output_tvd"] = float(
            table["seed_variance_output_tvd"].mean()
        )
    if tables:
        tracker.log_table(study_id, pd.concat(tables, ignore_index=True), Artifact.SEED_VARIANCE)
        tracker.log_metrics(study_id, metrics)
