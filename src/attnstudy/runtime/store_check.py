"""What can be known of a tracking store before MLflow is imported (standard library only).

A command checks its store here first (:func:`check_store`): a tracking URI that cannot be read
with certainty, a SQLite store a reading verb would not find, a tracking server that refuses the
connection or does not answer are each refused in one line within a second of CPU, instead of
after the seconds MLflow, torch and the models take to import. :class:`attnstudy.tracking.Tracker`
runs the same checks when it opens the store (its module re-exports these names).
"""

from __future__ import annotations

import time

from attnstudy.runtime.env import env_seconds


class TrackingError(RuntimeError):
    """The tracking store cannot be reached or used; the message names the URI."""


class StoreNotFoundError(LookupError):
    """A verb that reads an existing store found none where it looked (the message says where)."""


DEFAULT_TIMEOUT = 10.0
"""Seconds to wait for a tracking server unless configured otherwise."""


def resolve_timeout(timeout: float | None = None) -> float:
    """The tracking timeout: ``timeout`` if given, else ``$ATTNSTUDY_TRACKING_TIMEOUT``, else 10 s.

    Raises:
        ConfigError: the variable is not a number of seconds in (0, 3600] (one line naming it).
    """
    if timeout is not None:
        return float(timeout)
    return env_seconds(
        "ATTNSTUDY_TRACKING_TIMEOUT", DEFAULT_TIMEOUT, low=0, high=3600, low_open=True
    )


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
            body = _body_line(err)
            if err.code == 503 and body.startswith(_PARTS):  # attnstudy server: a part is down
                last = body
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            if isinstance(reason, ConnectionRefusedError):  # nothing listens: no use waiting
                raise TrackingError(
                    f"tracking server {uri} refused the connection (nothing listens there); "
                    "start it, or point --tracking-uri / MLFLOW_TRACKING_URI elsewhere (a local "
                    "store: sqlite:///PATH/mlflow.db)"
                ) from None
            last = "no answer"
        if time.monotonic() >= deadline:
            if last.startswith(_PARTS):
                raise TrackingError(_part_down(uri, last, "/health answers 503"))
            raise TrackingError(
                f"tracking server {uri} did not answer within {timeout:g} s ({last}); "
                "start it, or point --tracking-uri / MLFLOW_TRACKING_URI elsewhere"
            )
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))


_DATABASE, _ARTIFACT_STORE = "the database ", "the artifact store "
_PARTS = (_DATABASE, _ARTIFACT_STORE)
"""How ``attnstudy server``'s ``/health`` names the part that is down (attnstudy.serving.server_app)."""
_DRIVER_ERRORS = ("OperationalError", "does not answer: connection")
"""Text of a database driver's error (psycopg, pymysql, SQLAlchemy) quoted in an answer."""
_AGAIN = "then run the command again (a study: --resume)"


def server_answer(uri: str, status: int, timeout: float = 5.0) -> str:
    """One line for a tracking server that answered an API request with HTTP ``status`` (500 or
    503, after MLflow's retries), its cause told by one ``GET /health``.

    * ``/health`` answers 503 naming the database (``attnstudy server``), or it quotes a database
      driver's error, or ``status`` is 503 (MLflow's answer while its database does not answer:
      ``TEMPORARILY_UNAVAILABLE``) and ``/health`` names nothing else: ``database down``;
    * ``/health`` answers 503 naming the artifact store: ``artifact store down``;
    * otherwise (``/health`` answers 200, or not at all, for an HTTP 500): ``tracking server
      failed (HTTP 500)``, with advice to read its log; the database is not blamed.

    Args:
        uri: the server (``http(s)://HOST:PORT``).
        status: the API's HTTP status.
        timeout: seconds for the ``/health`` request.
    """
    health = _health(uri, timeout)
    said = f"/health answers {health[0]} {health[1]}".rstrip() if health else ""
    if health is not None and health[0] == 503 and health[1].startswith(_PARTS):
        return _part_down(uri, health[1], f"HTTP {status}; /health answers 503")
    if status == 503 or (health is not None and any(d in health[1] for d in _DRIVER_ERRORS)):
        where = f"HTTP {status}" + (f"; {said}" if said else "")
        return (
            f"database down: tracking server {uri} answers, but not for its database ({where}); "
            f"start the database (the server needs no restart), {_AGAIN}"
        )
    health_said = f"its {said}" if said else "its /health gives no answer"
    return (
        f"tracking server failed: {uri} answered HTTP {status}, and {health_said} (no part "
        f"reported down); check the server's log for the error, {_AGAIN}"
    )


