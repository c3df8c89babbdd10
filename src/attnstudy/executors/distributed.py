"""A study on a Ray cluster: ``attnstudy run EXPERIMENT --executor ray [--ray-address ADDR]``.

The driver (this process) validates the config and the data, creates the experiment and the study
run itself (two workers creating it at once would race: ``RESOURCE_ALREADY_EXISTS``), submits one
Ray task per (variant, seed) training with its CPU/GPU request and chains each model's ablation
task to its training task, so an ablation starts as soon as its model is done. It collects the
run ids as tasks finish, then computes seed variance and the report from the store
(:func:`attnstudy.api.run` does that part, for every executor alike).

* **The store is a tracking server.** Workers cannot share an embedded SQLite file: the tracking
  URI must be ``http(s)://``, and the experiment must keep its artifacts behind the server
  (``mlflow-artifacts:`` proxying, ``mlflow server --artifacts-destination`` a folder or
  ``s3://``) or on an S3-compatible store every node reaches (an ``s3://`` artifact location),
  never on a disk path of some machine.
* **Failures.** A training or ablation that raises fails alone, its run FAILED with the error,
  as in the local executor (Ray does not retry it). A worker that dies (killed, out of memory,
  its node lost) leaves its run RUNNING; every run a task starts carries the task's token
  (``attnstudy.cluster_task``). Ray runs such a task again, up to ``experiment.task_retries``
  times (default 2), and the retry takes over its dead attempt's runs by that token
  (:func:`attnstudy.study.tasks.train_task`): a training reopens its model run and continues
  from the last checkpoint, an ablation resumes its run from the last finished batch, so the
  study finishes without ``--resume`` and with one run per model. Once the retries are spent the
  driver ends the runs left RUNNING as FAILED with the reason. The other tasks go on; the
  study's summary and the exit code say what failed.
* **Same numbers.** A task trains and ablates exactly as the local executor does, with the same
  seeds, threads and data; each task checks that its node loads the same data (digest) as the
  driver did, since a data file that differs between nodes would otherwise train another model
  under the same name.
* **Code shipped by Ray.** The driver copies its attnstudy package once, when the study starts
  (:func:`attnstudy.runtime.code_version.stage_code`: ``attnstudy.analysis`` inside it, the
  commit named), and every task runs that copy through Ray's ``runtime_env``
  (``py_modules``), ahead of whatever attnstudy a node has installed: nodes need the
  dependencies, not a checkout at the driver's commit, and a file edited after the study
  started cannot reach a later task. A copy that differs from the code the driver itself runs
  (a source edited between the driver's start and the copy) is refused before any task. User
  step scores travel with the tasks by value (:func:`attnstudy.analysis.step_scores.user_scores_payload`).
* **One code version.** The driver sends the copy's code version (:mod:`attnstudy.runtime.code_version`: a
  digest of the package's sources and its git commit) with every task; a task whose worker runs
  other code (a node that could not take the shipped copy) fails before it starts a run, with
  one line naming both versions and where its attnstudy came from, so no node trains other code
  under the same model key.
* **Devices** resolve on the worker (:mod:`attnstudy.models.devices`); a training task requests
  ``training.num_gpus`` GPUs (default: 1 for an explicit ``cuda``/``cuda:N``, else 0), and
  ``auto`` trains on the GPU the task was given, on the CPU in a task that got none, so CPU-only
  and GPU nodes mix.
* **Checkpoints** stay on the node that trained, unless ``$ATTNSTUDY_CHECKPOINT_URI`` names an
  S3-compatible store (:mod:`attnstudy.study.checkpoint_store`; the driver's value reaches every
  task): then each checkpoint is uploaded too, and ``--resume`` continues an interrupted
  training on whichever node its task lands on. Without it, a task that lands on another node
  trains from scratch, with the same result.

Without ``--ray-address`` (and without ``$RAY_ADDRESS``) the driver starts a private Ray head on
this machine's loopback for the run and stops it afterwards (:class:`LocalRayHead`, from
:mod:`attnstudy.executors.ray_head`, which starts, supervises and stops a head).

Ray is an optional dependency (the ``[distributed]`` extra) and is imported only here, inside
functions, so the default install never needs it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

from attnstudy.config import ConfigError
from attnstudy.executors.ray_head import CLUSTERS_VAR, RAY_EXTRA, ClusterError, LocalRayHead
from attnstudy.executors.ray_head import (
    free_port as free_port,  # re-exported: importers use it from here
)
from attnstudy.study import tasks as study_tasks
from attnstudy.study.checkpoint_store import CHECKPOINT_URI_VAR, CheckpointStore
from attnstudy.study.tasks import (
    Job,
    ablate_payload,
    common_payload,
    end_interrupted,
    record_jobs,
    settle_best_aliases,
    train_payload,
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
SERVER_HINT = (
    "start one with 'attnstudy server --backend-store-uri postgresql+psycopg://USER@HOST/DB "
    "--artifacts DIR' and pass --tracking-uri http://HOST:5000"
)


class ClusterNotFoundError(ClusterError):
    """No Ray head answers at the address the user gave (exit code 2: what was named is missing)."""


def check_ray_address(address: str | None, where: str = "--ray-address") -> None:
    """Validate ``--ray-address`` (or ``$RAY_ADDRESS``: ``where`` says which gave ``address``) and
    that Ray is installed, before anything runs; standard library only.

    Raises:
        ConfigError: not ``HOST:PORT``, or the ``[distributed]`` extra is missing (one line).
    """
    import importlib.util

    if address is not None and address.startswith(("http://", "https://")):
        raise ConfigError(
            f"{where} {address!r} is a job server's URL (for --submit and attnstudy job); "
            "--executor ray without --submit joins the cluster at the head's GCS address: pass "
            "--ray-address HOST:PORT, or add --submit"
        )

    if address is not None and address.startswith("ray://"):
        raise ConfigError(
            f"--ray-address (or $RAY_ADDRESS) {address!r} is a Ray Client address, which "
            "attnstudy does not use: its driver joins the cluster itself; give the head's GCS "
            "address HOST:PORT (the --port of 'ray start --head', e.g. 10.0.0.5:6380) and run "
            "attnstudy on a machine that reaches every node (docs/cluster.md)"
        )
    if address is not None and _host_port(address) is None:
        raise ConfigError(f"{where} {address!r}: give HOST:PORT of the Ray head")
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(RAY_EXTRA)


def require_server_uri(uri: str) -> str:
    """The tracking URI, if cluster workers can share it (``http(s)://``).

    Raises:
        ConfigError: any other store (one line saying how to start a server).
    """
    if not uri.startswith(("http://", "https://")):
        raise ConfigError(
            f"--executor ray needs an http(s):// tracking server that every worker reaches, not "
            f"{uri} (workers cannot share an embedded SQLite file); {SERVER_HINT}"
        )
    return uri


def check_artifact_location(location: str, experiment: str, uri: str) -> None:
    """Refuse an experiment whose artifacts live on a disk path instead of behind the server or
    on an S3-compatible store that every node reaches.

    Raises:
        ConfigError: the location is not ``mlflow-artifacts:`` (or an http(s) URL of the server)
            nor ``s3://``.
    """
    if not location.startswith(("mlflow-artifacts:", "http://", "https://", "s3://")):
        raise ConfigError(
            f"experiment {experiment!r} on {uri} keeps its artifacts at {location}, a path workers "
            "cannot reach; serve artifacts through the server (mlflow server "
            "--artifacts-destination DIR or s3://BUCKET, as 'attnstudy server --artifacts' does) "
            "and use a new experiment name"
        )


def _ray(loopback: bool = False):
    """``import ray``, set up for a head on this machine's loopback if ``loopback``.

    Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when it is imported: unless it is 0,
    a driver resolves ``127.0.0.1`` to this machine's outside address (where a loopback head does
    not listen) and waits there for ever. So for a loopback head it is set to 0 before the import.

    Raises:
        ClusterError: Ray is not installed (naming the extra); or ``loopback`` and Ray was
            imported earlier in this process (or ``$RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is set)
            with clusters enabled, so it would not find a loopback head (a process already
            connected by its own ``ray.init()`` is left as it is).
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if loopback:
        os.environ.setdefault(CLUSTERS_VAR, "0")
    try:
        import ray
        from ray._private import ray_constants
    except ImportError:
        raise ClusterError(RAY_EXTRA) from None
    if loopback and ray_constants.ENABLE_RAY_CLUSTER and not ray.is_initialized():
        raise ClusterError(
            f"Ray was set up for a cluster ({CLUSTERS_VAR} was not 0 when ray was first imported "
            "in this process), so it would look for a head on 127.0.0.1 at this machine's outside "
            f"address; set {CLUSTERS_VAR}=0 before importing ray, or give --ray-address with "
            "this machine's outside address"
        )
    return ray


