"""The database and artifact-store checks of ``attnstudy server``, before it starts and behind
its ``/health``.

MLflow's own ``/health`` answers 200 whenever the web process runs, also while its database or
its artifact store is down, so a driver's pre-flight check passed against a server that could
record nothing. And ``mlflow server`` against a database that does not answer retries for
minutes, printing SQLAlchemy tracebacks. Here:

* :func:`database_problem` opens one connection with a connect timeout
  (:data:`CONNECT_TIMEOUT_S`) and runs ``SELECT 1``: ``attnstudy server`` refuses to start in
  one line when it fails, within :data:`CHECK_BOUND_S` seconds;
* :func:`artifact_store_problem` lists at most one object under the server's
  ``--artifacts-destination`` (an ``s3://`` bucket, with the connect and read timeouts of
  :data:`CONNECT_TIMEOUT_S` and one try) or checks that its folder can be written;
* :func:`create_app` (MLflow's ``mlflow.app`` entry point ``attnstudy``; ``attnstudy-basic-auth``
  with MLflow's basic-auth app) is MLflow's own server app whose ``/health`` view makes both
  checks on every call: 200 ``OK`` when both answer, else 503 with one line per part that is
  down, naming it and the cause (``the database … does not answer: …``, ``the artifact store …
  does not answer: …``).

Only the standard library is imported at module level (``attnstudy server`` stays light until
it starts the server); SQLAlchemy comes with MLflow.
"""

from __future__ import annotations

import os
import threading
from urllib.parse import urlsplit, urlunsplit

CONNECT_TIMEOUT_S = 5
"""The database driver's connect timeout (libpq's ``connect_timeout``; MySQL drivers' too)."""
CHECK_BOUND_S = 15
"""Seconds within which a database check returns, whatever the network does (stated in
``attnstudy server --help`` and docs/cluster.md)."""
_TIMEOUT_ARG = {"postgresql": "connect_timeout", "mysql": "connect_timeout"}
ARTIFACTS_DESTINATION_VAR = "_MLFLOW_SERVER_ARTIFACT_DESTINATION"
"""Where ``mlflow server`` hands its workers ``--artifacts-destination``: MLflow's
``mlflow.server.constants.ARTIFACTS_DESTINATION_ENV_VAR``, named here because importing that
module imports MLflow's whole server (seconds); a test checks the two agree."""


def database_problem(uri: str, timeout: float = CHECK_BOUND_S) -> str | None:
    """Check that the database of a backend store URI answers: one connection, ``SELECT 1``.

    Args:
        uri: an SQLAlchemy database URI (``postgresql+psycopg://USER@HOST:PORT/DB`` …); a
            ``sqlite:`` file is local and not checked (MLflow creates it).
        timeout: at most this many seconds (the check runs in a daemon thread; a driver stuck
            past it is abandoned and reported).

    Returns:
        None when it answers; else one line: the cause (the driver's first line, e.g.
        ``connection to server at "127.0.0.1", port 1 failed: Connection refused``).
    """
    if uri.startswith("sqlite:"):
        return None

    def check() -> None:
        from sqlalchemy import text

        engine = _engine(uri)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()

    return _bounded(check, timeout, "attnstudy-db-check")


def artifact_store_problem(destination: str, timeout: float = CHECK_BOUND_S) -> str | None:
    """Check that the server's artifact store answers.

    Args:
        destination: the server's ``--artifacts-destination``: ``s3://BUCKET[/PREFIX]`` (one
            ``ListObjectsV2`` of at most one key under the prefix, at ``$MLFLOW_S3_ENDPOINT_URL``
            or boto3's own endpoint, with boto3's credentials; connect and read timeouts of
            :data:`CONNECT_TIMEOUT_S`, one try), a folder or ``file://`` URI (it exists and can
            be written); any other scheme is not checked.
        timeout: at most this many seconds (the check runs in a daemon thread, as
            :func:`database_problem`'s).

    Returns:
        None when it answers (or is not checked); else one line: the cause (``Could not connect
        to the endpoint URL: …``, ``NoSuchBucket: …``, ``no folder …``).
    """
    scheme = destination.split("://", 1)[0] if "://" in destination else "file"
    if scheme not in ("s3", "file"):
        return None
    return _bounded(
        lambda: _s3_problem(destination) if scheme == "s3" else _folder_problem(destination),
        timeout,
        "attnstudy-artifacts-check",
    )


