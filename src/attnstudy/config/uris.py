"""Tracking-store and ``runs:/`` URIs as the user gives them: refused before anything is opened when
they cannot be read with certainty."""

from __future__ import annotations

import re
import urllib.parse

from .base import ConfigError


def check_tracking_uri(uri: str) -> str:
    """The URI if it names a store that persists.

    Raises:
        ValueError: for an in-memory SQLite store (``sqlite://``, ``sqlite:///:memory:``), whose runs
            vanish when the process ends, or a ``file:`` store (MLflow 3 refuses it without an opt-in).
    """
    bare = uri.strip()
    if bare in ("sqlite://", "sqlite:///", "sqlite:///:memory:") or bare.endswith(":memory:"):
        raise ConfigError(
            f"tracking URI {uri!r} is an in-memory store: nothing would persist; "
            "use sqlite:///PATH/mlflow.db or an http(s):// server"
        )
    if bare.startswith("file:") or bare.startswith("/"):
        raise ConfigError(
            f"tracking URI {uri!r} is a file store, which MLflow 3 does not open by default; "
            "use sqlite:///PATH/mlflow.db or an http(s):// server"
        )
    return uri


RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,255}$")
"""A run id as MLflow validates one (``_validate_run_id``), in ASCII."""


RUN_PATH_PART = re.compile(r"^[A-Za-z0-9_.-]+$")
"""One part of a path inside a run (``runs:/<id>/<part>/…``) once decoded: letters, digits, ``_.-``
(not only dots)."""


URI_DECODE_ROUNDS = 10
"""Percent-decoding rounds after which a path still changing is refused (MLflow's ``_decode``
stops at 10 too)."""


def split_runs_uri(uri: str) -> tuple[str, str]:
    """(run id, artifact path inside the run) of ``runs:/<run_id>[/<path>]``; the path is ``""``
    when the URI gives none.

    MLflow percent-decodes an artifact path, repeatedly until it stops changing, before it reads
    it (``mlflow.utils.uri._decode``), so ``%2e%2e``, ``%252e%252e`` or ``..%2f`` is ``..`` to it.
    The path is decoded the same way, and the decoded path must be plain names
    (:data:`RUN_PATH_PART`) joined by ``/``: no ``..``, ``.`` or empty part, no backslash, drive,
    scheme, ``#``, ``?``, control or non-ASCII character — nothing that could leave the run. The
    decoded path is returned, so what is checked is what is read. The run id is taken verbatim
    and must look like one (:data:`RUN_ID_PATTERN`, no encoding).

    Raises:
        ConfigError: a malformed run id, or a path that could leave the run (one line).
    """
    rest = uri.removeprefix("runs:/").strip("/")
    run_id, _, raw = rest.partition("/")
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise ConfigError(
            f"{uri}: {run_id!r} is not a run id (letters, digits, '_' and '-'); "
            "use runs:/<run_id>[/model]"
        )
    if not raw:
        return run_id, ""
    path = raw
    for _ in range(URI_DECODE_ROUNDS):
        decoded = urllib.parse.unquote(path, errors="replace")
        if decoded == path:
            break
        path = decoded
    else:
        path = None  # still changing: MLflow refuses it too
    parts = None if path is None else path.removesuffix("/").split("/")
    if parts is None or any(not RUN_PATH_PART.fullmatch(p) or not p.strip(".") for p in parts):
        shown = "" if path is None or path == raw else f" (read as {path!r} once decoded)"
        raise ConfigError(
            f"{uri}: the path inside the run{shown} must be plain names (letters, digits, "
            "'_', '.', '-') joined by '/': it must not hold '..', '.', empty parts or other "
            "characters (it would leave the run); use runs:/<run_id>[/model]"
        )
    return run_id, "/".join(parts)
