"""MLflow tracking — the only module of ``attnstudy`` that imports mlflow (DESIGN.md §5).

Store: SQLite ``mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts/``, both absolute,
resolved from the project root (the nearest ancestor of the working directory holding
``pyproject.toml`` or ``mlruns/``, or ``$ATTNSTUDY_ROOT``). Any tracking URI (``http://…``
included) can replace it. Every call goes through :class:`Tracker`, so timeouts and retries are
bounded in one place. Metrics and params are logged in batches.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# bounded waits for remote stores (MLflow's defaults retry for minutes)
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

import logging  # noqa: E402

import mlflow  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from .signals import acknowledge_interrupt, check_interrupt, deferred_signals  # noqa: E402

MODEL_ARTIFACT_DIR = "model"
logging.getLogger("mlflow").setLevel(logging.WARNING)  # no INFO chatter on the CLI
# store errors reach the user as one TrackingError line; MLflow's own ERROR tracebacks (with SQL) would
# print hundreds of lines for one full disk
logging.getLogger("mlflow.store").setLevel(logging.CRITICAL)
logging.getLogger("alembic").setLevel(logging.WARNING)


class TrackingError(RuntimeError):
    """The tracking store cannot be reached or used; the message names the URI."""


class StoreNotFoundError(LookupError):
    """A verb that reads an existing store found none where it looked (the message says where)."""


class ModelNotFoundError(LookupError):
    """The named run, registered model, version, alias or model file does not exist."""


class UnfinishedRunError(LookupError):
    """The named model run is RUNNING, KILLED or FAILED: its model may be incomplete."""


OWNER_HOST_TAG, OWNER_PID_TAG, OWNER_START_TAG = (
    "attnstudy.owner.host",
    "attnstudy.owner.pid",
    "attnstudy.owner.start",
)
"""Tags naming the process that writes a run: host, PID and process start (boot id + start time)."""


def _process_start(pid: int) -> str | None:
    """``<boot id>/<start time in clock ticks>`` of a process on this host, None if it does not exist."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return f"{boot}/{stat.rsplit(')', 1)[1].split()[19]}"


def owner_tags() -> dict[str, str]:
    """The owner tags of this process."""
    import socket

    return {
        OWNER_HOST_TAG: socket.gethostname(),
        OWNER_PID_TAG: str(os.getpid()),
        OWNER_START_TAG: _process_start(os.getpid()) or "unknown",
    }


def owner_alive(tags: dict[str, str]) -> bool | None:
    """Whether the process named by a run's owner tags still runs: None if it is on another host
    (or the run has no owner tags), else True/False (a reused PID is told apart by its start time)."""
    import socket

    host, pid, start = tags.get(OWNER_HOST_TAG), tags.get(OWNER_PID_TAG), tags.get(OWNER_START_TAG)
    if host != socket.gethostname() or not (pid or "").isdigit():
        return None
    now = _process_start(int(pid))
    return now is not None and (start in (None, "unknown") or now == start)


DEFAULT_TIMEOUT = 10.0
"""Seconds to wait for a tracking server unless configured otherwise."""


def resolve_timeout(timeout: float | None = None) -> float:
    """The tracking timeout: ``timeout`` if given, else ``$ATTNSTUDY_TRACKING_TIMEOUT``, else 10 s.

    Raises:
        ValueError: the variable is not a positive number (the message names it).
    """
    if timeout is not None:
        return float(timeout)
    env = os.environ.get("ATTNSTUDY_TRACKING_TIMEOUT")
    if env is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(env)
    except ValueError:
        value = float("nan")
    if not (0 < value <= 3600):
        from .config import ConfigError

        raise ConfigError(
            f"ATTNSTUDY_TRACKING_TIMEOUT={env!r} is not a number of seconds in (0, 3600]"
        )
    return value