NODE_ID_LABEL = "ray.io/node-id"
"""The label every Ray node carries with its id (a task's ``label_selector`` reads it)."""
PROBE_SECONDS = 120.0
"""How long the nodes have to say whether they can run the study's tasks (starting a worker and
loading the data included)."""
JOB_CONFIG_VAR = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""What Ray's job supervisor sets for a submitted job's driver: the job's ``runtime_env``."""


def plain_log_prefixes(stream=None) -> None:
    """Ray prefixes each line a task prints with ``(train … pid=…)`` in terminal colours; where
    the driver's output is not a terminal (a file, a pipe, a submitted job's log) the colour codes
    are noise, so ``RAY_COLOR_PREFIX=0`` (read by Ray for each line it forwards) unless the user
    set it."""
    stream = stream or sys.stderr
    if not (hasattr(stream, "isatty") and stream.isatty()):
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def submitted_job_env() -> dict | None:
    """The ``runtime_env`` of the Ray job this process is the driver of, when it was submitted by
    ``attnstudy run --submit`` (it ships the code: ``py_modules``); ``None`` otherwise."""
    import json

    try:
        env = json.loads(os.environ.get(JOB_CONFIG_VAR) or "{}").get("runtime_env") or {}
    except (ValueError, AttributeError):
        return None
    return env if isinstance(env, dict) and env.get("py_modules") else None


