"""The tracking client: one thin layer over :class:`mlflow.tracking.MlflowClient` through which
every store call passes, so timeouts, retries, signal handling and error messages are bounded in
one place; searches return plain :class:`~attnstudy.tracking.schema.RunRecord` objects.

Store: SQLite ``mlruns/mlflow.db`` with artifacts under ``mlruns/artifacts/``, both absolute,
resolved from the project root (:mod:`attnstudy.runtime.paths`); any tracking URI (``http://…``
included)
can replace it. Metrics and params are logged in batches.
"""

from __future__ import annotations

import errno
import fcntl
import math
import os
import re
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

import mlflow  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402

from attnstudy.runtime.notices import library_log_levels  # noqa: E402
from attnstudy.runtime.paths import artifact_root, default_tracking_uri  # noqa: E402
from attnstudy.runtime.signals import acknowledge_interrupt, check_interrupt, deferred_signals  # noqa: E402
from attnstudy.runtime.store_check import (  # noqa: E402, F401  checked before mlflow loads; re-exported here
    DEFAULT_TIMEOUT,
    StoreNotFoundError,
    TrackingError,
    check_server,
    resolve_timeout,
    server_answer,
    store_not_found,
)

from . import empty_store  # noqa: E402
from .leases import keeper_for  # noqa: E402
from .schema import Metric as MetricName  # noqa: E402
from .schema import RunRecord, Tag  # noqa: E402
from .system_metrics import sampling, sampling_interval  # noqa: E402

# no INFO chatter; store errors reach the user as one TrackingError line (MLflow's own ERROR
# tracebacks, with SQL, would print hundreds of lines for one full disk); the CLI's --verbose
# lets them through (attnstudy.runtime.notices)
library_log_levels()


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
"""The experiment tag MLflow 3's UI reads to choose between its GenAI and model-training views."""
EXPERIMENT_KIND = "custom_model_development"
"""Its value for model training (the UI's "Model training" experiment type)."""


class ServerUnansweredError(TrackingError):
    """A tracking server did not answer an API request (timed out, refused or dropped the
    connection): asking it again would only wait again."""


class StoreDamagedError(TrackingError):
    """The store's database is lost, truncated or not a database: what the user named is
    malformed (exit code 2 at the command line); nothing is written to it."""


class StoreReadOnlyError(TrackingError):
    """The store can be read but not written (a read-only mount or copy, no write permission):
    a verb that writes stops before its first write lands (exit code 1 at the command line).

    Attributes:
        store: the store's URI as the user gave it. reason: why it cannot be written.
    """

    def __init__(self, store: str, reason: str):
        super().__init__(
            f"the tracking store {store} is read-only ({reason}); this command writes to it: use "
            "a writable copy (--tracking-uri, MLFLOW_TRACKING_URI or ATTNSTUDY_ROOT) or get "
            "write access"
        )
        self.store, self.reason = store, reason


class ModelNotFoundError(LookupError):
    """The named run, registered model, version, alias or model file does not exist."""


class UnfinishedRunError(LookupError):
    """The named model run is RUNNING, KILLED or FAILED: its model may be incomplete."""


class DeletedError(LookupError):
    """The named experiment or run is deleted: in the store's trash (its lifecycle stage is
    ``deleted``), restorable until the store is garbage-collected; nothing is written to it."""


def deleted_experiment_message(
    name: str, experiment_id: str, uri: str, *, reading: bool, other: str | None = None
) -> str:
    """One line naming a deleted experiment and the ways out: restore it, or use another name
    (``reading``: a verb that names the experiment with ``--experiment``; else the experiment
    file's ``experiment.name``; ``other``: another way out instead of these)."""
    other = other or ("name another experiment" if reading else "set another experiment.name")
    return (
        f"experiment {name!r} is deleted (in the store's trash); restore it (mlflow experiments "
        f"restore --experiment-id {experiment_id} with MLFLOW_TRACKING_URI={uri}, or "
        f"MlflowClient().restore_experiment({experiment_id!r})) or {other}"
    )


def deleted_run_message(
    what: str, run_id: str, uri: str, again: str = "train the model again"
) -> str:
    """One line naming a deleted run (``what``: how the user named it) and the ways out
    (restore it, or ``again``)."""
    run = "the run" if run_id in what else f"its run {run_id}"
    return (
        f"{what}: {run} is deleted (in the store's trash); restore it (mlflow runs "
        f"restore --run-id {run_id} with MLFLOW_TRACKING_URI={uri}, or "
        f"MlflowClient().restore_run({run_id!r})) or {again}"
    )