def check_server(uri: str, timeout: float) -> None:
    """For an ``http(s)://`` URI, wait up to ``timeout`` seconds for ``GET /health`` to answer 200.

    Nothing is written. Other URIs return at once.

    Raises:
        TrackingError: no answer within the deadline (the message names the URI and the deadline).
    """
    if not uri.startswith(("http://", "https://")):
        return
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    url = uri.rstrip("/") + "/health"
    last = "no answer"
    while True:
        left = deadline - time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=max(0.1, min(5.0, left))) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            last = (
                "connection refused" if isinstance(reason, ConnectionRefusedError) else "no answer"
            )
        if time.monotonic() >= deadline:
            raise TrackingError(
                f"tracking server {uri} did not answer within {timeout:g} s ({last}); "
                "start it, or point --tracking-uri / MLFLOW_TRACKING_URI elsewhere"
            )
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


def project_root() -> Path:
    """``$ATTNSTUDY_ROOT``, else the nearest ancestor of the cwd with pyproject.toml or mlruns/."""
    env = os.environ.get("ATTNSTUDY_ROOT")
    if env:
        return Path(env).resolve()
    cwd = Path.cwd().resolve()
    for d in (cwd, *cwd.parents):
        if (d / "mlruns").is_dir() or (d / "pyproject.toml").is_file():
            return d
    return cwd


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else the project's SQLite store."""
    return (
        os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{project_root() / 'mlruns' / 'mlflow.db'}"
    )


def artifact_root() -> Path:
    return project_root() / "mlruns" / "artifacts"