def _host_port(address: str) -> tuple[str, int] | None:
    if "://" in address:  # ray://, http://: not a GCS address
        return None
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    return (host, int(port)) if host and port.isdigit() else None


def task_requests(cfg) -> dict[str, tuple[float, float]]:
    """What each task of a study asks Ray for: ``{"train <name>" | "ablate <name>": (CPUs, GPUs)}``
    (CPUs = ``training.threads``; GPUs: ``training.num_gpus`` for a training
    (:meth:`~attnstudy.config.TrainingConfig.gpus_per_task`), one for an ablation only with an
    explicit ``ablation.device = "cuda"``)."""
    from attnstudy.models.devices import requests_gpu

    abl_gpu = 1.0 if requests_gpu(cfg.ablation.device) else 0.0
    out = {}
    for spec in cfg.runs():
        cpus = float(spec.training.threads)
        out[f"train {spec.name}"] = (cpus, spec.training.gpus_per_task())
        out[f"ablate {spec.name}"] = (cpus, abl_gpu)
    return out


GIB = 1024**3


def task_memory(spec) -> dict[str, int]:
    """Ray's ``memory`` option (bytes) for a model's tasks: ``training.memory_gib``, or nothing
    when unset (no memory reserved)."""
    gib = spec.training.memory_gib
    return {} if gib is None else {"memory": int(gib * GIB)}


def check_memory(cfg, nodes: list[dict]) -> None:
    """Refuse a study whose ``training.memory_gib`` no alive node has (its task would wait for
    ever); ``nodes`` as for :func:`check_placeable` (Ray's ``memory`` resource is in bytes).

    Raises:
        ConfigError: one line naming the model, what it asks and the largest node's memory.
    """
    for spec in cfg.runs():
        need = task_memory(spec).get("memory")
        if need is not None and not any(n.get("memory", 0) >= need for n in nodes):
            most = max((n.get("memory", 0) for n in nodes), default=0) / GIB
            raise ConfigError(
                f"no node of the Ray cluster can run {spec.name!r}: training.memory_gib = "
                f"{spec.training.memory_gib:g} GiB, the largest node has {most:.1f} GiB for tasks; "
                "lower training.memory_gib, or add such a node"
            )