def _part_down(uri: str, body: str, where: str) -> str:
    """The line for ``attnstudy server``'s ``/health`` naming a part that is down (``body``:
    its first line, ``the database … does not answer: …`` or ``the artifact store …``)."""
    if body.startswith(_ARTIFACT_STORE):
        return (
            f"artifact store down: tracking server {uri} answers, but {body} ({where}); start "
            "the artifact store or correct the server's access to it (its --artifacts bucket "
            "or folder, MLFLOW_S3_ENDPOINT_URL, the credentials; the server needs no restart), "
            f"{_AGAIN}"
        )
    return (
        f"database down: tracking server {uri} answers, but {body} ({where}); start the "
        f"database (the server needs no restart), {_AGAIN}"
    )


def _health(uri: str, timeout: float) -> tuple[int, str] | None:
    """``GET /health`` once: (HTTP status, first line of the body), or None without an answer."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout) as resp:
            text = resp.read(4000).decode("utf-8", "replace").strip()
            return resp.status, text.splitlines()[0][:400] if text else ""
    except urllib.error.HTTPError as err:
        return err.code, _body_line(err)
    except (urllib.error.URLError, OSError, TimeoutError, ValueError):
        return None


def _body_line(err) -> str:
    """The first line of an HTTP error's body (at most 400 characters), or ""."""
    try:
        text = err.read(4000).decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - no body is no message
        return ""
    return text.splitlines()[0][:400] if text else ""


def store_not_found(uri: str) -> StoreNotFoundError:
    """The error of a verb that reads an existing store and finds no SQLite database at ``uri``."""
    return StoreNotFoundError(
        f"no tracking store at {uri}; point to one with --tracking-uri, MLFLOW_TRACKING_URI "
        "or ATTNSTUDY_ROOT (the folder holding mlruns/), or create one with 'attnstudy train'"
    )


def check_store(uri: str | None, timeout: float | None = None, *, create: bool) -> str:
    """Check a tracking store as far as can be done without MLflow; nothing is written.

    Args:
        uri: the tracking URI (None: :func:`attnstudy.runtime.paths.default_tracking_uri`).
        timeout: seconds to wait for a tracking server (None: :func:`resolve_timeout`).
        create: whether the verb creates a missing SQLite store (``train``, ``run``); one that
            only reads needs the database file to exist.

    Returns:
        The tracking URI checked.

    Raises:
        ConfigError: a URI :func:`attnstudy.config.check_tracking_uri` refuses, or a bad
            ``$ATTNSTUDY_TRACKING_TIMEOUT``.
        StoreNotFoundError: ``create`` is False and the SQLite database does not exist.
        TrackingError: an ``http(s)`` server refused the connection or did not answer
            ``GET /health`` with 200 within the timeout (:func:`check_server`).
    """
    from attnstudy.config import check_tracking_uri, sqlite_database
    from attnstudy.runtime.paths import default_tracking_uri

    uri = check_tracking_uri(uri or default_tracking_uri())
    seconds = resolve_timeout(timeout)
    db = sqlite_database(uri)
    if db is not None and not create and not db.is_file():
        raise store_not_found(uri)
    check_server(uri, seconds)
    return uri