def schema_problem(uri: str, timeout: float = CHECK_BOUND_S) -> str | None:
    """Check that the database holds MLflow's schema at this MLflow's newest revision, as
    ``attnstudy server --workers N`` (N > 1) requires: creating or migrating the schema stays one
    explicit step (``mlflow db upgrade``, after a backup), never a side effect of a start.

    Args:
        uri: an SQLAlchemy database URI (as :func:`database_problem`; ``sqlite:`` files too).
        timeout: at most this many seconds (a daemon thread, as :func:`database_problem`'s).

    Returns:
        None when the schema is current; else one line: ``it holds no MLflow schema``, ``its
        MLflow schema is at revision X, this MLflow needs Y``, or why the check failed.
    """

    def check() -> str | None:
        from alembic.runtime.migration import MigrationContext
        from mlflow.store.db.utils import _get_latest_schema_revision

        engine = _engine(uri)
        try:
            with engine.connect() as conn:
                current = MigrationContext.configure(conn).get_current_revision()
        finally:
            engine.dispose()
        head = _get_latest_schema_revision()
        if current is None:
            return "it holds no MLflow schema"
        if current != head:
            return f"its MLflow schema is at revision {current}, this MLflow needs {head}"
        return None

    return _bounded(
        check, timeout, "attnstudy-schema-check", failed="its schema could not be read: "
    )


def _engine(uri: str):
    """An SQLAlchemy engine of ``uri`` without a pool, its driver's connect timeout
    :data:`CONNECT_TIMEOUT_S` where it has one (:data:`_TIMEOUT_ARG`)."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    arg = _TIMEOUT_ARG.get(uri.split(":", 1)[0].split("+", 1)[0])
    return create_engine(
        uri, poolclass=NullPool, connect_args={arg: CONNECT_TIMEOUT_S} if arg else {}
    )


def _bounded(check, timeout: float, name: str, *, failed: str = "") -> str | None:
    """``check()`` (None: fine, else the problem in one line) in a daemon thread named ``name``,
    waited for at most ``timeout`` seconds: its answer, else ``failed`` followed by the cause of
    what it raised (:func:`_cause`) or ``no answer within T s`` (the thread is abandoned)."""
    box: list[str | None] = []

    def run() -> None:
        try:
            box.append(check())
        except Exception as err:  # noqa: BLE001 - every failure is the answer
            box.append(failed + _cause(err))

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    worker.join(timeout)
    return box[0] if box else f"{failed}no answer within {timeout:g} s"


def schema_error_line(masked_uri: str, workers: int, cause: str) -> str:
    """The one line ``attnstudy server --workers N`` prints when the schema is not current."""
    return (
        f"--workers {workers} needs the database's MLflow schema created and current, but "
        f"{cause}; stop every server of it, back it up, run `mlflow db upgrade {masked_uri}` once "
        "(the password in PGPASSWORD or ~/.pgpass), then start the server again (docs/cluster.md)"
    )


def _s3_problem(destination: str) -> str | None:
    """One bounded ``ListObjectsV2`` of the bucket and prefix of ``s3://BUCKET/PREFIX``."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        return "boto3 is not installed (pip install -e '.[distributed]')"
    bucket, _, prefix = destination.removeprefix("s3://").partition("/")
    config = Config(
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=CONNECT_TIMEOUT_S,
        retries={"total_max_attempts": 1, "mode": "standard"},
    )
    verify = False if os.environ.get("MLFLOW_S3_IGNORE_TLS", "").lower() == "true" else None
    client = boto3.client(
        "s3",
        endpoint_url=os.environ.get("MLFLOW_S3_ENDPOINT_URL") or None,
        config=config,
        verify=verify,
    )
    client.list_objects_v2(Bucket=bucket, Prefix=prefix.strip("/"), MaxKeys=1)
    return None