def check_placeable(requests: dict[str, tuple[float, float]], nodes: list[dict]) -> None:
    """Refuse a study with a task that no node of the cluster can run (Ray would keep it pending,
    and the study would wait for ever).

    Args:
        requests: from :func:`task_requests`.
        nodes: each alive node's total resources (``ray.nodes()[i]["Resources"]``).

    Raises:
        ConfigError: one line naming the first such task, what it asks and what the nodes have.
    """
    for name, (cpus, gpus) in requests.items():
        if not any(n.get("CPU", 0) >= cpus and n.get("GPU", 0) >= gpus for n in nodes):
            have = (
                ", ".join(f"{n.get('CPU', 0):g} CPU/{n.get('GPU', 0):g} GPU" for n in nodes)
                or "no alive node"
            )
            raise ConfigError(
                f"no node of the Ray cluster can run {name!r}: it asks {cpus:g} CPU(s) "
                f"(training.threads) and {gpus:g} GPU(s) (device 'cuda', training.num_gpus), the "
                f"nodes have {have}; lower training.threads or training.num_gpus, or add such a "
                "node"
            )


# ----------------------------------------------------------------------------- the executor


class RayExecutor:
    """Runs a study's trainings and ablations as Ray tasks (see the module docstring).

    Args:
        address: the Ray head (``HOST:PORT``); None: ``$RAY_ADDRESS``, else a private
            :class:`LocalRayHead` on this machine for the duration of the study.
        num_cpus: CPUs of that private head (default: this machine's).
    """

    def __init__(self, address: str | None = None, num_cpus: int | None = None):
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.num_cpus = num_cpus
        self.head: LocalRayHead | None = None
        self._ray = None
        self._connected_here = False
        self._staged: str | None = None  # the folder holding the shipped copy (ours: removed)
        self._shipped: tuple[dict, dict] = ({}, {})  # the tasks' runtime_env, the copy's version
        self._leave_out: dict = {}  # every task's options that keep refusing nodes out

    # --- connection ---------------------------------------------------------------------
    def prepare(self, cfg, tracker, experiment_id: str) -> None:
        """Check the store (a server that proxies artifacts), connect to Ray and leave out the
        nodes that cannot run the study's tasks (:meth:`_leave_out_refusing`), before the study
        run exists.

        Raises:
            ConfigError: the store cannot be shared by workers, no node of the cluster can run
                some task (a task Ray cannot place would wait for ever), or the attnstudy
                sources changed since the command started (:meth:`_ship_code`). ClusterError:
                no Ray cluster, or no node of it can run the study's tasks.
        """
        require_server_uri(tracker.uri)
        CheckpointStore.from_env()  # a malformed $ATTNSTUDY_CHECKPOINT_URI, before any task
        check_artifact_location(
            tracker.artifact_location(experiment_id), cfg.experiment.name, tracker.uri
        )
        self._connect()
        nodes = [n.get("Resources", {}) for n in self._ray.nodes() if n.get("Alive")]
        check_placeable(task_requests(cfg), nodes)
        check_memory(cfg, nodes)
        from attnstudy.runtime.paths import project_root

        runtime_env, code = self._shipped
        common = {"code": code, "shipped": bool(runtime_env), "root": str(project_root())}
        self._leave_out = self._leave_out_refusing(cfg, cfg.runs(), common)

    def _connect(self) -> None:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # a notebook that called ray.init() itself
            # its job's runtime_env is its own: the tasks run the nodes' installed code, which
            # the tasks compare with this process's (a node with other code refuses)
            from dataclasses import asdict

            from attnstudy.runtime.code_version import this_code

            self._ray, self._shipped = ray, ({}, asdict(this_code()))
            return
        if self.address is None:
            # the private head's environment (token authentication, loopback) before Ray is
            # imported here: Ray reads both when it is imported, not when it connects
            self.head = LocalRayHead(num_cpus=self.num_cpus or os.cpu_count() or 1)
            self.address = self.head.start()
            os.environ.update(self.head.driver_env())
        hp = _host_port(self.address)
        if hp is None:
            raise ClusterError(f"--ray-address {self.address!r}: give HOST:PORT of the Ray head")
        ray = _ray(loopback=hp[0] in LOOPBACK)
        try:
            socket.create_connection(hp, timeout=5).close()
        except OSError:  # ray.init would wait minutes for a head that is not there
            raise ClusterNotFoundError(
                f"no Ray head answers at {self.address}; start one with 'ray start --head "
                "--node-ip-address HOST --port PORT' (docs/cluster.md)"
            ) from None
        job_env = submitted_job_env()
        if job_env is not None:  # the driver of a submitted job (run --submit): the job's
            # runtime_env carries the submitter's copy, which this process runs and the job's
            # tasks inherit (a runtime_env given to ray.init here would clash with the job's)
            from dataclasses import asdict

            from attnstudy.runtime.code_version import this_code

            runtime_env, code, init_env = job_env, asdict(this_code()), None
        else:
            runtime_env, code = self._ship_code()
            init_env = runtime_env  # Ray uploads the copy once; each task imports it
        plain_log_prefixes()
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            ray.init(
                address=self.address,
                logging_level=logging.WARNING,
                log_to_driver=True,
                runtime_env=init_env,
            )
        except Exception as err:
            text = str(err).strip().splitlines()
            raise ClusterError(
                f"cannot connect to the Ray head at {self.address}: "
                f"{text[0][:300] if text else type(err).__name__} (a cluster with token "
                "authentication needs its RAY_AUTH_TOKEN in this environment)"
            ) from None
        finally:  # ray.init replaces the SIGTERM handler; the CLI's own handler stays in charge
            for s, h in handlers.items():
                if signal.getsignal(s) is not h and h is not None:
                    signal.signal(s, h)
        self._ray, self._connected_here = ray, True
        self._shipped = (runtime_env, code)

    def close(self) -> None:
        """Disconnect, and stop the private head if this executor started one."""
        if self._ray is not None and self._connected_here:
            with contextlib.suppress(Exception):
                self._ray.shutdown()
            self._connected_here = False
        if self.head is not None:
            self.head.stop()
            self.head = None
        if self._staged is not None:
            import shutil

            shutil.rmtree(self._staged, ignore_errors=True)  # the temporary folder we made
            self._staged = None

    # --- the study ----------------------------------------------------------------------
    def run_variants(self, ctx) -> None:
        """Submit every training and its chained ablation, then collect them as they finish (see
        :meth:`attnstudy.api.Executor.run_variants`)."""
        from attnstudy.models.devices import requests_gpu
        from attnstudy.runtime.progress import Progress
        from attnstudy.study.model_runs import model_task

        ray = self._ray  # connected by prepare(), which shipped the code
        train_fn, ablate_fn = ray.remote(train_task), ray.remote(ablate_task)
        runtime_env, code = self._shipped
        # checkpoints shared through an S3-compatible store, if this driver names one
        common = common_payload(ctx, checkpoint_uri=os.environ.get(CHECKPOINT_URI_VAR, ""))
        common.update(code=code, shipped=bool(runtime_env))
        leave_out = self._leave_out  # the nodes prepare() found refusing, left out
        abl_gpu = 1 if requests_gpu(ctx.cfg.ablation.device) else 0
        jobs: list[Job] = []
        for i, spec in enumerate(ctx.specs):
            threads = spec.training.threads
            job = Job.new(ctx.study_id, i, spec)
            # each task writes its start and progress lines (Ray forwards them to the driver)
            memory = task_memory(spec)
            job.train_ref = train_fn.options(
                num_cpus=threads,
                num_gpus=spec.training.gpus_per_task(),
                max_retries=ctx.cfg.experiment.task_retries,
                name=f"train {spec.name}",
                **memory,
                **leave_out,
            ).remote(train_payload(ctx, job, common))
            job.ablate_ref = ablate_fn.options(
                num_cpus=threads,
                num_gpus=abl_gpu,
                max_retries=ctx.cfg.experiment.task_retries,
                name=f"ablate {spec.name}",
                **memory,
                **leave_out,
            ).remote(job.train_ref, ablate_payload(ctx, job, common))
            jobs.append(job)
        by_ref = {}
        for job in jobs:
            by_ref[job.train_ref] = (job, "training")
            by_ref[job.ablate_ref] = (job, "ablation")
        bar = Progress(
            len(by_ref), "cluster tasks", enabled=ctx.progress, unit="task", heartbeat=False
        )
        pending = list(by_ref)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    job, phase = by_ref[ref]
                    if phase == "ablation" and "training" not in job.collected:
                        # its training task is done too (Ray ran it first): its outcome first
                        self._collect(ctx, job, "training", job.train_ref)
                        pending = [r for r in pending if r != job.train_ref]
                        bar.update(1)
                    if phase not in job.collected:
                        self._collect(ctx, job, phase, ref)
                        bar.update(
                            1, note=f"{model_task(job.spec, phase, noun=True)} {job.spec.name}"
                        )
                record_jobs(ctx, jobs)
        except KeyboardInterrupt:
            self._cancel(ctx, jobs, pending)
            raise
        finally:
            bar.close()
        settle_best_aliases(ctx, jobs)

    def _leave_out_refusing(self, cfg, specs: list, common: dict) -> dict:
        """Ask every alive node with CPUs, once, whether it can run the study's tasks
        (:func:`attnstudy.study.tasks.probe_node`: the driver's code, torch, the same data), and
        leave the nodes that cannot out of the study, each named in one note line with its
        reason; the others are given the whole queue. A node that does not answer within
        :data:`PROBE_SECONDS` is not left out (its tasks say themselves what is wrong). A
        cluster of one node is not asked. Nodes that join later are not asked either.

        Args:
            cfg: the experiment (what its tasks ask for). specs: its runs (their data sets).
            common: the driver's ``code`` version, whether it ``shipped`` it, its ``root``.

        Returns:
            The options every task gets: ``label_selector`` leaving the refusing nodes out
            (Ray's ``ray.io/node-id`` label), or none.

        Raises:
            ClusterError: every node refuses (each one's reason). ConfigError: the nodes left
                cannot place some task (:func:`check_placeable`).
        """
        from attnstudy.runtime.notices import notice
        from attnstudy.study.tasks import probe_payload

        ray = self._ray
        alive = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
        if len(alive) < 2:
            return {}
        where = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in alive}
        payload = probe_payload(specs, common)
        probe = ray.remote(probe_task)
        refs = {
            probe.options(
                num_cpus=0, max_retries=0, name="probe node", label_selector={NODE_ID_LABEL: nid}
            ).remote(payload): nid
            for nid in where
        }
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=PROBE_SECONDS)
        for ref in late:
            ray.cancel(ref)
        refusing = {}
        for ref in ready:
            try:
                out = ray.get(ref)
            except Exception as err:  # its worker could not start (runtime_env), or died
                out = {"ok": False, "error": _first_line(err)}
            if not out.get("ok"):
                refusing[refs[ref]] = out.get("error", "refused")
        if not refusing:
            return {}
        said = [f"node {where[nid]} ({nid[:12]}): {why}" for nid, why in sorted(refusing.items())]
        if len(refusing) == len(where):
            raise ClusterError(
                "no node of the cluster can run the study's tasks: " + "; ".join(said)
            )
        for line in said:
            notice(f"{line}; it is left out of this study, the other nodes take its tasks")
        check_placeable(
            task_requests(cfg),
            [n.get("Resources", {}) for n in alive if n["NodeID"] not in refusing],
        )
        return {"label_selector": {NODE_ID_LABEL: f"!in({','.join(sorted(refusing))})"}}

    def _ship_code(self) -> tuple[dict, dict]:
        """Copy the running package once (:func:`attnstudy.runtime.code_version.stage_code`) into
        a temporary folder of ours, removed by :meth:`close`; returns the job's ``runtime_env``
        (Ray takes a folder to upload only at ``ray.init``, for the whole job, not per task) and
        the copy's code version as the payload carries it.

        Raises:
            ConfigError: the copy differs from the code this process runs (a source edited since
                the command started).
        """
        import tempfile

        self._staged = tempfile.mkdtemp(prefix="attnstudy-shipped-code-")
        staged, copied = stage_checked(Path(self._staged))
        return {"py_modules": [str(staged)]}, copied

    def _collect(self, ctx, job: Job, phase: str, ref) -> None:
        """Turn one finished task into a model, an ablation run or a failure."""
        ray = self._ray
        job.collected.add(phase)
        try:
            out = ray.get(ref)
        except ray.exceptions.RayError as err:  # the worker died or the task never ran
            if phase == "ablation" and job.train_failed:
                return  # not run because its training failed: recorded there
            reason = f"the Ray worker running it died ({_first_line(err)})"
            if isinstance(err, ray.exceptions.RuntimeEnvSetupError):
                reason = (
                    "its node could not take the code the driver ships through Ray's "
                    f"runtime_env ({_first_line(err)})"
                )
            job.lose(ctx, phase, reason)
            _report_lost(job, phase)
            return
        if not out.get("skipped"):
            job.take(phase, out)

    def _cancel(self, ctx, jobs: list[Job], pending: list) -> None:
        """Ctrl-C in the driver: cancel the tasks still running (their runs end KILLED), then close
        as KILLED what a task could not close itself."""
        for ref in pending:
            with contextlib.suppress(Exception):
                self._ray.cancel(ref)
        deadline = time.monotonic() + 20
        for ref in pending:
            with contextlib.suppress(Exception):
                self._ray.wait([ref], timeout=max(0.1, deadline - time.monotonic()))
        end_interrupted(ctx, jobs)