def git_commit() -> str:
    """The project's git commit, or "unknown"."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=project_root(),
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


class Tracker:
    """A thin layer over :class:`mlflow.tracking.MlflowClient`.

    Args:
        uri: tracking URI (default: ``$MLFLOW_TRACKING_URI``, else the project's SQLite store).
        timeout: seconds to wait for a remote server before failing (``TrackingError``); default
            :func:`resolve_timeout`.
        create: create the SQLite store if it does not exist; verbs that only read an existing
            store pass False and get :class:`StoreNotFoundError` instead of a new, empty store.

    Raises:
        TrackingError: the store cannot be created or reached.
        StoreNotFoundError: ``create=False`` and there is no store at the URI.
        ValueError: an in-memory or file store URI, or a bad ``$ATTNSTUDY_TRACKING_TIMEOUT``.
    """

    def __init__(self, uri: str | None = None, timeout: float | None = None, create: bool = True):
        from .config import check_tracking_uri

        self.uri = check_tracking_uri(uri or default_tracking_uri())
        self.timeout = resolve_timeout(timeout)
        if self.uri.startswith("sqlite:///"):
            db = Path(self.uri[len("sqlite:///") :])
            if not create and not db.is_file():
                raise StoreNotFoundError(
                    f"no tracking store at {self.uri}; point to one with --tracking-uri, MLFLOW_TRACKING_URI "
                    "or ATTNSTUDY_ROOT (the folder holding mlruns/), or create one with 'attnstudy train'"
                )
            self._init_sqlite(db, create)
        elif self.uri.startswith(("http://", "https://")):
            check_server(self.uri, self.timeout)
        # no mlflow.set_tracking_uri here: it also sets $MLFLOW_TRACKING_URI for the whole process;
        # the registry is the same store (MLflow's default would follow the process-wide URI)
        self.client = MlflowClient(self.uri, registry_uri=self.uri)
        self._dropped: dict[str, set[str]] = {}
        self._dropped_count: dict[str, int] = {}

    # --- store -------------------------------------------------------------------------------
    def _init_sqlite(self, db: Path, create: bool) -> None:
        """Open (and, if ``create``, first create) a SQLite store.

        * A store is created once, under a file lock (MLflow's schema migration races between
          processes), into a temporary file that is renamed into place: a disk that fills up
          during creation leaves no half-made store behind.
        * An empty or missing database beside existing artifacts or checkpoints is refused: the
          database was lost or truncated, and a fresh one would silently orphan every result.
        * A store that cannot be written (a read-only copy) is opened read-only by verbs that read.
        """
        root = db.parent
        has_data = any(_non_empty(root / d) for d in ("artifacts", "checkpoints"))
        size = db.stat().st_size if db.is_file() else None
        if (size is None or size == 0) and has_data:
            state = "empty (0 bytes)" if size == 0 else "missing"
            raise TrackingError(
                f"the tracking database {db} is {state} but {root} holds artifacts or checkpoints: "
                "the database was lost or truncated; restore it from a backup, or move "
                f"{root} aside to start a new store"
            )
        if not create:
            if not os.access(db, os.W_OK) or not os.access(root, os.W_OK):
                self.uri = f"sqlite:///file:{db}?mode=ro&uri=true"  # SQLite's read-only mode
            self._check_open(db)
            return
        try:
            root.mkdir(parents=True, exist_ok=True)
            with open(root / ".init.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    if not db.is_file() or db.stat().st_size == 0:
                        self._create_sqlite(db)
                    self._check_open(db)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        except OSError as err:
            raise TrackingError(
                f"cannot write the tracking store {db}: {err.strerror or err}; "
                "choose a writable folder (ATTNSTUDY_ROOT) or set MLFLOW_TRACKING_URI"
            ) from None

    def _create_sqlite(self, db: Path) -> None:
        fd, tmp = tempfile.mkstemp(dir=db.parent, prefix=".mlflow.db.", suffix=".creating")
        os.close(fd)
        os.unlink(tmp)  # SQLite creates it; the name is ours
        try:
            with deferred_signals():
                MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)
            os.replace(tmp, db)
        except MlflowException as err:
            raise TrackingError(
                f"cannot create the tracking store {db}: {_disk_message(err, db.parent)}"
            ) from None
        finally:
            for leftover in (tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"):
                Path(leftover).unlink(missing_ok=True)

    def _check_open(self, db: Path) -> None:
        try:
            with deferred_signals():
                MlflowClient(self.uri).search_experiments(max_results=1)
        except MlflowException as err:
            raise TrackingError(
                f"cannot open the tracking store {self.uri}: {_disk_message(err, db.parent)}"
            ) from None

    def _call(self, fn, *args, **kwargs):
        """One store call, with signals held (an interrupt never lands inside a database session)
        and MLflow's errors turned into one :class:`TrackingError` line (a full disk says so)."""
        check_interrupt()
        try:
            with deferred_signals():
                return fn(*args, **kwargs)
        except MlflowException as err:
            raise TrackingError(
                f"tracking store {self.uri}: {_disk_message(err, project_root() / 'mlruns')}"
            ) from None

    # --- experiments and runs ----------------------------------------------------------------
    def experiment_id(self, name: str, create: bool = True) -> str | None:
        """Id of the experiment ``name`` (created with an explicit artifact location if missing)."""
        exp = self._call(self.client.get_experiment_by_name, name)
        if exp is not None:
            return exp.experiment_id
        if not create:
            return None
        location = None
        if not self.uri.startswith(("http://", "https://")):
            location = (artifact_root() / name).as_uri()
        try:
            return self.client.create_experiment(name, artifact_location=location)
        except MlflowException:  # created concurrently by another process
            return self._call(self.client.get_experiment_by_name, name).experiment_id

    def start_run(
        self,
        experiment_id: str,
        name: str,
        tags: dict[str, str] | None = None,
        parent_run_id: str | None = None,
    ) -> str:
        """Create a run (nested under ``parent_run_id``) and return its id."""
        tags = dict(tags or {}) | owner_tags()
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        run = self._call(self.client.create_run, experiment_id, run_name=name, tags=tags)
        return run.info.run_id

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """Mark a run FINISHED, FAILED or KILLED."""
        self._call(self.client.set_terminated, run_id, status=status)

    @contextmanager
    def active(self, run_id: str):
        """Close ``run_id`` as FINISHED when the block completes, KILLED on Ctrl-C/SIGTERM
        (KeyboardInterrupt) and FAILED on any other error, so no unfinished run looks complete.

        A FAILED run is tagged with the error (``error.class``, ``error.message`` and the run's
        description ``mlflow.note.content``), and the exception gets a ``failed_run_id`` attribute
        naming the innermost run it failed.
        """
        try:
            yield run_id
        except KeyboardInterrupt:
            acknowledge_interrupt()
            self.end_run(run_id, "KILLED")  # a second signal waits until the run is ended
            raise
        except BaseException as err:
            message = _first_line(err)
            try:
                self.set_tags(
                    run_id,
                    {
                        "error.class": type(err).__name__,
                        "error.message": message[:500],
                        "mlflow.note.content": f"Failed: {type(err).__name__}: {message}",
                    },
                )
            except TrackingError:
                pass  # the store itself failed: ending the run below reports it
            if not hasattr(err, "failed_run_id"):
                try:
                    err.failed_run_id = run_id
                except AttributeError:
                    pass
            self.end_run(run_id, "FAILED")
            raise
        self.end_run(run_id, "FINISHED")

    def reopen_run(self, run_id: str) -> None:
        """Mark an ended run RUNNING again, owned by this process (a study continued with ``--resume``)."""
        self.set_tags(run_id, owner_tags())
        self._call(self.client.update_run, run_id, status="RUNNING")

    def find_resumable_study(self, experiment_id: str, study_key: str) -> str | None:
        """The newest KILLED or FAILED study run with this study key, or None."""
        runs = self.search_runs(
            [experiment_id], f"tags.kind = 'study' and tags.study_key = '{study_key}'"
        )
        for r in runs:
            if r.info.status in ("KILLED", "FAILED"):
                return r.info.run_id
        return None

    def finished_ablations(self, study_id: str, ablation_key: str) -> dict[str, str]:
        """Model run id → FINISHED ablation run of this study with this ablation key."""
        exp_id = self.get_run(study_id).info.experiment_id
        runs = self.search_runs(
            [exp_id],
            f"tags.kind = 'ablation' and tags.study_id = '{study_id}' and "
            f"tags.ablation_key = '{ablation_key}' and attributes.status = 'FINISHED'",
        )
        out: dict[str, str] = {}
        for r in reversed(runs):  # oldest first, so the newest wins
            out[r.data.tags.get("source_run_id", "")] = r.info.run_id
        return out

    def has_artifact(self, run_id: str, path: str) -> bool:
        """Whether the run has the artifact file ``path`` (e.g. ``model/weights.pt``)."""
        parent = str(Path(path).parent)
        files = self._call(self.client.list_artifacts, run_id, None if parent == "." else parent)
        return any(f.path == path and not f.is_dir for f in files)

    def set_tags(self, run_id: str, tags: dict[str, str]) -> None:
        self._call(self.client.log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_params(self, run_id: str, params: dict[str, str]) -> None:
        """Log params in batches of 100 (MLflow's per-call limit)."""
        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._call(self.client.log_batch, run_id, params=items[i : i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        """Log finite metrics in batches (MLflow refuses NaN/inf).

        A non-finite value is never dropped silently: the run's ``n_nonfinite_dropped`` metric counts
        them and its ``nonfinite_metrics`` tag names the keys.
        """
        ts = int(time.time() * 1000)
        items = [
            Metric(k, float(v), ts, step)
            for k, v in metrics.items()
            if v is not None and _finite(v)
        ]
        dropped = sorted(k for k, v in metrics.items() if v is not None and not _finite(v))
        if dropped:
            names = self._dropped.setdefault(run_id, set())
            names.update(dropped)
            self._dropped_count[run_id] = self._dropped_count.get(run_id, 0) + len(dropped)
            items.append(
                Metric("n_nonfinite_dropped", float(self._dropped_count[run_id]), ts, step)
            )
            self.set_tags(run_id, {"nonfinite_metrics": ",".join(sorted(names))[:5000]})
        for i in range(0, len(items), 1000):
            self._call(self.client.log_batch, run_id, metrics=items[i : i + 1000])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self._call(self.client.log_artifact, run_id, str(path), artifact_path)

    def log_artifacts(
        self, run_id: str, directory: str | Path, artifact_path: str | None = None
    ) -> None:
        self._call(self.client.log_artifacts, run_id, str(directory), artifact_path)

    def log_text(self, run_id: str, text: str, artifact_file: str) -> None:
        self._call(self.client.log_text, run_id, text, artifact_file)

    def log_table(self, run_id: str, df, artifact_file: str) -> None:
        """Log a DataFrame as a Parquet (``.parquet``) or CSV artifact."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            if path.suffix == ".parquet":
                df.to_parquet(path, index=False)
            else:
                df.to_csv(path, index=False)
            parent = str(Path(artifact_file).parent)
            self.log_artifact(run_id, path, None if parent == "." else parent)

    def log_figure(self, run_id: str, figure, artifact_file: str) -> None:
        self._call(self.client.log_figure, run_id, figure, artifact_file)

    def download_artifact(self, run_id: str, artifact_path: str, dst: str | Path) -> str:
        """Download one artifact into ``dst``; returns the local path."""
        return self._call(self.client.download_artifacts, run_id, artifact_path, str(dst))

    def load_table(self, run_id: str, artifact_file: str):
        """Download and read a Parquet/CSV artifact into a DataFrame."""
        import pandas as pd

        with tempfile.TemporaryDirectory() as tmp:
            local = self._call(self.client.download_artifacts, run_id, artifact_file, tmp)
            return pd.read_parquet(local) if local.endswith(".parquet") else pd.read_csv(local)

    def search_runs(
        self,
        experiment_ids: list[str],
        filter_string: str = "",
        order_by: list[str] | None = None,
        max_results: int = 1000,
    ):
        return self._call(
            self.client.search_runs,
            experiment_ids,
            filter_string,
            max_results=max_results,
            order_by=order_by or ["attributes.start_time DESC"],
        )

    def get_run(self, run_id: str):
        return self._call(self.client.get_run, run_id)

    def find_run(self, run_id: str):
        """The run, or :class:`ModelNotFoundError` ("no run with id …") if it does not exist."""
        return self._lookup(self.client.get_run, run_id, what=f"no run with id {run_id!r}")

    def find_finished_model(self, experiment_id: str, model_key: str):
        """The newest FINISHED model run with this model key whose model files are all in the
        store, or None (a run whose files were deleted is not reused)."""
        from .models.io import MODEL_FILES

        runs = self.search_runs(
            [experiment_id],
            f"tags.model_key = '{model_key}' and "
            "tags.kind = 'model' and attributes.status = 'FINISHED'",
            max_results=20,
        )
        for r in runs:
            if all(
                self.has_artifact(r.info.run_id, f"{MODEL_ARTIFACT_DIR}/{f}") for f in MODEL_FILES
            ):
                return r
        return None

    # --- models ------------------------------------------------------------------------------
    def log_model_dir(self, run_id: str, model_dir: str | Path, name: str = "model") -> str:
        """Log the plain model files under ``model/`` and a "models from code" pyfunc logged model.

        The pyfunc (``attnstudy.serving``, listed in the Models tab, servable with ``mlflow models
        serve``) carries the same four files, the attnstudy package it was logged with (``code/``)
        and pip requirements pinned to the versions installed when it was logged; its ``MLmodel``
        records no path of this machine. Loading it with ``mlflow.pyfunc.load_model`` runs that
        stored code (attnstudy's own loader never does: it reads only the plain files). The model
        is not registered here: :meth:`register_model` does that once the run is FINISHED.

        Args:
            run_id: the (running) model run.
            model_dir: folder holding the four model files.
            name: the logged model's name (e.g. the variant, ``copy-additive-bahdanau``).

        Returns:
            The logged model's id (``m-…``).
        """
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus

        from . import serving

        self.log_artifacts(run_id, model_dir, MODEL_ARTIFACT_DIR)
        package = Path(serving.__file__).parent
        with tempfile.TemporaryDirectory(prefix="attnstudy-pyfunc-") as tmp:
            files = Path(tmp) / "files"
            shutil.copytree(model_dir, files)
            local = Path(tmp) / "pyfunc"
            with deferred_signals():
                mlflow.pyfunc.save_model(
                    path=str(local),
                    python_model=str(package / "serving.py"),
                    artifacts={p.stem: str(p) for p in sorted(files.iterdir()) if p.is_file()},
                    code_paths=[str(package)],
                    pip_requirements=pinned_requirements(),
                )
            _strip_machine_paths(local / "MLmodel")
            exp_id = self.get_run(run_id).info.experiment_id
            model = self._call(
                self.client.create_logged_model,
                exp_id,
                name=name,
                source_run_id=run_id,
                tags={"attnstudy.kind": "model"},
            )
            try:
                self._call(self.client.log_model_artifacts, model.model_id, str(local))
                self._call(
                    self.client.finalize_logged_model, model.model_id, LoggedModelStatus.READY
                )
            except BaseException:
                with deferred_signals():
                    try:
                        self.client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
                    except MlflowException:
                        pass
                raise
        self._call(self.client.log_outputs, run_id, [LoggedModelOutput(model.model_id, 0)])
        return model.model_id

    def register_model(
        self,
        run_id: str,
        model_id: str,
        name: str,
        tags: dict[str, str] | None = None,
        description: str | None = None,
    ) -> str:
        """Register a FINISHED run's logged model as a new version of ``name``.

        Called only after the run has ended FINISHED, so a version never points at a killed run.
        Signals are held for the whole registration, and a registered model this call created is
        deleted again if its first version could not be created (no empty registered model).

        Returns:
            The new version.

        Raises:
            TrackingError: the run is not FINISHED, or the store failed.
        """
        status = self.get_run(run_id).info.status
        if status != "FINISHED":
            raise TrackingError(
                f"run {run_id} is {status}; only a FINISHED run's model is registered"
            )
        with deferred_signals():
            created = False
            try:
                self.client.create_registered_model(name)
                created = True
            except MlflowException as err:
                if err.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise TrackingError(
                        f"could not register model {name!r}: {_first_line(err)}"
                    ) from None
            try:
                # MLflow resolves a models:/<id> source through the process-wide URI: point it here
                with _process_uri(self.uri):
                    mv = self.client.create_model_version(
                        name,
                        source=f"models:/{model_id}",
                        run_id=run_id,
                        model_id=model_id,
                        tags=tags,
                        description=description,
                    )
            except BaseException as err:
                if created:
                    try:
                        if not self.client.search_model_versions(f"name = '{name}'"):
                            self.client.delete_registered_model(name)
                    except MlflowException:
                        pass
                if isinstance(err, MlflowException):
                    raise TrackingError(
                        f"could not register model {name!r}: {_first_line(err)}"
                    ) from None
                raise
        return str(mv.version)

    def download_model_dir(
        self, uri: str, dst: str | Path, allow_unfinished: bool = False
    ) -> tuple[str, Path]:
        """Resolve ``runs:/<id>[/path]``, ``models:/<name>/<version>``, ``models:/<name>/latest`` or
        ``models:/<name>@<alias>`` and download only the weight, config and vocabulary files.

        Returns:
            (run_id, local directory).

        Raises:
            ModelNotFoundError: missing run/model/version/alias, a path leaving the run, or no model files.
            UnfinishedRunError: the run is not FINISHED (unless ``allow_unfinished``).
            TrackingError: the store failed (the message gives the server's answer).
        """
        from .models.io import MODEL_FILES

        run_id, sub = self.resolve_model_uri(uri, allow_unfinished)
        dst = Path(dst)
        dst.mkdir(parents=True, exist_ok=True)
        local = dst
        for f in MODEL_FILES:
            try:
                local = Path(self.client.download_artifacts(run_id, f"{sub}/{f}", str(dst))).parent
            except (MlflowException, OSError):
                raise ModelNotFoundError(
                    f"{uri}: run {run_id} has no model file {sub}/{f}; is it a trained-model run?"
                ) from None
        return run_id, local

    def _lookup(self, fn, *args, what: str):
        """A registry/run lookup: a missing entity is :class:`ModelNotFoundError` (``what`` says
        which), any other failure (a server answering 500, a broken store) a :class:`TrackingError`
        giving the server's answer."""
        try:
            with deferred_signals():
                return fn(*args)
        except MlflowException as err:
            if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "NOT_FOUND") or (
                err.error_code == "INVALID_PARAMETER_VALUE" and not self.uri.startswith("http")
            ):
                raise ModelNotFoundError(f"{what} in {self.uri}") from None
            code = re.search(r"\b([45]\d\d)\b", str(err))
            answer = f"it answered HTTP {code.group(1)}" if code else _first_line(err)
            raise TrackingError(
                f"tracking store {self.uri} failed ({answer}) while looking for "
                f"{what.split(': ', 1)[-1].removeprefix('no ')}; check the server"
            ) from None

    def resolve_model_uri(self, uri: str, allow_unfinished: bool = False) -> tuple[str, str]:
        """(run_id, artifact sub-path holding the model files) for a model URI.

        Raises:
            ModelNotFoundError, UnfinishedRunError, TrackingError: as :meth:`download_model_dir`.
            ConfigError: a malformed URI (unknown scheme, ``models:/NAME`` without version).
        """
        from .config import ConfigError

        if uri.startswith("runs:/"):
            parts = uri[len("runs:/") :].strip("/").split("/", 1)
            run_id = parts[0]
            sub = parts[1] if len(parts) > 1 else MODEL_ARTIFACT_DIR
            pieces = sub.split("/")
            if sub.startswith("/") or any(p in ("", ".", "..") for p in pieces):
                raise ConfigError(
                    f"{uri}: the path inside the run must not hold '..', '.' or empty parts "
                    "(it would leave the run); use runs:/<run_id>[/model]"
                )
            run = self._lookup(
                self.client.get_run, run_id, what=f"{uri}: no run with id {run_id!r}"
            )
        elif uri.startswith("models:/"):
            rest = uri[len("models:/") :].strip("/")
            if "@" in rest:
                name, alias = rest.split("@", 1)
                mv = self._lookup(
                    self.client.get_model_version_by_alias,
                    name,
                    alias,
                    what=f"{uri}: no registered model {name!r} with alias {alias!r}",
                )
            else:
                name, _, version = rest.partition("/")
                if not name or not version:
                    raise ConfigError(
                        f"{uri}: give a version, 'latest' or an alias "
                        "(models:/NAME/1, models:/NAME/latest or models:/NAME@ALIAS)"
                    )
                if version == "latest":
                    versions = self._lookup(
                        self.client.search_model_versions,
                        f"name = '{name}'",
                        what=f"{uri}: no registered model {name!r}",
                    )
                    if not versions:
                        raise ModelNotFoundError(
                            f"{uri}: no registered model {name!r} in {self.uri}"
                        )
                    mv = max(versions, key=lambda v: int(v.version))
                else:
                    mv = self._lookup(
                        self.client.get_model_version,
                        name,
                        version,
                        what=f"{uri}: no version {version!r} of registered model {name!r}",
                    )
            if not mv.run_id:
                raise ModelNotFoundError(f"{uri}: the model version has no source run")
            run_id, sub = mv.run_id, MODEL_ARTIFACT_DIR
            run = self._lookup(
                self.client.get_run, run_id, what=f"{uri}: its run {run_id!r} is gone"
            )
        else:
            raise ConfigError(
                f"unknown model URI {uri!r}; use runs:/<run_id>, models:/<name>/<version> "
                "or models:/<name>@<alias>"
            )
        if run.info.status != "FINISHED" and not allow_unfinished:
            raise UnfinishedRunError(
                f"{uri}: run {run_id} is {run.info.status}{self._owner_note(run)}: its "
                "model may be incomplete; use --force to use it anyway"
            )
        return run_id, sub

    # --- owners of running runs --------------------------------------------------------------
    def _owner_note(self, run) -> str:
        if run.info.status != "RUNNING":
            return ""
        alive = owner_alive(run.data.tags)
        pid = run.data.tags.get(OWNER_PID_TAG, "?")
        if alive is None:
            return f" (owner PID {pid} on {run.data.tags.get(OWNER_HOST_TAG, 'another host')})"
        return (
            f" (still being written by PID {pid})"
            if alive
            else f" (its process {pid} is gone: it was killed)"
        )

    def reconcile_orphans(self, experiment_id: str) -> list[str]:
        """Mark RUNNING runs whose owner process (on this host) is gone as KILLED.

        A SIGKILL, an OOM kill or a full disk can end a process before it closes its runs; the
        next process that writes the experiment closes them, so no dead run looks unfinished forever.

        Returns:
            The run ids marked KILLED.
        """
        runs = self.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000)
        closed = []
        for r in runs:
            if owner_alive(r.data.tags) is False:
                pid = r.data.tags.get(OWNER_PID_TAG)
                self.set_tags(
                    r.info.run_id,
                    {
                        "error.class": "OwnerGone",
                        "error.message": f"process {pid} ended without closing the run",
                        "mlflow.note.content": f"Killed: process {pid} ended without "
                        "closing the run (marked by a later process)",
                    },
                )
                self.end_run(r.info.run_id, "KILLED")
                closed.append(r.info.run_id)
        return closed

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._call(self.client.set_registered_model_alias, name, alias, version)


def pinned_requirements() -> list[str]:
    """attnstudy's own requirements, each pinned to the version installed now (the pyfunc's
    ``requirements.txt``): the attnstudy code itself travels with the model (``code/``), so nothing
    is resolved from a public index by name alone."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement
    from packaging.version import Version

    out = []
    for text in requires("attnstudy") or []:
        req = Requirement(text)
        if req.marker is not None and "extra" in str(req.marker):
            continue
        try:
            out.append(
                f"{req.name}=={Version(version(req.name)).public}"
            )  # torch 2.13.0+cpu → 2.13.0
        except PackageNotFoundError:
            out.append(str(req))
    return out


def _strip_machine_paths(mlmodel: Path) -> None:
    """Drop the absolute source paths MLflow records in an ``MLmodel`` file (the artifacts'
    ``uri`` and the model code's full path; the loader needs only the file name)."""
    import yaml

    doc = yaml.safe_load(mlmodel.read_text(encoding="utf-8"))
    pyfunc = doc.get("flavors", {}).get("python_function", {})
    for art in (pyfunc.get("artifacts") or {}).values():
        if isinstance(art, dict):
            art.pop("uri", None)
    if pyfunc.get("model_code_path"):
        pyfunc["model_code_path"] = Path(pyfunc["model_code_path"]).name
    mlmodel.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")


@contextmanager
def _process_uri(uri: str):
    """Point MLflow's process-wide tracking URI at ``uri`` for one block, then restore it and the
    environment (``mlflow.set_tracking_uri`` also sets ``$MLFLOW_TRACKING_URI``)."""
    old_env = os.environ.get("MLFLOW_TRACKING_URI")
    old_uri = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(old_uri)
        if old_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = old_env


def _non_empty(d: Path) -> bool:
    try:
        return d.is_dir() and any(d.iterdir())
    except OSError:
        return False


def _disk_message(err: Exception, folder: Path) -> str:
    """The first line of a store error, or one line saying the disk is full (SQLite's autoflush
    errors otherwise end in 'raised as a result of Query-invoked autoflush')."""
    text = str(err)
    if "database or disk is full" in text or "No space left" in text:
        return f"the disk holding {folder} is full; free space, then rerun (training resumes with --resume)"
    return _first_line(err)


def _finite(v: Any) -> bool:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return False
    return f == f and f not in (float("inf"), float("-inf"))


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__
