"""``attnstudy server``: a team's MLflow tracking server, started the way the field runs one.

``mlflow server`` with a database backend store (PostgreSQL through psycopg 3:
``postgresql+psycopg://USER@HOST:PORT/DB``; SQLAlchemy 2.1 also reads a plain ``postgresql://`` as
psycopg 3) and ``--artifacts-destination DIR``, so clients and cluster workers reach artifacts only
through the server (``mlflow-artifacts:`` proxying), never through a disk path. Job execution is
off. One worker by default, so only this one process opens the database and only it creates or
migrates the schema (several processes opening a fresh store at once fail: 2 of 12 on SQLite, 3 of
12 on PostgreSQL, measured); ``--workers N`` (uvicorn's workers, as ``mlflow server --workers``)
is refused unless the schema is already at this MLflow's revision (``mlflow db upgrade`` has run:
:func:`attnstudy.serving.server_app.schema_problem`). It binds 127.0.0.1 unless told otherwise: the
server has no
authentication of its own (``--app-name basic-auth`` turns on MLflow's basic-auth app).

The database URI goes to the server through ``$MLFLOW_BACKEND_STORE_URI``, not its command line,
and a password belongs in ``$PGPASSWORD`` or ``~/.pgpass`` (libpq reads both), so no password shows
in the process list. This module imports only the standard library until the server starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from attnstudy.serving.server_app import (
    mask as mask,  # re-exported: the server's callers use it from here
)
from attnstudy.serving.ui_guard import start_guard

DATABASE_SCHEMES = {
    "postgresql": "psycopg",
    "postgresql+psycopg": "psycopg",
    "mysql": "MySQLdb",
    "mysql+pymysql": "pymysql",
    "mssql+pyodbc": "pyodbc",
    "sqlite": None,
}
"""Backend store schemes a server accepts → the driver module they need (None: built in)."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def backend_uri(given: str | None) -> str:
    """The backend store URI: ``given``, else ``$MLFLOW_BACKEND_STORE_URI``.

    Raises:
        ValueError: none, not a database URI, or one whose driver is not installed (one line).
    """
    uri = given or os.environ.get("MLFLOW_BACKEND_STORE_URI")
    if not uri:
        raise ValueError(
            "give the database: --backend-store-uri postgresql+psycopg://USER@HOST:5432/DB "
            "(or $MLFLOW_BACKEND_STORE_URI)"
        )
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    if scheme not in DATABASE_SCHEMES:
        hint = (
            "; psycopg2 is not what the [distributed] extra installs: use postgresql+psycopg://"
            if scheme.startswith("postgresql+")
            else ""
        )
        raise ValueError(
            f"--backend-store-uri {mask(uri)!r} is not a database URI a team server can share; use "
            f"postgresql+psycopg://USER@HOST:5432/DB (schemes: {', '.join(DATABASE_SCHEMES)}){hint}"
        )
    module = DATABASE_SCHEMES[scheme]
    if module is not None:
        import importlib.util

        if importlib.util.find_spec(module) is None:
            raise ValueError(
                f"--backend-store-uri {scheme}://… needs the Python module {module!r}: "
                "pip install -e '.[distributed]' (psycopg[binary] for PostgreSQL)"
            )
    return uri


def artifacts_destination(artifacts: str) -> str:
    """``--artifacts-destination`` for a folder (created) or an object-store URI (``s3://…``)."""
    if "://" in artifacts:
        return artifacts
    path = Path(artifacts).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


MAX_WORKERS = 64
"""The most ``--workers`` accepted (each is a process holding MLflow's server: ~200 MiB)."""


def check_args(uri: str | None, artifacts: str, host: str, port: int, *, workers: int = 1) -> None:
    """Validate ``attnstudy server``'s arguments (torch- and mlflow-free).

    Raises:
        ValueError: one line naming the argument and the fix (an
            :class:`attnstudy.runtime.outputs.OutputError` for an artifacts folder that is or
            contains
            the current directory, the project root or ``$HOME``, or touches the project's store).
    """
    from attnstudy.runtime.outputs import check_output
    from attnstudy.serving import ui

    backend_uri(uri)
    if not artifacts.strip():
        raise ValueError("--artifacts is empty: give a folder for the server's artifacts")
    if "://" not in artifacts:  # MLflow adds experiment folders there and never removes a file
        check_output(artifacts, "--artifacts")
    if not 0 < port < 65536:
        raise ValueError(f"--port must be between 1 and 65535, got {port}")
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be between 1 and {MAX_WORKERS}, got {workers}")
    ui.check_host(host)


APP_NAMES = {None: "attnstudy", "basic-auth": "attnstudy-basic-auth"}
"""``--app-name`` of attnstudy server → MLflow's app (:mod:`attnstudy.serving.server_app`: MLflow's
own
server app, with a ``/health`` that checks the database)."""