def stage_checked(dest: Path) -> tuple[Path, dict]:
    """Copy the running attnstudy package into ``dest``
    (:func:`attnstudy.runtime.code_version.stage_code`) and check that the copy is the code this
    process runs; returns the copy's folder and its code version as a task payload carries it.

    Raises:
        ConfigError: the copy differs from the running code (a source edited since the command
            started).
    """
    from dataclasses import asdict

    from attnstudy.runtime.code_version import (
        CodeVersion,
        digest_of,
        stage_code,
        staged_folders,
        this_code,
    )

    staged = stage_code(dest)
    running = this_code()
    copied = CodeVersion(digest_of(staged_folders(staged)), running.commit)
    if copied.digest != running.digest:
        raise ConfigError(
            f"the attnstudy sources changed since this command started ({running.describe()} "
            f"running, {copied.describe()} on disk): run the study again, so that every "
            "task runs the code the study records"
        )
    return staged, asdict(copied)


def _report_lost(job: Job, phase: str) -> None:
    """Say at once that a task was lost with its worker (the study goes on; its end repeats it
    among the failures): the variant, the phase, the run it took down and the cause."""
    from attnstudy.runtime.notices import notice

    failure = job.failure
    run = f"run {failure.run_id} closed FAILED" if failure.run_id else "no run of it was open"
    notice(
        f"{job.spec.name}: its {phase} task was lost ({failure.error}); {run}; the rest of the "
        "study goes on (attnstudy run … --resume then redoes it)"
    )