def deleted_run_error(
    tracker: Tracker, what: str, run, again: str = "train the model again"
) -> DeletedError | None:
    """Why the run ``what`` names cannot be used because something is in MLflow's trash, or None:
    its experiment is deleted (named first: deleting an experiment deletes its runs too, and
    restoring only the run leaves the experiment deleted, which MLflow refuses to write to), or
    the run itself is deleted (:func:`deleted_run_message`).

    Args:
        run: the run's :class:`RunRecord` (``experiment_id``, ``lifecycle_stage``).
    """
    try:
        exp = tracker.client.get_experiment(run.experiment_id)
    except MlflowException:
        exp = None  # a missing experiment: the run's own check (or the store) says what is wrong
    if exp is not None and exp.lifecycle_stage == "deleted":
        message = deleted_experiment_message(
            exp.name, exp.experiment_id, tracker.uri, reading=True, other="name another model"
        )
        return DeletedError(f"{what}: the run's {message}")
    if run.lifecycle_stage == "deleted":
        return DeletedError(deleted_run_message(what, run.run_id, tracker.uri, again))
    return None


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
        Tag.OWNER_HOST: socket.gethostname(),
        Tag.OWNER_PID: str(os.getpid()),
        Tag.OWNER_START: _process_start(os.getpid()) or "unknown",
    }


def owner_alive(tags: dict[str, str]) -> bool | None:
    """Whether the process named by a run's owner tags still runs: None if it is on another host
    (or the run has no owner tags), else True/False (a reused PID is told apart by its start time)."""
    import socket

    host, pid, start = tags.get(Tag.OWNER_HOST), tags.get(Tag.OWNER_PID), tags.get(Tag.OWNER_START)
    if host != socket.gethostname() or not (pid or "").isdigit():
        return None
    now = _process_start(int(pid))
    return now is not None and (start in (None, "unknown") or now == start)


def read_only_sqlite_uri(db: Path) -> str:
    """The SQLAlchemy URI that opens the SQLite database ``db`` (an absolute path) in SQLite's
    read-only mode (``file:…?mode=ro`` with ``uri=true``).

    The scheme names the driver (``sqlite+pysqlite``): MLflow creates the folders of a
    ``sqlite:///`` URI's path before it connects and would take ``file:/…`` for a relative path
    (a tree named ``file:`` in the working directory). The path is escaped for SQLite's URI
    (``?``, ``#``, ``%``, spaces) and again for SQLAlchemy, which decodes the database part once.
    """
    import urllib.parse

    for_sqlite = urllib.parse.quote(str(db), safe="/")
    return f"sqlite+pysqlite:///file:{urllib.parse.quote(for_sqlite, safe='/')}?mode=ro&uri=true"


