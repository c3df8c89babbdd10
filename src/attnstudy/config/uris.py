"""Tracking-store and ``runs:/`` URIs as the user gives them: refused before anything is opened when
they cannot be read with certainty."""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

from .base import ConfigError

SQLITE_PREFIX = "sqlite:///"
"""The one SQLite tracking URI form read: ``sqlite:///relative/mlflow.db`` (relative to the working
directory) or ``sqlite:////absolute/mlflow.db``."""


def sqlite_database(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI as SQLAlchemy, MLflow and SQLite all read it,
    made absolute against the working directory (as SQLAlchemy's pysqlite dialect does); None for
    a URI of another scheme.

    Only the plain form ``sqlite:///PATH`` is read, and only where the three readers agree on
    ``PATH``: SQLAlchemy percent-decodes it and passes ``?…`` options to SQLite, while MLflow
    creates the folders of the undecoded text before ``?`` (``mlflow.store.db.utils.
    _make_parent_dirs_if_sqlite``), and ``file:…`` is a SQLite URI filename only with
    ``uri=true`` (else a file named ``file:…`` under the working directory). A URI where they
    could disagree is refused, so nothing is ever created in the working directory that the user
    did not name.

    Raises:
        ConfigError: one line: another SQLite dialect or driver (``sqlite+pysqlite://``), a host,
            ``?`` options, ``%`` escapes, a ``file:`` filename, a path starting with ``~`` (not
            expanded: it would be a folder named ``~``), or no path (in-memory).
    """
    bare = uri.strip()
    if not bare.lower().startswith("sqlite"):
        return None
    fix = "use sqlite:///PATH/mlflow.db (a relative or /absolute path, nothing else)"
    scheme = bare.partition(":")[0]
    if scheme != "sqlite":
        raise ConfigError(f"tracking URI {uri!r}: the {scheme!r} scheme is not read; {fix}")
    path = bare[len(SQLITE_PREFIX) :] if bare.startswith(SQLITE_PREFIX) else None
    if bare == "sqlite://" or path in ("", ":memory:"):
        raise ConfigError(
            f"tracking URI {uri!r} is an in-memory store: nothing would persist; "
            "use sqlite:///PATH/mlflow.db or an http(s):// server"
        )
    if path is None:
        raise ConfigError(
            f"tracking URI {uri!r} names no local database file (a SQLite URI has three slashes "
            f"and no host); {fix}"
        )
    problem = next(
        (
            why
            for bad, why in (
                ("?" in path, "has '?' options, which SQLite would read and MLflow would not"),
                ("%" in path, "has '%' escapes, which SQLAlchemy decodes and MLflow does not"),
                (
                    path.startswith("file:"),
                    "is a SQLite 'file:' URI filename, which would be read as a folder named "
                    "'file:' in the working directory",
                ),
                (
                    path.startswith("~"),
                    "starts with '~', which is not expanded (it would be a folder named '~' in "
                    "the working directory)",
                ),
            )
            if bad
        ),
        None,
    )
    if problem:
        raise ConfigError(f"tracking URI {uri!r}: its path {path!r} {problem}; {fix}")
    return Path(os.path.abspath(path))


TRACKING_DATABASES = ("postgresql", "mysql", "mssql")
"""Database schemes MLflow opens directly as a tracking store (``postgresql://…``, with or without
a driver: ``postgresql+psycopg://…``), besides ``sqlite:///PATH`` and an ``http(s)://`` server."""

_TRACKING_FIX = "use sqlite:///PATH/mlflow.db or an http(s)://HOST[:PORT] server"


def check_tracking_uri(uri: str) -> str:
    """The URI if it names a store that persists and can be read with certainty; checked from its
    text alone (nothing is opened, standard library only), so a mistyped URI is refused before
    MLflow is imported.

    Read: ``sqlite:///PATH`` (:func:`sqlite_database`), ``http(s)://HOST[:PORT][/PATH]`` and the
    databases of :data:`TRACKING_DATABASES`.

    Raises:
        ConfigError: for an in-memory SQLite store (``sqlite://``, ``sqlite:///:memory:``), whose
            runs vanish when the process ends, a ``file:`` store or a bare path (MLflow 3 refuses
            it without an opt-in), a SQLite URI :func:`sqlite_database` refuses, another scheme,
            an ``http(s)`` URI without a host, with a port that is no number in 1..65535, or with
            spaces or control characters (a SQLite path may hold spaces).
    """
    bare = uri.strip()
    if bare.endswith(":memory:"):
        raise ConfigError(
            f"tracking URI {uri!r} is an in-memory store: nothing would persist; "
            "use sqlite:///PATH/mlflow.db or an http(s):// server"
        )
    if bare.startswith("file:") or bare.startswith("/") or (bare and not _SCHEME.match(bare)):
        raise ConfigError(
            f"tracking URI {uri!r} is a file store, which MLflow 3 does not open by default; "
            "use sqlite:///PATH/mlflow.db or an http(s):// server"
        )
    if not bare:
        raise ConfigError(f"the tracking URI is empty; {_TRACKING_FIX}")
    scheme = bare.partition(":")[0]
    if scheme.partition("+")[0] == "sqlite":
        sqlite_database(bare)
        return uri
    if any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in bare):
        raise ConfigError(
            f"tracking URI {uri!r} holds a space or a control character; {_TRACKING_FIX} "
            "(percent-encode a space in a path as %20)"
        )
    if scheme in ("http", "https"):
        parts = urllib.parse.urlsplit(bare)
        try:
            port = parts.port
        except ValueError:
            port = 0
        if not parts.hostname or port == 0 or not bare.startswith(f"{scheme}://"):
            what = (
                "names no host"
                if not parts.hostname
                else "has a port that is no number in 1..65535"
            )
            raise ConfigError(f"tracking URI {uri!r} {what}; {_TRACKING_FIX}")
        return uri
    if scheme.partition("+")[0] in TRACKING_DATABASES:
        return uri
    rest = bare.partition(":")[2]
    hint = f" (a server: http://{bare})" if rest.partition("/")[0].isdigit() else ""
    raise ConfigError(
        f"tracking URI {uri!r}: the {scheme!r} scheme names no tracking store attnstudy "
        f"reads{hint}; {_TRACKING_FIX}, or a database URI "
        f"({', '.join(s + '://' for s in TRACKING_DATABASES)})"
    )


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


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
"""The start of a URI with a scheme (``runs:``, ``models:``, ``hf:``, ``s3:``…)."""


def looks_like_path(uri: str) -> bool:
    """Whether ``uri`` is written as a file path: it starts with ``./``, ``../``, ``/`` or ``~``,
    or holds the path separator and no scheme."""
    return uri.startswith(("./", "../", "/", "~")) or (os.sep in uri and not _SCHEME.match(uri))


def check_model_uri(uri: str, verb: str) -> None:
    """Refuse a model URI of ``predict`` or ``ablate`` (``verb``) that cannot be read with
    certainty, before anything is opened: ``runs:/<run_id>[/path]`` (:func:`split_runs_uri`),
    ``models:/<name>/<version|latest>``, ``models:/<name>@<alias>``, or (``predict`` only) a
    folder holding the model files. ``ablate`` refuses a model folder: it logs its ablation run
    under the model's run (its experiment, its tags), which a folder does not have. ``hf:FOLDER``
    is checked by the caller.

    Raises:
        ConfigError: one line: an empty run id, a run path that could leave the run, a
            ``models:/`` URI without version or alias, a path that is no folder, a folder given
            to ``ablate``, or an unknown scheme.
    """
    if uri.startswith("runs:/"):
        if not uri[len("runs:/") :].strip("/"):
            raise ConfigError(f"{uri}: give a run id (runs:/<run_id>)")
        split_runs_uri(uri)  # a path that could leave the run, however encoded
        return
    if uri.startswith("models:/"):
        rest = uri[len("models:/") :].strip("/")
        if "@" not in rest and not rest.partition("/")[2]:
            raise ConfigError(
                f"{uri}: give a version, 'latest' or an alias "
                "(models:/NAME/1, models:/NAME/latest or models:/NAME@ALIAS)"
            )
        return
    folder = Path(uri)
    if folder.is_dir() and verb == "predict":
        return
    if folder.is_dir() or (verb == "ablate" and looks_like_path(uri)):
        raise ConfigError(
            f"{uri}: ablate logs its ablation run under the model's run, and a model folder has "
            "none: ablate the run the model came from (runs:/<run_id> or models:/<name>/<version>)"
            f"; a Hugging Face save_pretrained folder is ablated as hf:{uri}"
        )
    if looks_like_path(uri) or folder.exists():
        what = "is not a folder" if folder.exists() else "no such folder"
        raise ConfigError(
            f"{what}: {uri!r}; give the folder holding the model files (weights, config, "
            "vocabularies), runs:/<run_id> or models:/<name>/<version>"
        )
    raise ConfigError(
        f"unknown model URI {uri!r}; use runs:/<run_id>, models:/<name>/<version>, "
        "models:/<name>@<alias>" + (" or a model folder" if verb == "predict" else "")
    )
