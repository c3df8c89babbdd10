"""One-line notices to the user: hints about doubtful input and counts of what was left out.

They go to the ``attnstudy`` logger at WARNING level; the CLI prints each as
``attnstudy: note: …`` on stderr, a notebook sees them through :mod:`logging`. What libraries
print themselves is the CLI's to decide (:func:`set_library_output`, ``--verbose``).
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("attnstudy")

_said: list[str] = []  # this process's notices, in order (what a worker process need not repeat)
_said_elsewhere: frozenset[str] = frozenset()  # what the process that started this one said


def notice(message: str) -> None:
    """Tell the user something they should know but that does not stop the work (one line).

    A worker process of a study (:mod:`attnstudy.executors.local_workers`) does not repeat a notice
    its
    driver already printed (the driver loads the same data first: one line, not one per process).
    """
    line = message.replace("\n", " ")
    if line in _said_elsewhere:
        return
    _said.append(line)
    logger.warning(line)


def said() -> list[str]:
    """The notices this process has given so far (for :func:`skip_said`)."""
    return list(_said)


def skip_said(lines: list[str]) -> None:
    """A worker process's start: do not repeat ``lines``, notices its driver already gave."""
    global _said_elsewhere
    _said_elsewhere = frozenset(lines)


class _NoteFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"attnstudy: note: {record.getMessage()}"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a notice is emitted, not the stream it was when
    the handler was made (a second ``main`` in one process, under a swapped stderr, wrote to a
    closed stream: "--- Logging error ---")."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def install_note_lines() -> None:
    """Print the ``attnstudy`` logger's notices as one ``attnstudy: note: …`` line each on stderr
    (the command line, and the worker processes it starts); idempotent."""
    if not any(getattr(h, "_attnstudy", False) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_NoteFormatter())
        handler._attnstudy = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False


VERBOSE_ENV = "ATTNSTUDY_VERBOSE"
"""Set to 1 (or given ``--verbose``), the CLI lets libraries' own messages through."""

_policy: str | None = None  # None: a library user's process (nothing changed); "quiet"; "verbose"


def verbose_from_env() -> bool:
    """Whether ``$ATTNSTUDY_VERBOSE`` asks for the libraries' own messages (1, true, yes)."""
    return os.environ.get(VERBOSE_ENV, "").strip().lower() in ("1", "true", "yes")


def library_output() -> str | None:
    """The library-output policy :func:`set_library_output` set in this process: ``"quiet"``,
    ``"verbose"``, or None (a library user's process, left as it is); a study's worker processes
    take the driver's."""
    return _policy


def set_library_output(verbose: bool) -> None:
    """The command line's policy for what libraries print themselves (D23).

    Quiet (the default): MLflow's "🏃 View run … at" / "🧪 View experiment at" lines, Python
    warnings (torch, transformers, pydantic, matplotlib UserWarnings …) and the INFO and WARNING
    lines of MLflow, alembic and transformers stay out of the output — attnstudy's own lines
    (results, ``attnstudy: note:``, ``attnstudy: error:``) say what happened. Processes started from
    this one (a private Ray head's workers, the UI's server) inherit the policy through
    ``PYTHONWARNINGS``, ``TRANSFORMERS_VERBOSITY`` and ``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT``
    (each left alone where the user set it). Verbose: the libraries' defaults, the View-run lines
    included. A Python program that imports attnstudy is left as it is unless it calls this.
    """
    global _policy
    import warnings

    _policy = "verbose" if verbose else "quiet"
    if verbose:
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "false"
    else:
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("PYTHONWARNINGS", "ignore")
        warnings.simplefilter("ignore")
    library_log_levels()


def library_log_levels() -> None:
    """Set the libraries' loggers for this process's policy; the tracking layer calls it again
    once MLflow is imported (MLflow sets its own loggers' levels when it is imported).

    A library user's process (no policy set): MLflow's INFO chatter off (WARNING), its store's
    ERROR tracebacks with SQL off (they reach the user as one ``TrackingError`` line), alembic at
    WARNING — as the tracking layer always did. Quiet: ERROR for MLflow, alembic and
    transformers. Verbose: INFO for MLflow and alembic, everything of the store.
    """
    levels = {
        None: {"mlflow": "WARNING", "mlflow.store": "CRITICAL", "alembic": "WARNING"},
        "quiet": {
            "mlflow": "ERROR",
            "mlflow.store": "CRITICAL",
            "alembic": "ERROR",
            "transformers": "ERROR",
        },
        "verbose": {"mlflow": "INFO", "mlflow.store": "NOTSET", "alembic": "INFO"},
    }[_policy]
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