def _folder_problem(destination: str) -> str | None:
    """Whether the artifacts folder exists and can be written."""
    from urllib.parse import unquote

    path = unquote(urlsplit(destination).path) if "://" in destination else destination
    if not os.path.isdir(path):
        return f"no folder {path}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"the folder {path} cannot be written"
    return None


def _cause(err: BaseException) -> str:
    """The database driver's own first line (SQLAlchemy wraps it as ``err.orig``)."""
    inner = getattr(err, "orig", None) or err
    lines = [ln.strip() for ln in str(inner).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(inner).__name__


def mask(uri: str) -> str:
    """The URI with its password (if any) replaced by ``***``."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "<unparsable URI>"
    if parts.password is None:
        return uri
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def database_error_line(masked_uri: str, cause: str) -> str:
    """The one line ``attnstudy server`` prints when its database does not answer."""
    return (
        f"the database {masked_uri} does not answer ({cause}); start the database, or correct "
        "the URI's host, port, user and database name (a password goes in PGPASSWORD or "
        "~/.pgpass), then start the server again (docs/cluster.md)"
    )


# ------------------------------------------------------------------------- the server's app


def health():
    """``GET /health``: 200 ``OK`` when the backend store's database and the artifact store
    answer, else 503 with one line per part that does not, naming it and the cause (the database
    first; one new connection to each per call, at most :data:`CHECK_BOUND_S` s each).

    The artifact store is the server's ``--artifacts-destination``
    (:func:`artifact_store_problem`); an ``s3://`` one is named with its endpoint.
    """
    lines = []
    uri = os.environ.get("MLFLOW_BACKEND_STORE_URI", "")
    problem = database_problem(uri, timeout=CHECK_BOUND_S) if uri else None
    if problem is not None:
        lines.append(f"the database {mask(uri)} does not answer: {problem}")
    destination = _artifacts_destination()
    problem = artifact_store_problem(destination, CHECK_BOUND_S) if destination else None
    if problem is not None:
        endpoint = os.environ.get("MLFLOW_S3_ENDPOINT_URL", "")
        at = f" at {mask(endpoint)}" if destination.startswith("s3://") and endpoint else ""
        lines.append(f"the artifact store {mask(destination)}{at} does not answer: {problem}")
    if not lines:
        return "OK", 200
    return "\n".join(lines), 503


def _artifacts_destination() -> str:
    """The ``--artifacts-destination`` that ``mlflow server`` hands its workers, or ""."""
    return os.environ.get(ARTIFACTS_DESTINATION_VAR, "")


def _with_health(app):
    """``app`` (MLflow's FastAPI app) with :func:`health` as its ``/health`` route: MLflow's own
    native FastAPI route (always ``OK``) is taken out, and its Flask view replaced too (it
    answers when no FastAPI route does)."""
    import anyio
    from mlflow.server import app as flask_app
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    flask_app.view_functions["health"] = health

    async def endpoint(request):
        text, code = await anyio.to_thread.run_sync(health)
        return PlainTextResponse(text, status_code=code)

    routes = app.router.routes
    routes[:] = [Route("/health", endpoint, methods=["GET"])] + [
        r for r in routes if getattr(r, "path", None) != "/health"
    ]
    return app


def create_app():
    """MLflow's tracking server app with :func:`health` behind ``/health`` (the ``mlflow.app``
    entry point ``attnstudy``)."""
    from mlflow.server.fastapi_app import app

    return _with_health(app)


def create_app_basic_auth():
    """As :func:`create_app`, with MLflow's basic-auth app (entry point ``attnstudy-basic-auth``;
    ``/health`` needs no login there either)."""
    from mlflow.server import app as flask_app
    from mlflow.server.auth import create_app as basic_auth

    return _with_health(basic_auth(flask_app))