class Tracker:
    """A thin layer over :class:`mlflow.tracking.MlflowClient`.

    Args:
        uri: tracking URI (default: ``$MLFLOW_TRACKING_URI``, else the project's SQLite store).
        timeout: seconds to wait for a remote server before failing (``TrackingError``); default
            :func:`resolve_timeout`.
        create: create the SQLite store if it does not exist; verbs that only read an existing
            store pass False and get :class:`StoreNotFoundError` instead of a new, empty store.
        run_tags: tags set on every run this tracker starts (a cluster task marks its runs, so
            its driver can close what a dead worker left RUNNING).

    Raises:
        TrackingError: the store cannot be created or reached.
        StoreNotFoundError: ``create=False`` and there is no store at the URI.
        ValueError: an in-memory or file store URI, or a bad ``$ATTNSTUDY_TRACKING_TIMEOUT``.
        ConfigError: a bad ``$ATTNSTUDY_SYSTEM_METRICS`` or ``$ATTNSTUDY_SYSTEM_METRICS_SECONDS``.
    """

    def __init__(
        self,
        uri: str | None = None,
        timeout: float | None = None,
        create: bool = True,
        run_tags: dict[str, str] | None = None,
    ):
        from ..config import check_tracking_uri, sqlite_database

        self.run_tags = dict(run_tags or {})
        self.system_interval = sampling_interval()  # system/* metrics of a run, None: off
        self.uri = check_tracking_uri(uri or default_tracking_uri())
        self.display_uri = self.uri  # as the user gave it
        self.client_uri = self.uri  # what MLflow opens (a read-only store's differs)
        self.timeout = resolve_timeout(timeout)
        db = sqlite_database(self.uri)
        # where new experiments keep their artifacts: beside a SQLite database (never the working
        # directory's project when the database is elsewhere); the project's for other databases
        self.artifact_root = artifact_root() if db is None else db.parent / "artifacts"
        if db is not None:
            if not create and not db.is_file():
                raise store_not_found(self.uri)
            self._init_sqlite(db, create)
        elif self.uri.startswith(("http://", "https://")):
            check_server(self.uri, self.timeout)
            # every API request waits at most the timeout, once: a server that answers /health
            # but hangs in its API must not cost retries × timeout per call
            os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(max(1, math.ceil(self.timeout)))
            os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        # no mlflow.set_tracking_uri here: it also sets $MLFLOW_TRACKING_URI for the whole process;
        # the registry is the same store (MLflow's default would follow the process-wide URI)
        self.client = MlflowClient(self.client_uri, registry_uri=self.client_uri)
        # a server's runs carry a lease this process renews while they run (tracking/leases.py)
        self._leases = keeper_for(self.uri, self.client)
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
            raise StoreDamagedError(
                f"the tracking database {db} is {state} but {root} holds artifacts or checkpoints: "
                "the database was lost or truncated; restore it from a backup, or move "
                f"{root} aside to start a new store"
            )
        if not create:
            if not os.access(db, os.W_OK) or not os.access(root, os.W_OK):
                self.client_uri = read_only_sqlite_uri(db)
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
        try:
            with empty_store.new_sqlite_file(db.parent, ".mlflow.db.") as tmp:
                with deferred_signals():
                    empty_store.create(tmp)
                os.replace(tmp, db)
        except MlflowException as err:
            raise TrackingError(
                f"cannot create the tracking store {db}: {_disk_message(err, db.parent)}"
            ) from None

    def _check_open(self, db: Path) -> None:
        from sqlalchemy.exc import DatabaseError

        try:
            with deferred_signals():
                MlflowClient(self.client_uri).search_experiments(max_results=1)
        except DatabaseError as err:  # SQLite's "file is not a database" is not an MlflowException
            raise StoreDamagedError(
                f"the tracking database {db} cannot be read ({err.orig}); point --tracking-uri "
                "at the store's mlflow.db, or restore it from a backup"
            ) from None
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
            if "readonly database" in str(err):  # SQLite refused a write (SQLAlchemy's text)
                raise StoreReadOnlyError(self.display_uri, "its database is read-only") from None
            if (unanswered := self._unanswered(err)) is not None:
                raise ServerUnansweredError(unanswered) from None
            raise TrackingError(
                f"tracking store {self.uri}: {_disk_message(err, self.artifact_root.parent)}"
            ) from None
        except OSError as err:  # an artifact written to a read-only folder
            name = getattr(fn, "__name__", "")
            if err.errno not in _READ_ONLY_ERRNOS or name.startswith(_READS):
                raise
            where = f": {Path(err.filename).parent}" if err.filename else ""  # not the temp name
            raise StoreReadOnlyError(self.display_uri, f"{err.strerror or err}{where}") from None

    def _unanswered(self, err: Exception) -> str | None:
        """One line for a server that did not answer an API request (a timeout, a refused or
        dropped connection, HTTP 500 or 503 after MLflow's retries), naming the cause and what
        to do; None for any other error.

        An HTTP 5xx answer is told apart by the server's ``/health`` (one request,
        :func:`server_answer`): ``attnstudy server`` answers 503 there naming the database or the
        artifact store that is down; MLflow itself answers 503 to the API while its database
        does not answer.
        """
        text = str(err)
        if (status := re.search(r"too many (50[03]) error responses", text)) is not None:
            return server_answer(self.uri, int(status.group(1)), min(5.0, self.timeout))
        if "ReadTimeout" in text or "ConnectTimeout" in text or "timed out" in text:
            return (
                f"tracking server {self.uri} did not answer within {self.timeout:g} s "
                "(--tracking-timeout); check that it and its database are running, then run the "
                "command again (a study: --resume)"
            )
        if any(
            cause in text
            for cause in ("NewConnectionError", "Connection refused", "RemoteDisconnected")
        ):
            return (
                f"tracking server {self.uri} stopped answering (connection refused or dropped); "
                "restart it, then run the command again (a study: --resume)"
            )
        return None

    def _call_racing(self, fn, *args, **kwargs):
        """:meth:`_call` retried (at most :data:`RACE_RETRIES` times) after a unique-key
        violation: MLflow creates datasets and registered-model aliases by look-up-then-insert,
        so two workers writing the same row at once (Ray against one server) race, and the
        loser's insert violates the key. The retry finds the winner's row (linking a dataset and
        setting an alias are idempotent). Any other error is raised at once.
        """
        for attempt in range(RACE_RETRIES + 1):
            try:
                return self._call(fn, *args, **kwargs)
            except TrackingError as err:
                if attempt == RACE_RETRIES or not is_duplicate_key(err):
                    raise
                time.sleep(0.2 * (attempt + 1))

    # --- experiments and runs ----------------------------------------------------------------
    def experiment_id(self, name: str, create: bool = True) -> str | None:
        """Id of the experiment ``name`` (created with an explicit artifact location if missing).

        With ``create`` (the writing verbs), the experiment is also marked as model training
        (:data:`EXPERIMENT_KIND`), so the MLflow UI opens it in its training views, not the GenAI
        ones; an experiment made by an older version is marked the first time it is written.

        Raises:
            DeletedError: the experiment is deleted (never written to, never re-created).
            TrackingError: the store failed.
        """
        exp = self._call(self.client.get_experiment_by_name, name)
        if exp is not None and exp.lifecycle_stage == "deleted":
            raise DeletedError(
                deleted_experiment_message(name, exp.experiment_id, self.uri, reading=not create)
            )
        if exp is not None:
            if create and exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
                self._call(
                    self.client.set_experiment_tag,
                    exp.experiment_id,
                    EXPERIMENT_KIND_TAG,
                    EXPERIMENT_KIND,
                )
            return exp.experiment_id
        if not create:
            return None
        location = None
        if not self.uri.startswith(("http://", "https://")):
            location = (self.artifact_root / name).as_uri()
        try:
            return self.client.create_experiment(
                name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            )
        except MlflowException:  # created concurrently by another process
            return self._call(self.client.get_experiment_by_name, name).experiment_id

    def artifact_location(self, experiment_id: str) -> str:
        """Where an experiment's runs keep their artifacts (``mlflow-artifacts:/…`` when a tracking
        server proxies them, a path or URI of the server's disk otherwise)."""
        return self._call(self.client.get_experiment, experiment_id).artifact_location

    def set_experiment_tags(self, experiment_id: str, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self._call(self.client.set_experiment_tag, experiment_id, k, str(v))

    def start_run(
        self,
        experiment_id: str,
        name: str,
        tags: dict[str, str] | None = None,
        parent_run_id: str | None = None,
    ) -> str:
        """Create a run (nested under ``parent_run_id``) and return its id."""
        tags = dict(tags or {}) | owner_tags() | self.run_tags
        if self._leases is not None:
            tags |= self._leases.start_tags()
        if parent_run_id:
            tags[Tag.PARENT] = parent_run_id
        run = self._call(self.client.create_run, experiment_id, run_name=name, tags=tags)
        if self._leases is not None:
            self._leases.keep(run.info.run_id)
        return run.info.run_id

    def end_run(self, run_id: str, status: str = "FINISHED") -> None:
        """Mark a run FINISHED, FAILED or KILLED."""
        self._call(self.client.set_terminated, run_id, status=status)
        if self._leases is not None:
            self._leases.release(run_id)

    @contextmanager
    def active(self, run_id: str):
        """Close ``run_id`` as FINISHED when the block completes, KILLED on Ctrl-C/SIGTERM
        (KeyboardInterrupt) and FAILED on any other error, so no unfinished run looks complete.

        An interrupt always ends the run before it travels on: one Python dropped inside a
        finalizer during the block (it is only remembered, see
        :func:`attnstudy.runtime.signals.request_interrupt`) is raised before the run is closed, so
        the run
        ends KILLED; one arriving while the block's run is being closed FINISHED lets that write
        finish (or redoes it) and is raised after it.

        A FAILED run is tagged with the error (``error.class``, ``error.message`` and the run's
        description ``mlflow.note.content``), and the exception gets a ``failed_run_id`` attribute
        naming the innermost run it failed.
        """
        finished = False  # the block completed: the run is being closed FINISHED
        try:
            yield run_id
            check_interrupt()  # one dropped in a finalizer during the block counts as during it
            finished = True
            self.end_run(run_id, "FINISHED")
        except KeyboardInterrupt:
            acknowledge_interrupt()
            # a second signal waits until the run is ended (the write holds signals)
            self.end_run(run_id, "FINISHED" if finished else "KILLED")
            raise
        except BaseException as err:
            if finished:  # the store failed while closing a completed run: nothing more to write
                raise
            message = _first_line(err)
            try:
                self.set_tags(
                    run_id,
                    {
                        Tag.ERROR_CLASS: type(err).__name__,
                        Tag.ERROR_MESSAGE: message[:500],
                        Tag.NOTE: f"Failed: {type(err).__name__}: {message}",
                    },
                )
            except TrackingError:
                pass  # the store itself failed: ending the run below reports it
            if not hasattr(err, "failed_run_id"):  # the innermost run names the failure
                try:
                    err.failed_run_id = run_id
                except AttributeError:
                    pass
            self.end_run(run_id, "FAILED")
            raise

    def reopen_run(self, run_id: str) -> None:
        """Mark an ended run RUNNING again, owned by this process (a study continued with
        ``--resume``), without the error tags of its end (``error.class=OwnerGone`` from the
        orphan clean-up, ``error.message``, ``failed``): the resume writes its own if it fails."""
        stale = (Tag.ERROR_CLASS, Tag.ERROR_MESSAGE, Tag.FAILED)
        for key in set(stale) & set(self.get_run(run_id).tags):
            self._call(self.client.delete_tag, run_id, key)
        tags = owner_tags()
        if self._leases is not None:
            tags |= self._leases.start_tags()
        self.set_tags(run_id, tags)
        self._call(self.client.update_run, run_id, status="RUNNING")
        if self._leases is not None:
            self._leases.keep(run_id)

    def run_files(self, run: RunRecord, folder: str = "") -> set[str]:
        """The paths of the files directly in ``folder`` of a run's own artifacts, listed at
        ``run.artifact_uri`` (no lookup of the run, as :meth:`has_artifact` makes each time: for
        many runs read in bulk). Not its logged models' files, which live elsewhere in MLflow 3.

        Raises:
            TrackingError: the artifact store cannot be read.
        """
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        if not run.artifact_uri:  # a record made without one
            files = self._call(self.client.list_artifacts, run.run_id, folder or None)
        else:
            repo = get_artifact_repository(run.artifact_uri, tracking_uri=self.client_uri)
            files = self._call(repo.list_artifacts, folder or None)
        return {f.path for f in files if not f.is_dir}

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

    def log_metrics(
        self,
        run_id: str,
        metrics: dict[str, float],
        step: int = 0,
        model_id: str | None = None,
        dataset: tuple[str, str] | None = None,
    ) -> None:
        """Log finite metrics in batches (MLflow refuses NaN/inf).

        A non-finite value is never dropped silently: the run's ``n_nonfinite_dropped`` metric counts
        them and its ``nonfinite_metrics`` tag names the keys.

        Args:
            model_id: the logged model (``m-…``) the metrics describe: they appear on its page.
            dataset: (name, digest) of the logged dataset they were measured on
                (:func:`attnstudy.tracking.datasets.log_splits`).
        """
        ts = int(time.time() * 1000)
        name, digest = dataset if dataset is not None else (None, None)
        items = [
            Metric(
                k,
                float(v),
                ts,
                step,
                model_id=model_id,
                dataset_name=name,
                dataset_digest=digest,
            )
            for k, v in metrics.items()
            if v is not None and _finite(v)
        ]
        dropped = sorted(k for k, v in metrics.items() if v is not None and not _finite(v))
        if dropped:
            names = self._dropped.setdefault(run_id, set())
            names.update(dropped)
            self._dropped_count[run_id] = self._dropped_count.get(run_id, 0) + len(dropped)
            items.append(
                Metric(MetricName.N_NONFINITE, float(self._dropped_count[run_id]), ts, step)
            )
            self.set_tags(run_id, {Tag.NONFINITE: ",".join(sorted(names))[:5000]})
        for i in range(0, len(items), 1000):
            self._call(self.client.log_batch, run_id, metrics=items[i : i + 1000])

    def system_metrics(self, run_id: str):
        """A context manager: within it, the CPU and memory of this process and the machine are
        logged as the run's ``system/*`` metrics, every ``$ATTNSTUDY_SYSTEM_METRICS_SECONDS`` and
        at its end (:mod:`attnstudy.tracking.system_metrics`; nothing with
        ``$ATTNSTUDY_SYSTEM_METRICS=0``)."""
        return sampling(self.client, run_id, self.system_interval)

    def progress_sink(self, run_id: str):
        """A sink for :func:`attnstudy.runtime.progress.reporting`: logs the run's
        ``progress/fraction``
        (0 to 1; its step is the whole seconds since the sink was made), so the MLflow UI shows
        how far a RUNNING run is."""
        t0 = time.monotonic()

        def sink(fraction: float) -> None:
            self.log_metrics(
                run_id, {MetricName.PROGRESS: fraction}, step=int(time.monotonic() - t0)
            )

        return sink

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

    def log_mlflow_table(self, run_id: str, df, artifact_file: str) -> None:
        """Log a DataFrame as ``mlflow.log_table`` does (JSON ``split`` orient, listed in the run's
        ``mlflow.loggedArtifacts`` tag so the UI shows it as a table), but *replacing* an earlier
        file of that name: MLflow's own ``log_table`` appends, so a rebuilt report would double
        its rows."""
        import json

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(artifact_file).name
            df.to_json(path, orient="split", index=False, date_format="iso")
            parent = str(Path(artifact_file).parent)
            self.log_artifact(run_id, path, None if parent == "." else parent)
        tags = self.get_run(run_id).tags
        listed = json.loads(tags.get("mlflow.loggedArtifacts", "[]"))
        entry = {"path": artifact_file, "type": "table"}
        if entry not in listed:
            self.set_tags(run_id, {"mlflow.loggedArtifacts": json.dumps([*listed, entry])})

    def log_inputs(self, run_id: str, datasets) -> None:
        self._call(self.client.log_inputs, run_id, datasets)

    def download_artifact(self, run_id: str, artifact_path: str, dst: str | Path) -> str:
        """Download one artifact into ``dst``; returns the local path."""
        return self._call(self.client.download_artifacts, run_id, artifact_path, str(dst))

    def delete_artifacts(self, run_id: str, artifact_path: str) -> None:
        """Remove a run's artifact file or folder ``artifact_path`` (one the tool wrote: an
        ablation run's batch files once it finished).

        Raises:
            TrackingError: the artifact store cannot delete (the message says so).
        """

        def delete() -> None:
            repo = self.client._tracking_client._get_artifact_repo(run_id)
            repo.delete_artifacts(artifact_path)

        try:
            self._call(delete)
        except (AttributeError, NotImplementedError, OSError) as err:
            raise TrackingError(
                f"tracking store {self.uri} cannot delete artifacts ({err})"
            ) from None

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
        max_results: int | None = None,
        *,
        deleted: bool = False,
    ) -> list[RunRecord]:
        """Runs matching an MLflow filter (newest first unless ``order_by`` says otherwise): all
        of them, asked page by page (:data:`SEARCH_PAGE` runs a request, MLflow's page token), or
        the first ``max_results``.

        Args:
            deleted: also the runs in the store's trash (as :meth:`get_run` returns them).
        """
        from mlflow.entities import ViewType

        view = ViewType.ALL if deleted else ViewType.ACTIVE_ONLY
        out: list[RunRecord] = []
        token = None
        while max_results is None or len(out) < max_results:
            n = SEARCH_PAGE if max_results is None else min(SEARCH_PAGE, max_results - len(out))
            page = self._call(
                self.client.search_runs,
                experiment_ids,
                filter_string,
                run_view_type=view,
                max_results=n,
                order_by=order_by or ["attributes.start_time DESC"],
                page_token=token,
            )
            out += [RunRecord.of(r) for r in page]
            token = page.token
            if not token:
                break
        return out

    def runs_by_id(self, experiment_ids: list[str], run_ids: list[str]) -> list[RunRecord]:
        """The runs with these ids, in their order, read in bulk (one search per
        :data:`IDS_PER_SEARCH` ids, trash included, instead of a request per run); an id not
        found in ``experiment_ids`` is read alone (:meth:`get_run`: a store error if it does not
        exist)."""
        found: dict[str, RunRecord] = {}
        wanted = list(dict.fromkeys(run_ids))
        for i in range(0, len(wanted), IDS_PER_SEARCH):
            chunk = ", ".join(f"'{r}'" for r in wanted[i : i + IDS_PER_SEARCH] if r.isalnum())
            if chunk:
                for r in self.search_runs(
                    experiment_ids, f"attributes.run_id IN ({chunk})", deleted=True
                ):
                    found[r.run_id] = r
        return [found[r] if r in found else self.get_run(r) for r in run_ids]

    def delete_tags(self, run_id: str, keys: list[str]) -> None:
        """Remove tags from a run (a key it does not carry is skipped)."""
        for key in keys:
            try:
                self._call(self.client.delete_tag, run_id, key)
            except TrackingError as err:
                if "No tag with name" not in str(err):
                    raise

    def get_run(self, run_id: str) -> RunRecord:
        """A run by id (a store error if it does not exist: use :meth:`find_run` for a user's id)."""
        return RunRecord.of(self._call(self.client.get_run, run_id))

    def find_run(self, run_id: str, again: str = "name another run") -> RunRecord:
        """The run, or :class:`ModelNotFoundError` ("no run with id …") if it does not exist,
        :class:`DeletedError` if it is deleted (its message ends with the way out ``again``)."""
        run = RunRecord.of(
            self._lookup(self.client.get_run, run_id, what=f"no run with id {run_id!r}")
        )
        if run.lifecycle_stage == "deleted":
            raise DeletedError(deleted_run_message(f"runs:/{run_id}", run_id, self.uri, again))
        return run

    def metric_history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``(step, value)`` of every logged value of a metric, by step."""
        return sorted(
            (m.step, m.value) for m in self._call(self.client.get_metric_history, run_id, key)
        )

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
            if (unanswered := self._unanswered(err)) is not None:
                raise ServerUnansweredError(unanswered) from None
            code = re.search(r"\b([45]\d\d)\b", str(err))
            answer = f"it answered HTTP {code.group(1)}" if code else _first_line(err)
            raise TrackingError(
                f"tracking store {self.uri} failed ({answer}) while looking for "
                f"{what.split(': ', 1)[-1].removeprefix('no ')}; check the server"
            ) from None

    def model_versions(self, name: str) -> list:
        """Every version of registered model ``name`` (MLflow ``ModelVersion`` entities)."""
        return self._call(self.client.search_model_versions, f"name = '{name}'")

    def set_version_tags(self, name: str, version: str, tags: dict[str, str]) -> None:
        """Set tags on one registered model version."""
        for k, v in tags.items():
            self._call(self.client.set_model_version_tag, name, version, k, str(v))

    def set_alias(self, name: str, alias: str, version: str) -> None:
        """Point ``models:/<name>@<alias>`` at ``version`` (two seeds of one model registered at
        once both set ``best``: the race is retried, see :meth:`_call_racing`)."""
        self._call_racing(self.client.set_registered_model_alias, name, alias, version)


_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
"""An artifact write that failed with one of these met a store that cannot be written."""
_READS = ("get", "search", "list", "download")
"""Store calls that only read the store (an OSError there is about somewhere else)."""

RACE_RETRIES = 3
"""Retries of a store write after a concurrent writer inserted the same row first."""

SEARCH_PAGE = 1000
"""Runs asked of the store per request of :meth:`Tracker.search_runs` (MLflow's default page; a
server answers at most 50,000)."""
IDS_PER_SEARCH = 100
"""Run ids per ``attributes.run_id IN (…)`` search of :meth:`Tracker.runs_by_id`."""


def is_duplicate_key(err: Exception) -> bool:
    """Whether a store error is a unique-key violation (PostgreSQL or SQLite wording)."""
    text = str(err).lower()
    return "unique" in text and ("violat" in text or "constraint" in text)


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
    from attnstudy.runtime.failure_causes import clip

    text = str(err).strip().splitlines()
    return clip(text[0]) if text else type(err).__name__
