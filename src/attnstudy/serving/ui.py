"""``attnstudy ui``: the MLflow UI for the project's store, as a child process.

One worker and job execution off (starts in seconds with ~0.5 GB instead of ~15 s and 2.5 GB);
binds 127.0.0.1 unless told otherwise; the printed URL opens the experiment's training-runs view
(MLflow 3 opens in GenAI mode otherwise) with every run shown. Ctrl-C stops the server and its
children.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from attnstudy.serving.ui_guard import proc_table, release_guard, start_guard


def free_port(host: str = "127.0.0.1") -> int:
    """A currently free TCP port on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_host(host: str) -> str:
    """The host to bind, if it is a non-empty name or address that resolves.

    Raises:
        ValueError: empty (the server would listen on every interface) or unresolvable.
    """
    if not host.strip():
        raise ValueError(
            "--host is empty; give an address to bind, e.g. 127.0.0.1 (this machine only)"
        )
    try:
        socket.getaddrinfo(host, None)
    except (socket.gaierror, UnicodeError) as err:
        raise ValueError(
            f"--host {host!r} does not resolve ({err.strerror if hasattr(err, 'strerror') else err}); "
            "give an address such as 127.0.0.1"
        ) from None
    return host


def port_in_use(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (0.5 s timeout)."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def start_server(
    backend_uri: str,
    artifacts_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int = 5000,
    log_path: Path | None = None,
) -> subprocess.Popen:
    """Start ``mlflow server`` in its own process group.

    Args:
        backend_uri: tracking store (``sqlite:///…``).
        artifacts_dir: where experiments created through the server keep artifacts.
        host, port: where to listen.
        log_path: server output goes here (default: discarded).

    Returns:
        The running process (stop it with :func:`stop_server`).
    """
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        backend_uri,
        "--artifacts-destination",
        artifacts_dir.as_uri(),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(
        cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    # the guardian holds the read end of a pipe only this process writes to: when this process ends,
    # however it ends, the guardian stops the server's group (attnstudy.serving.ui_guard)
    proc.guard = start_guard(proc.pid)  # type: ignore[attr-defined]
    return proc


def wait_healthy(
    base_url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None
) -> None:
    """Wait until ``GET /health`` answers 200.

    Raises:
        RuntimeError: the server exited or did not answer within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"the mlflow server exited (code {proc.returncode}) before answering at {base_url}: "
                "is the address one of this machine's, and the store readable?"
            )
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"mlflow server at {base_url} did not answer within {timeout:.0f} s")


def stop_server(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Terminate the server's whole process group (gunicorn/uvicorn children included).

    SIGTERM first; whatever is still in the group after ``timeout`` seconds (a worker stuck in a
    graceful shutdown, say) gets SIGKILL. Returns once the group is gone.
    """
    pgid = proc.pid  # start_server makes the server a session (and group) leader
    deadline = time.monotonic() + timeout
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    while time.monotonic() < deadline:
        proc.poll()
        if not _group_alive(pgid):
            break
        time.sleep(0.1)
    else:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:  # unkillable (uninterruptible sleep): nothing more to do
        pass
    guard = getattr(proc, "guard", None)
    if guard is not None:
        release_guard(guard, timeout)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` (zombies aside) still exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not Path("/proc").is_dir():
        return True
    return any(p.pgid == pgid and p.state != "Z" for p in proc_table().values())


STARTING = "the page answers once MLflow has started (seconds; a minute on a busy machine)"
"""What ``attnstudy ui`` says with its URL, printed before the server answers."""
READY = "MLflow UI: ready"
"""The line ``attnstudy ui`` prints once the server answers."""


def experiment_link_id(tracker, name: str) -> str | None:
    """The id of experiment ``name``, read from the store itself so the URL can be printed before
    the UI's server answers; None, with a note, when the store has no such experiment or it is
    deleted (the URL then opens the list of experiments).

    Args:
        tracker: the store's :class:`attnstudy.tracking.Tracker`.
    """
    from attnstudy.runtime.notices import notice
    from attnstudy.tracking import DeletedError

    try:
        exp_id = tracker.experiment_id(name, create=False)
    except DeletedError as err:
        notice(f"{err}; the UI opens on the list of experiments")
        return None
    if exp_id is None:
        notice(
            f"no experiment {name!r} in the store; the UI opens on the list of experiments "
            "(--experiment NAME opens one)"
        )
    return exp_id


def experiment_id_by_name(base_url: str, name: str) -> str | None:
    """Experiment id through a running server's REST API, or None if there is no such
    experiment (``attnstudy ui`` reads it from the store, before its server answers)."""
    q = urllib.parse.urlencode({"experiment_name": name})
    try:
        with urllib.request.urlopen(
            f"{base_url}/api/2.0/mlflow/experiments/get-by-name?{q}", timeout=5
        ) as r:
            return json.load(r)["experiment"]["experiment_id"]
    except (urllib.error.URLError, OSError, KeyError, ValueError):
        return None


TRAINING_VIEW_QUERY = "workflowType=machine_learning"
"""MLflow 3's training views (every page of its UI opens in GenAI mode without it)."""

RUNS_VIEW_QUERY = f"{TRAINING_VIEW_QUERY}&orderByKey=tags.%60mlflow.runName%60&orderByAsc=true"
"""The runs view's settings in its URL: MLflow 3's training views (it opens in GenAI mode
otherwise), sorted by run name. MLflow's UI nests child runs under their parent (study → model
→ ablations, one collapsed row per study) only while the runs are sorted by time, and has no URL
setting to expand them (its shared view state leaves ``runsExpanded`` out); sorted by name, every
run is a row of its own and each model run sits beside its ablation run (checked on MLflow
3.17.2's UI)."""


def runs_view_url(base_url: str, experiment_id: str | None) -> str:
    """URL of the experiment's training-runs view, every run shown (:data:`RUNS_VIEW_QUERY`), or
    of the experiment list (in the training views too: :data:`TRAINING_VIEW_QUERY`)."""
    if experiment_id is None:
        return f"{base_url}/#/experiments?{TRAINING_VIEW_QUERY}"
    return f"{base_url}/#/experiments/{experiment_id}/runs?{RUNS_VIEW_QUERY}"


UI_ADDRESS_FILE = "ui-address"
"""Beside a SQLite store's database: the address ``attnstudy ui`` last served that store at
(``http://HOST:PORT``, one line), so a report built from the store links to the port the UI runs
on (:func:`recorded_address`; ``attnstudy report --ui-url`` and ``$ATTNSTUDY_UI_URL`` win)."""

_ADDRESS = re.compile(r"^https?://[^\s/#?]+$")


def record_address(database: Path, base_url: str) -> None:
    """Write ``base_url`` into :data:`UI_ADDRESS_FILE` beside ``database`` (atomically: a
    temporary file of its own, renamed over it). A file of that name that is not such a record
    (another address line is one) is a user's and is left as it is, as is a store that cannot be
    written: the report then links to the default address."""
    import tempfile

    target = database.parent / UI_ADDRESS_FILE
    if (target.exists() or target.is_symlink()) and not _is_record(target):
        return
    try:
        fd, name = tempfile.mkstemp(prefix=f".{UI_ADDRESS_FILE}.", dir=database.parent)
    except OSError:
        return
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(base_url + "\n")
        os.replace(tmp, target)
    except OSError:
        tmp.unlink(missing_ok=True)


def _is_record(path: Path) -> bool:
    """Whether ``path`` is a plain file holding one address line as :func:`record_address`
    writes it (read at most 1 kB)."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with path.open("rb") as f:
            text = f.read(1024).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return text.endswith("\n") and text.count("\n") == 1 and bool(_ADDRESS.match(text[:-1]))


def recorded_address(database: Path) -> str | None:
    """The address :func:`record_address` wrote beside ``database``, or None when there is none
    (or it is not one ``http(s)://HOST:PORT`` line, or cannot be read)."""
    try:
        text = (database.parent / UI_ADDRESS_FILE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _ADDRESS.match(text) else None
