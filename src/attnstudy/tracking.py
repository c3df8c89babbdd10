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

MODEL_ARTIFACT_DIR = "model"
logging.getLogger("mlflow").setLevel(logging.WARNING)  # no INFO chatter on the CLI


class TrackingError(RuntimeError):
    """The tracking store cannot be reached or used; the message names the URI."""


class StoreNotFoundError(LookupError):
    """A verb that reads an existing store found none where it looked (the message says where)."""


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

        raise ConfigError(f"ATTNSTUDY_TRACKING_TIMEOUT={env!r} is not a number of seconds in (0, 3600]")
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
            last = "connection refused" if isinstance(reason, ConnectionRefusedError) else "no answer"
        if time.monotonic() >= deadline:
            raise TrackingError(f"tracking server {uri} did not answer within {timeout:g} s ({last}); "
                                "start it, or point --tracking-uri / MLFLOW_TRACKING_URI elsewhere")
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
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{project_root() / 'mlruns' / 'mlflow.db'}"


def artifact_root() -> Path:
    return project_root() / "mlruns" / "artifacts"


def git_commit() -> str:
    """The project's git commit, or "unknown"."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=project_root(), capture_output=True,
                             text=True, timeout=5)
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
            db = Path(self.uri[len("sqlite:///"):])
            if not create and not db.is_file():
                raise StoreNotFoundError(
                    f"no tracking store at {self.uri}; point to one with --tracking-uri, MLFLOW_TRACKING_URI "
                    "or ATTNSTUDY_ROOT (the folder holding mlruns/), or create one with 'attnstudy train'")
            self._init_sqlite(db)
        elif self.uri.startswith(("http://", "https://")):
            check_server(self.uri, self.timeout)
        # no mlflow.set_tracking_uri here: it also sets $MLFLOW_TRACKING_URI for the whole process
        self.client = MlflowClient(self.uri)

    # --- store -------------------------------------------------------------------------------
    def _init_sqlite(self, db: Path) -> None:
        """Create the SQLite store once, under a file lock (MLflow's schema migration races)."""
        try:
            db.parent.mkdir(parents=True, exist_ok=True)
            with open(db.parent / ".init.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                try:
                    MlflowClient(self.uri).search_experiments(max_results=1)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        except OSError as err:
            raise TrackingError(f"cannot write the tracking store {db}: {err.strerror or err}; "
                                "choose a writable folder (ATTNSTUDY_ROOT) or set MLFLOW_TRACKING_URI") from None
        except MlflowException as err:
            raise TrackingError(f"cannot open the tracking store {self.uri}: {_first_line(err)}") from None

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except MlflowException as err:
            raise TrackingError(f"tracking store {self.uri}: {_first_line(err)}") from None

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

    def start_run(self, experiment_id: str, name: str, tags: dict[str, str] | None = None,
                  parent_run_id: str | None = None) -> str:
        """Create a run (nested under ``parent_run_id``) and return its id."""
        tags = dict(tags or {})
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
            self.end_run(run_id, "KILLED")
            raise
        except BaseException as err:
            message = _first_line(err)
            try:
                self.set_tags(run_id, {"error.class": type(err).__name__, "error.message": message[:500],
                                       "mlflow.note.content": f"Failed: {type(err).__name__}: {message}"})
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
        """Mark an ended run RUNNING again (a study continued with ``--resume``)."""
        self._call(self.client.update_run, run_id, status="RUNNING")

    def find_resumable_study(self, experiment_id: str, study_key: str) -> str | None:
        """The newest KILLED or FAILED study run with this study key, or None."""
        runs = self.search_runs([experiment_id], f"tags.kind = 'study' and tags.study_key = '{study_key}'")
        for r in runs:
            if r.info.status in ("KILLED", "FAILED"):
                return r.info.run_id
        return None

    def finished_ablations(self, study_id: str, ablation_key: str) -> dict[str, str]:
        """Model run id → FINISHED ablation run of this study with this ablation key."""
        exp_id = self.get_run(study_id).info.experiment_id
        runs = self.search_runs([exp_id], f"tags.kind = 'ablation' and tags.study_id = '{study_id}' and "
                                f"tags.ablation_key = '{ablation_key}' and attributes.status = 'FINISHED'")
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
            self._call(self.client.log_batch, run_id, params=items[i:i + 100])

    def log_metrics(self, run_id: str, metrics: dict[str, float], step: int = 0) -> None:
        """Log finite metrics in batches; NaN/inf values are dropped (count them instead)."""
        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items()
                 if v is not None and _finite(v)]
        for i in range(0, len(items), 1000):
            self._call(self.client.log_batch, run_id, metrics=items[i:i + 1000])

    def log_artifact(self, run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
        self._call(self.client.log_artifact, run_id, str(path), artifact_path)

    def log_artifacts(self, run_id: str, directory: str | Path, artifact_path: str | None = None) -> None:
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

    def search_runs(self, experiment_ids: list[str], filter_string: str = "", order_by: list[str] | None = None,
                    max_results: int = 1000):
        return self._call(self.client.search_runs, experiment_ids, filter_string,
                          max_results=max_results, order_by=order_by or ["attributes.start_time DESC"])

    def get_run(self, run_id: str):
        return self._call(self.client.get_run, run_id)

    def find_finished_model(self, experiment_id: str, model_key: str):
        """The newest FINISHED model run with this model key whose model files are all in the
        store, or None (a run whose files were deleted is not reused)."""
        from .models.io import MODEL_FILES

        runs = self.search_runs([experiment_id], f"tags.model_key = '{model_key}' and "
                                "tags.kind = 'model' and attributes.status = 'FINISHED'", max_results=20)
        for r in runs:
            if all(self.has_artifact(r.info.run_id, f"{MODEL_ARTIFACT_DIR}/{f}") for f in MODEL_FILES):
                return r
        return None

    # --- models ------------------------------------------------------------------------------
    def log_model_dir(self, run_id: str, model_dir: str | Path, registered_name: str | None = None) -> str | None:
        """Log the plain model files under ``model/`` and register a pyfunc model.

        The registered model is a "models from code" pyfunc (``attnstudy.serving``) whose
        artifacts are the same four files, so it appears in the Models tab and can be served;
        the project's own loader reads only the plain files.

        Returns:
            the registered model version, or None if registration was not possible.
        """
        self.log_artifacts(run_id, model_dir, MODEL_ARTIFACT_DIR)
        if not registered_name:
            return None
        from . import serving

        code_path = Path(serving.__file__)
        artifacts = {p.stem: str(p) for p in Path(model_dir).iterdir() if p.is_file()}
        try:
            # fluent mlflow uses the process-wide URI: point it here for this block only
            with _fluent_uri(self.uri), mlflow.start_run(run_id=run_id, nested=True):
                info = mlflow.pyfunc.log_model(
                    name="pyfunc", python_model=str(code_path), artifacts=artifacts,
                    pip_requirements=["attnstudy"], registered_model_name=registered_name,
                )
            return str(info.registered_model_version) if info.registered_model_version else None
        except MlflowException as err:
            raise TrackingError(f"could not register model {registered_name!r}: {_first_line(err)}") from None

    def download_model_dir(self, uri: str, dst: str | Path) -> tuple[str, Path]:
        """Resolve ``runs:/<id>[/path]``, ``models:/<name>/<version>`` or ``models:/<name>@<alias>``
        and download only the weight, config and vocabulary files.

        Returns:
            (run_id, local directory).

        Raises:
            TrackingError: unknown scheme, missing run/model/version/alias, or no model files.
        """
        from .models.io import MODEL_FILES

        run_id, sub = self.resolve_model_uri(uri)
        dst = Path(dst)
        dst.mkdir(parents=True, exist_ok=True)
        local = dst
        for f in MODEL_FILES:
            try:
                local = Path(self.client.download_artifacts(run_id, f"{sub}/{f}", str(dst))).parent
            except (MlflowException, OSError):
                raise TrackingError(f"{uri}: run {run_id} has no model file {sub}/{f}; "
                                    "is it a trained-model run?") from None
        return run_id, local

    def resolve_model_uri(self, uri: str) -> tuple[str, str]:
        """(run_id, artifact subdirectory holding the model files) for a model URI."""
        if uri.startswith("runs:/"):
            parts = uri[len("runs:/"):].strip("/").split("/", 1)
            run_id = parts[0]
            sub = parts[1] if len(parts) > 1 else MODEL_ARTIFACT_DIR
            try:
                self.client.get_run(run_id)
            except MlflowException:
                raise TrackingError(f"{uri}: no run with id {run_id!r} in {self.uri}") from None
            return run_id, sub
        if uri.startswith("models:/"):
            rest = uri[len("models:/"):].strip("/")
            try:
                if "@" in rest:
                    name, alias = rest.split("@", 1)
                    mv = self.client.get_model_version_by_alias(name, alias)
                else:
                    name, _, version = rest.partition("/")
                    if not version:
                        raise TrackingError(f"{uri}: give a version or alias (models:/NAME/1 or models:/NAME@ALIAS)")
                    mv = self.client.get_model_version(name, version)
            except MlflowException:
                raise TrackingError(f"{uri}: no such registered model version or alias in {self.uri}") from None
            if not mv.run_id:
                raise TrackingError(f"{uri}: the model version has no source run")
            return mv.run_id, MODEL_ARTIFACT_DIR
        raise TrackingError(f"unknown model URI {uri!r}; use runs:/<run_id>, models:/<name>/<version> "
                            "or models:/<name>@<alias>")

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._call(self.client.set_registered_model_alias, name, alias, version)


@contextmanager
def _fluent_uri(uri: str):
    """Point MLflow's fluent API at ``uri`` for one block, then restore the URI and the
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


def _finite(v: Any) -> bool:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return False
    return f == f and f not in (float("inf"), float("-inf"))


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__
