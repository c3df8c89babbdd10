"""A study's two tasks and their bookkeeping, shared by the executors that run models side by side
(the local worker processes, :mod:`attnstudy.executors.local_workers`, and the Ray cluster,
:mod:`attnstudy.executors.distributed`).

* **The tasks.** :func:`train_task` trains one (variant, seed)
(:func:`attnstudy.study.model_runs.train_spec`)
  and :func:`ablate_task` runs the battery on the model it trained
  (:func:`attnstudy.study.ablation_runs.ablate_run`). Each takes a plain payload
  (:func:`train_payload`,
  :func:`ablate_payload`: JSON-able values and bytes, so it travels to another process or node),
  opens its own tracker whose runs carry the task's token (``attnstudy.cluster_task``), refuses a
  process that runs other code than the driver, and returns a plain outcome.
* **The jobs.** A :class:`Job` is one (variant, seed) on the driver: its tokens and what came of
  its two tasks. :func:`record_jobs` writes what has come in to the study;
  :func:`end_interrupted` ends KILLED what an interrupted study's tasks left RUNNING;
  :func:`settle_best_aliases` sets each registered model's ``best`` alias once more, serially.

Executor-neutral: nothing here imports Ray or starts a process; an executor passes its own device
placement (``placement``) where a scheduler gave the task its devices.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attnstudy.runtime.progress import stage, task
from attnstudy.study.checkpoint_store import CHECKPOINT_URI_VAR

Placement = Callable[[], AbstractContextManager[None]]
"""An executor's device placement for a task (the Ray executor's
:func:`attnstudy.executors.distributed.placed_here`); None: devices resolve as in the driver."""


@dataclass
class Job:
    """One (variant, seed) of a study: its two tasks and what came of them.

    ``train_ref`` and ``ablate_ref`` are what an executor tracks its tasks by (a Ray object
    reference); ``collected`` the phases whose outcome the driver has taken.
    """

    index: int
    spec: Any
    train_token: str
    ablate_token: str = ""
    train_ref: Any = None
    ablate_ref: Any = None
    model: Any = None
    ablation: str | None = None
    failure: Any = None
    train_failed: bool = False
    collected: set[str] = field(default_factory=set)

    @classmethod
    def new(cls, study_id: str, index: int, spec) -> Job:
        """The job of the ``index``-th spec of study ``study_id``, with fresh task tokens
        (``<study>/<index>/train/<hex>`` and ``…/ablate/<hex>``)."""
        tag = f"{study_id}/{index}/%s/{uuid.uuid4().hex[:8]}"
        return cls(index, spec, tag % "train", ablate_token=tag % "ablate")

    def take(self, phase: str, out: dict) -> None:
        """A task's outcome (:func:`train_task` / :func:`ablate_task`): its model or ablation run,
        or its failure (a failed training marks the job so its ablation is not awaited)."""
        from attnstudy.study.driver import Failure
        from attnstudy.study.model_runs import ModelRun

        if not out.get("ok"):
            self.failure = Failure(self.spec.name, phase, out["error"], out.get("failed_run_id"))
            self.train_failed = self.train_failed or phase == "training"
        elif phase == "training":
            self.model = ModelRun(
                out["run_id"], self.spec, out["reused"], out["metrics"], out["key"], out["reason"]
            )
        else:
            self.ablation = out["run_id"]

    def lose(self, ctx, phase: str, reason: str) -> None:
        """A task whose result never came back (its worker died): the runs it left RUNNING end
        FAILED with ``reason`` (a FINISHED one stays FINISHED) and the job records the failure."""
        from attnstudy.study.driver import Failure
        from attnstudy.tracking import store

        token = self.train_token if phase == "training" else self.ablate_token
        closed = store.fail_task_runs(ctx.tracker, ctx.experiment_id, token, reason)
        self.failure = Failure(self.spec.name, phase, reason, closed[0] if closed else None)
        self.train_failed = self.train_failed or phase == "training"


def record_jobs(ctx, jobs: list[Job]) -> None:
    """Write what has come in to ``ctx.result`` (models in spec order) and to the study run."""
    result = ctx.result
    result.models[:] = [j.model for j in jobs if j.model is not None]
    result.ablations.clear()
    result.ablations.update({j.model.run_id: j.ablation for j in jobs if j.ablation})
    failures = [f for f in result.failures if f.phase not in ("training", "ablation")]
    result.failures[:] = failures + [j.failure for j in jobs if j.failure is not None]
    ctx.record()


def end_interrupted(ctx, jobs: list[Job]) -> None:
    """An interrupted study: every run its tasks left RUNNING ends KILLED ("the study was
    interrupted"), found by the tasks' tokens; a store that does not answer is passed over."""
    from attnstudy.tracking import store

    for job in jobs:
        for token in (job.train_token, job.ablate_token):
            with contextlib.suppress(Exception):
                store.fail_task_runs(
                    ctx.tracker,
                    ctx.experiment_id,
                    token,
                    "the study was interrupted",
                    status="KILLED",
                )


def settle_best_aliases(ctx, jobs: list[Job]) -> None:
    """Set each registered model's ``best`` alias once more, serially, from all its versions.

    Every worker sets ``best`` when its seed is registered, from the versions it sees then;
    two seeds registered at once can leave the alias on the one whose worker wrote last
    having seen fewer versions (a wrong answer, not an error). Models reused from the store
    got no new version and are left alone.
    """
    from attnstudy.models.training import early_stopping_metric
    from attnstudy.pages import run_pages
    from attnstudy.study.model_runs import registered_name

    trained = {
        registered_name(j.spec): j.spec for j in jobs if j.model is not None and not j.model.reused
    }
    for name, spec in trained.items():
        run_pages.set_best_alias(ctx.tracker, name, early_stopping_metric(spec))


def user_step_scores() -> bytes | None:
    """The driver's user-registered step scores for the workers
    (:func:`attnstudy.analysis.step_scores.user_scores_payload`), or None when the registry was
    never imported here (then no score can have been registered)."""
    registry = sys.modules.get("attnstudy.analysis.step_scores")
    return None if registry is None else registry.user_scores_payload()


# ----------------------------------------------------------------------------- the payloads


def common_payload(ctx, *, checkpoint_uri: str = "") -> dict:
    """What every task of study ``ctx`` carries: the store, the study, the driver's project root
    and code version (each task refuses other code), the shared checkpoint store
    (``checkpoint_uri``; empty: none) and the step scores registered in the driver (a notebook's
    too)."""
    from attnstudy.runtime.code_version import this_code
    from attnstudy.runtime.paths import project_root

    return {
        "uri": ctx.tracker.uri,
        "timeout": ctx.tracker.timeout,
        "experiment_id": ctx.experiment_id,
        "study_id": ctx.study_id,
        "root": str(project_root()),
        "code": asdict(this_code()),
        "checkpoint_uri": checkpoint_uri,
        "step_scores": user_step_scores(),
    }


def _where(ctx, job: Job) -> dict:
    """A task's progress settings: whether it writes lines, and its position (model k of N)."""
    return {"progress": ctx.progress, "position": f"model {job.index + 1} of {len(ctx.specs)}"}


def train_payload(ctx, job: Job, common: dict) -> dict:
    """The payload of ``job``'s :func:`train_task`: ``common`` (:func:`common_payload`), its
    spec, the data digest the driver loaded (the task checks that it loads the same), and the
    study's ``retrain``/``resume``."""
    from attnstudy.study.task_data import task_data

    return (
        common
        | _where(ctx, job)
        | {
            "spec": job.spec.model_dump_json(),
            "data_digest": task_data(job.spec).digest,
            "retrain": ctx.retrain,
            "resume": ctx.resume,
            "token": job.train_token,
        }
    )


def ablate_payload(ctx, job: Job, common: dict) -> dict:
    """The payload of ``job``'s :func:`ablate_task`: ``common``, its spec, the experiment's
    ``[ablation]`` and ``[report.verdict]``, the finished ablations of a resumed study."""
    return (
        common
        | _where(ctx, job)
        | {
            "spec": job.spec.model_dump_json(),
            "ablation": ctx.cfg.ablation.model_dump(mode="json"),
            "verdict": ctx.cfg.report.verdict.model_dump(mode="json"),
            "done": ctx.done,
            "resume": ctx.resume,
            "token": job.ablate_token,
        }
    )


# ----------------------------------------------------------------------------- the tasks


@contextlib.contextmanager
def _worker(job: dict, placement: Placement | None):
    """A task's surroundings on its worker: its own tracker (runs marked with the task's token),
    the intra-op threads of its spec, the executor's device placement (``placement``, if any), a
    project root for the checkpoints (``$ATTNSTUDY_ROOT`` of the node, else the driver's root if
    it exists here, else a cache folder) and the driver's shared checkpoint store
    (``$ATTNSTUDY_CHECKPOINT_URI``)."""
    import torch

    from attnstudy.config import RunSpec
    from attnstudy.tracking import Tag, Tracker

    spec = RunSpec.model_validate_json(job["spec"])
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"  # the driver prints the run ids
    torch.set_num_threads(spec.training.threads)
    shared_before = os.environ.get(CHECKPOINT_URI_VAR)
    if job.get("checkpoint_uri"):  # the driver's store, whatever this node's environment says
        os.environ[CHECKPOINT_URI_VAR] = job["checkpoint_uri"]
    try:
        with _node_root(job):
            tracker = Tracker(job["uri"], job["timeout"], run_tags={Tag.CLUSTER_TASK: job["token"]})
            with placement() if placement is not None else contextlib.nullcontext():
                yield spec, tracker
    finally:
        if shared_before is None:
            os.environ.pop(CHECKPOINT_URI_VAR, None)
        else:
            os.environ[CHECKPOINT_URI_VAR] = shared_before


@contextlib.contextmanager
def _node_root(job: dict):
    """``$ATTNSTUDY_ROOT`` for a task: the node's own, else the driver's root if it exists here
    and is writable, else a cache folder (put back afterwards)."""
    before = os.environ.get("ATTNSTUDY_ROOT")
    if before is None:
        root = Path(job["root"])
        if not (root.is_dir() and os.access(root, os.W_OK)):
            root = Path.home() / ".cache" / "attnstudy" / "cluster"
            root.mkdir(parents=True, exist_ok=True)
        os.environ["ATTNSTUDY_ROOT"] = str(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("ATTNSTUDY_ROOT", None)


def probe_payload(specs, common: dict) -> dict:
    """What :func:`probe_node` checks a node against: the driver's code version (``common``:
    ``code``, ``shipped``, ``root``) and the digest of each distinct data set of the study's
    ``specs`` (one spec for each)."""
    from attnstudy.data.tasks import source_key
    from attnstudy.study.task_data import task_data

    data, seen = [], set()
    for spec in specs:
        key = source_key(spec.data)
        if key not in seen:
            seen.add(key)
            data.append((spec.model_dump_json(), task_data(spec).digest))
    keep = ("code", "shipped", "root")
    return {k: common[k] for k in keep if k in common} | {"data": data}


def probe_node(job: dict) -> dict:
    """Whether the node running this can run the study's tasks, before any is given to it: the
    driver's code (:func:`_other_code`), torch importable, and the same data as the driver's for
    each of the study's data sets (:func:`probe_payload`). The worker keeps what it loaded (the
    data are cached per process), so a task that lands on it later does not load them again.

    Returns:
        ``{"ok": True}``, or ``{"ok": False, "error": …}``: why the node cannot take the study.
    """
    from attnstudy.config import RunSpec
    from attnstudy.study.driver import error_text
    from attnstudy.study.task_data import task_data

    if (refused := _other_code(job)) is not None:
        return refused
    try:
        import torch  # noqa: F401 (every task needs it: a node whose torch is broken refuses here)

        with _node_root(job):
            for spec_json, digest in job["data"]:
                spec = RunSpec.model_validate_json(spec_json)
                here = task_data(spec).digest
                if here != digest:
                    return {
                        "ok": False,
                        "error": f"{spec.name}: the data on this node (digest {here[:12]}) "
                        f"differ from the driver's ({digest[:12]}); give every node the same "
                        "data files",
                    }
    except Exception as err:
        return {"ok": False, "error": error_text(err)}
    return {"ok": True}


def _other_code(job: dict) -> dict | None:
    """A task's refusal when its node runs other attnstudy code than the driver
    (:func:`attnstudy.runtime.code_version.check_same_code`), before it starts any run; None when
    the code is the same. When the driver shipped its code (``job["shipped"]``) the refusal says
    that the shipped copy did not reach this worker, and where its attnstudy came from."""
    from attnstudy.runtime.code_version import (
        CodeVersion,
        CodeVersionError,
        check_same_code,
        this_code,
    )

    remedy = None
    if job.get("shipped"):  # the driver shipped its code: this worker did not run it
        from attnstudy.runtime.code_version import PACKAGE_DIR

        remedy = (
            ": the code the driver ships through Ray's runtime_env did not reach this worker, "
            f"which imported attnstudy from {PACKAGE_DIR}; check that the node's Ray version "
            "takes runtime_env py_modules, then run again with --resume"
        )
    try:
        check_same_code(
            CodeVersion(**job["code"]), this_code(), socket.gethostname(), remedy=remedy
        )
    except CodeVersionError as err:
        return {"ok": False, "error": str(err), "failed_run_id": None}
    return None


def _take_over(tracker, job: dict, spec, phase: str) -> str | None:
    """A retry of this task (Ray runs it again after its worker or node died): the runs its earlier
    attempt left RUNNING, found by the task's token (``attnstudy.cluster_task``), are this
    attempt's to continue, whatever their lease says (Ray retries only once it knows the worker
    is dead). A training's model run is returned, to be reopened and trained into from the last
    checkpoint; every other such run (an ablation run, an adversary's) is ended KILLED, so that
    this attempt resumes the ablation run from its last batch
    (:func:`attnstudy.study.ablation_resume.find_interrupted`). One line says so on stderr (Ray
    forwards it to the driver). None on a first attempt, ``""`` on a retry with no model run
    to continue.
    """
    from attnstudy.runtime.notices import notice
    from attnstudy.tracking import Kind, store

    left = store.running_task_runs(tracker, job["experiment_id"], job["token"])
    if not left:
        return None
    model = next((r.run_id for r in left if phase == "training" and r.kind == Kind.MODEL), None)
    store.end_task_runs(
        tracker,
        [r for r in left if r.run_id != model],
        "its worker died; a retry of its task took over",
        "KILLED",
    )
    if model is not None:
        what = f"the retry continues run {model} from its last checkpoint"
    else:
        what = f"the retry resumes run {left[0].run_id} from its last finished batch"
    notice(f"{spec.name}: its {phase} task was run again after its worker died; {what}")
    return model or ""


def train_task(job: dict, placement: Placement | None = None) -> dict:
    """One training in a worker (:func:`attnstudy.study.model_runs.train_spec`): its start line and
    plain progress lines (``job["progress"]``, naming ``job["position"]``, model k of N) on this
    process's stderr, which Ray forwards to the driver (a local worker's go to the driver through
    :func:`attnstudy.runtime.progress.set_stream`).

    Args:
        job: from :func:`train_payload`.
        placement: the executor's device placement (None: devices resolve as in the driver).

    Returns:
        ``{"ok": True, run_id, reused, metrics, key, reason}``, or ``{"ok": False, error,
        failed_run_id}`` when the training failed (its run is then FAILED with the error).
    """
    from attnstudy.data.types import DataError
    from attnstudy.study import model_runs
    from attnstudy.study.driver import error_text
    from attnstudy.study.task_data import task_data

    if (refused := _other_code(job)) is not None:
        return refused
    with (
        _worker(job, placement) as (spec, tracker),
        stage(job.get("position", "")),
        task(f"{model_runs.model_task(spec)} {spec.name}", job.get("progress", False)),
    ):
        try:
            earlier = _take_over(tracker, job, spec, "training")
            digest = task_data(spec).digest
            if digest != job["data_digest"]:
                raise DataError(
                    f"{spec.name}: the data on this node (digest {digest[:12]}) differ from the "
                    f"driver's ({job['data_digest'][:12]}); give every node the same data files"
                )
            m = model_runs.train_spec(
                spec,
                tracker,
                experiment_id=job["experiment_id"],
                study_id=job["study_id"],
                retrain=job["retrain"],
                resume=job["resume"],
                progress=job.get("progress", False),
                continue_run=earlier or None,
            )
        except Exception as err:
            return {
                "ok": False,
                "error": error_text(err),
                "failed_run_id": getattr(err, "failed_run_id", None),
            }
        return {
            "ok": True,
            "run_id": m.run_id,
            "reused": m.reused,
            "metrics": dict(m.metrics),
            "key": m.key,
            "reason": m.reason,
        }


def ablate_task(trained: dict, job: dict, placement: Placement | None = None) -> dict:
    """The ablations of one trained model in a worker
    (:func:`attnstudy.study.ablation_runs.ablate_run`),
    started as soon as its training task returned; its start and progress lines as
    :func:`train_task`'s.

    Args:
        trained: the training task's outcome.
        job: from :func:`ablate_payload`.
        placement: the executor's device placement (None: devices resolve as in the driver).

    Returns:
        ``{"ok": True, run_id}``; ``{"skipped": True}`` when its training failed; ``{"ok": False,
        error, failed_run_id}`` when the ablations failed.
    """
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.study import ablation_runs, model_runs
    from attnstudy.study.driver import error_text
    from attnstudy.verdict.findings import VerdictThresholds

    if not trained.get("ok"):
        return {"skipped": True}
    model_run_id = trained["run_id"]
    if model_run_id in job["done"]:  # a resumed study's finished ablation
        return {"ok": True, "run_id": job["done"][model_run_id]}
    if (refused := _other_code(job)) is not None:
        return refused
    from attnstudy.analysis.step_scores import register_payload

    register_payload(job.get("step_scores"))  # the driver's own, before the config names them
    with (
        _worker(job, placement) as (spec, tracker),
        stage(job.get("position", "")),
        task(f"ablate {spec.name}", job.get("progress", False)),
    ):
        try:
            retried = _take_over(tracker, job, spec, "ablation") is not None
            cfg = AblationConfig.model_validate(job["ablation"])
            thresholds = VerdictThresholds.model_validate(job["verdict"])
            _, loaded = model_runs.load_model(f"runs:/{model_run_id}", tracker)
            run_id, _ = ablation_runs.ablate_run(
                model_run_id,
                loaded,
                cfg,
                tracker,
                study_id=job["study_id"],
                progress=job.get("progress", False),
                thresholds=thresholds,  # the experiment's [report.verdict], in every executor
                # an interrupted ablation run (another node's too) continues from its last batch
                resume=job.get("resume", False) or retried,
            )
        except Exception as err:
            return {
                "ok": False,
                "error": error_text(err),
                "failed_run_id": getattr(err, "failed_run_id", None),
            }
        return {"ok": True, "run_id": run_id}
