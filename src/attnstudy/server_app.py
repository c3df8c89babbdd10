"""The database check of ``attnstudy server``, before it starts and behind its ``/health``.

MLflow's own ``/health`` answers 200 whenever the web process runs, also while its database is
down, so a driver's pre-flight check passed against a server that could record nothing. And
``mlflow server`` against a database that does not answer retries for minutes, printing
SQLAlchemy tracebacks. Here:

* :func:`database_problem` opens one connection with a connect timeout
  (:data:`CONNECT_TIMEOUT_S`) and runs ``SELECT 1``: ``attnstudy server`` refuses to start in
  one line when it fails, within :data:`CHECK_BOUND_S` seconds;
* :func:`create_app` (MLflow's ``mlflow.app`` entry point ``attnstudy``; ``attnstudy-basic-auth``
  with MLflow's basic-auth app) is MLflow's own server app whose ``/health`` view makes the same
  check on every call: 200 ``OK`` when the database answers, else 503 with one line naming the
  database and the cause.

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
    box: list[str | None] = []

    def check() -> None:
        try:
            from sqlalchemy import create_engine, text
            from sqlalchemy.pool import NullPool

            family = uri.split(":", 1)[0].split("+", 1)[0]
            arg = _TIMEOUT_ARG.get(family)
            engine = create_engine(
                uri,
                poolclass=NullPool,
                connect_args={arg: CONNECT_TIMEOUT_S} if arg else {},
            )
            try:
                with engine.connect() as conn:
                    conn.execute(text("SELECT 1"))
            finally:
                engine.dispose()
            box.append(None)
        except Exception as err:  # noqa: BLE001 - every failure is the answer
            box.append(_cause(err))

    worker = threading.Thread(target=check, name="attnstudy-db-check", daemon=True)
    worker.start()
    worker.join(timeout)
    if not box:
        return f"no answer within {timeout:g} s"
    return box[0]


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
    """``GET /health``: 200 ``OK`` when the backend store's database answers, else 503 with one
    line naming it and the cause (one new connection per call, at most :data:`CHECK_BOUND_S` s)."""
    uri = os.environ.get("MLFLOW_BACKEND_STORE_URI", "")
    problem = database_problem(uri, timeout=CHECK_BOUND_S) if uri else None
    if problem is None:
        return "OK", 200
    return f"the database {mask(uri)} does not answer: {problem}", 503


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