def _first_line(err: BaseException) -> str:
    from attnstudy.runtime.failure_causes import clip

    text = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return clip(f"{type(err).__name__}: {text[0]}", 200) if text else type(err).__name__


# ----------------------------------------------------------------------------- the tasks


def placed_here():
    """The device placement of the Ray task running this code
    (:func:`attnstudy.models.devices.placed_by_scheduler`): within it ``auto`` is ``cuda:0`` only if
    the
    scheduler gave the task a GPU (``ray.get_gpu_ids()`` non-empty) and CUDA is available, the
    CPU otherwise."""
    import ray

    from attnstudy.models.devices import placed_by_scheduler

    return placed_by_scheduler(gpu=bool(ray.get_gpu_ids()))


def probe_task(job: dict) -> dict:
    """Whether this node can run the study's tasks, as a Ray task
    (:func:`attnstudy.study.tasks.probe_node`)."""
    return study_tasks.probe_node(job)


def train_task(job: dict) -> dict:
    """One training as a Ray task: :func:`attnstudy.study.tasks.train_task` with this task's
    device placement (:func:`placed_here`)."""
    return study_tasks.train_task(job, placed_here)


def ablate_task(trained: dict, job: dict) -> dict:
    """One model's ablations as a Ray task, chained to its training task:
    :func:`attnstudy.study.tasks.ablate_task` with this task's device placement."""
    return study_tasks.ablate_task(trained, job, placed_here)