def server_app_name(app_name: str | None) -> str:
    """The ``mlflow.app`` entry point to run for ``--app-name`` (None or ``basic-auth``).

    Raises:
        ValueError: the entry point is not installed (an install older than the package's
            ``pyproject.toml``), one line saying how to reinstall.
    """
    from importlib.metadata import distributions

    name = APP_NAMES[app_name]
    # as the server process sees them: started with -P, without the working folder on its path
    # (a source checkout's stale attnstudy.egg-info there would hide the installed entry points)
    here = Path.cwd().resolve()
    path = [p for p in sys.path if p and Path(p).resolve() != here]
    found = (
        ep
        for d in distributions(path=path)
        if (d.metadata["Name"] or "").lower() == "attnstudy"
        for ep in d.entry_points
    )
    if not any(ep.group == "mlflow.app" and ep.name == name for ep in found):
        raise ValueError(
            f"the installed attnstudy lacks MLflow's server app entry point {name!r}; reinstall "
            "it (make setup, or pip install -e '.[distributed]')"
        )
    return name


def start(
    uri: str,
    artifacts: str,
    *,
    host: str = "127.0.0.1",
    port: int = 5000,
    app_name: str | None = None,
    log_path: Path | None = None,
    workers: int = 1,
) -> subprocess.Popen:
    """Start the tracking server in its own process group, guarded like the UI's
    (:mod:`attnstudy.serving.ui_guard`: it never outlives this process). Stop it with
    :func:`attnstudy.serving.ui.stop_server`.

    Args:
        uri: the backend store (see :func:`backend_uri`).
        artifacts: a folder or object-store URI for ``--artifacts-destination``.
        host, port: where to listen.
        app_name: ``"basic-auth"`` for MLflow's authentication app, else None.
        workers: uvicorn's worker processes (more than one only on a schema that is current:
            :func:`serve` checks it).
        log_path: server output goes here (default: this process's stdout/stderr).
    """
    env = dict(
        os.environ,
        MLFLOW_BACKEND_STORE_URI=uri,
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false",
    )
    cmd = [  # -P: the working folder is not on the server's import path
        sys.executable,
        "-P",
        "-m",
        "mlflow",
        "server",
        "--artifacts-destination",
        artifacts_destination(artifacts),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    cmd += ["--app-name", server_app_name(app_name)]
    out = open(log_path, "ab") if log_path else None
    proc = subprocess.Popen(  # its own group: stop_server ends uvicorn's worker with it
        cmd,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT if out else None,
        start_new_session=True,
    )
    if out is not None:
        out.close()
    proc.guard = start_guard(proc.pid)  # type: ignore[attr-defined]
    return proc


def serve(
    uri: str | None,
    artifacts: str,
    *,
    host: str,
    port: int,
    app_name: str | None = None,
    workers: int = 1,
) -> int:
    """``attnstudy server``: run the server in the foreground until Ctrl-C (or SIGTERM).

    With ``workers`` > 1 the database's MLflow schema must be at this MLflow's revision already
    (``mlflow db upgrade``): else it stops in one line saying so, before the server starts.

    Returns:
        0 after Ctrl-C, 1 if the database does not answer or (several workers) its schema is not
        current, or the server failed to start or exited on its own.
    """
    from attnstudy.serving import ui
    from attnstudy.serving.server_app import (
        CHECK_BOUND_S,
        database_error_line,
        database_problem,
        schema_error_line,
        schema_problem,
    )

    uri = backend_uri(uri)
    server_app_name(app_name)
    problem = database_problem(uri, timeout=CHECK_BOUND_S)
    if problem is not None:  # mlflow server would retry for minutes, printing tracebacks
        print(f"attnstudy: error: {database_error_line(mask(uri), problem)}", file=sys.stderr)
        return 1
    if workers > 1:  # the schema is created or migrated by `mlflow db upgrade`, never by a start
        problem = schema_problem(uri, timeout=CHECK_BOUND_S)
        if problem is not None:
            line = schema_error_line(mask(uri), workers, problem)
            print(f"attnstudy: error: {line}", file=sys.stderr)
            return 1
    if host not in LOOPBACK and not app_name:
        print(
            f"attnstudy: warning: binding {host} without authentication: whoever reaches it can "
            "read and write every run; add --app-name basic-auth (docs/cluster.md)",
            file=sys.stderr,
            flush=True,
        )
    if ui.port_in_use("127.0.0.1" if host in ("0.0.0.0", "::") else host, port):
        print(
            f"attnstudy: error: port {port} is in use; choose another with --port", file=sys.stderr
        )
        return 2
    proc = None
    base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    try:
        proc = start(uri, artifacts, host=host, port=port, app_name=app_name, workers=workers)
        try:
            ui.wait_healthy(base, 180, proc)
        except RuntimeError as err:
            print(f"attnstudy: error: {err} (its output is above)", file=sys.stderr)
            return 1
        print(
            f"MLflow tracking server: {base} (store {mask(uri)}, artifacts "
            f"{artifacts_destination(artifacts)}, {workers} worker(s)); point studies at it with --tracking-uri {base} "
            "or MLFLOW_TRACKING_URI; Ctrl-C stops it",
            flush=True,
        )
        proc.wait()
        print(f"attnstudy: error: the server exited with code {proc.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping the MLflow tracking server", file=sys.stderr)
        return 0
    finally:
        if proc is not None:
            ui.stop_server(proc)
