"""``attnstudy ARGV`` run in the test process, for tests where the process boundary is not what is
tested: a ``python -m attnstudy.cli`` process that gets as far as torch and MLflow costs ~3.5 s
CPU of imports (a usage error, refused before them, ~0.3 s), ``cli.main`` in a warm worker
milliseconds.

The result is a :class:`subprocess.CompletedProcess` like a real process's (exit code, stdout,
stderr read at the file descriptors, so a C library's or a child process's output is in it too),
and everything process-wide that ``cli.main`` and what it calls set is put back after each call:
the environment, the working directory, torch's thread count, the logging configuration, the
warning filters, the signal and unraisable hooks, MLflow's process-wide tracking and registry URIs
and the globals of :mod:`attnstudy.runtime.notices` (the output policy, the notices said). An
exception
that escapes ``cli.main`` (a real process would print a traceback and exit 1) comes back as exit 1
with its traceback on stderr.

Tests that need a real process (signals, a process killed, import-time output, what a child
inherits) keep ``subprocess``.
"""

from __future__ import annotations

import copy
import logging
import os
import signal
import subprocess
import sys
import traceback
import warnings
from contextlib import contextmanager
from pathlib import Path

_MLFLOW_URIS = (
    ("mlflow.tracking._tracking_service.utils", "_tracking_uri"),
    ("mlflow.tracking._model_registry.utils", "_registry_uri"),
)
"""Module globals behind ``mlflow.set_tracking_uri`` / ``mlflow.set_registry_uri``."""


_PLAIN = (str, int, float, bool, type(None), tuple, frozenset, list, dict, set)
"""The global values of a module that :func:`_module_state` saves (not its logger, functions…)."""


def _module_state(module) -> dict[str, object]:
    """A module's own plain global values (strings, numbers, containers), containers copied."""
    return {
        name: copy.copy(value)
        for name, value in vars(module).items()
        if not name.startswith("__") and isinstance(value, _PLAIN)
    }


def _restore_module_state(module, saved: dict[str, object]) -> None:
    """Put back what :func:`_module_state` saved; a list, dict or set keeps its identity (another
    module may hold it)."""
    for name, value in saved.items():
        current = getattr(module, name, None)
        if isinstance(current, list) and isinstance(value, list):
            current[:] = value
        elif isinstance(current, (dict, set)) and type(current) is type(value):
            current.clear()
            current.update(value)
        else:
            setattr(module, name, value)


@contextmanager
def process_state_restored():
    """Put back, on exit, the process-wide state ``cli.main`` changes (see the module docstring)."""
    import torch

    from attnstudy.runtime import notices, signals

    env = dict(os.environ)
    cwd = os.getcwd()
    threads = torch.get_num_threads()
    loggers = {
        name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
        for name, lg in logging.root.manager.loggerDict.items()
        if isinstance(lg, logging.Logger)
    }
    root_logger = (logging.root.level, list(logging.root.handlers))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    unraisable = sys.unraisablehook
    said = _module_state(notices)
    held = _module_state(signals)  # an interrupt request, a deferred-signals block left open
    uris = {
        (mod, attr): getattr(sys.modules[mod], attr)
        for mod, attr in _MLFLOW_URIS
        if mod in sys.modules and hasattr(sys.modules[mod], attr)
    }
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        torch.set_num_threads(threads)
        for name, (level, hs, propagate, disabled) in loggers.items():
            lg = logging.getLogger(name)
            lg.setLevel(level)
            lg.handlers[:] = hs
            lg.propagate, lg.disabled = propagate, disabled
        logging.root.setLevel(root_logger[0])
        logging.root.handlers[:] = root_logger[1]
        for s, handler in handlers.items():
            signal.signal(s, handler)
        sys.unraisablehook = unraisable
        _restore_module_state(notices, said)
        _restore_module_state(signals, held)
        for (mod, attr), value in uris.items():
            setattr(sys.modules[mod], attr, value)


def run_cli(
    capfd, argv: list[str], *, cwd: Path, env: dict[str, str | None]
) -> subprocess.CompletedProcess:
    """``attnstudy ARGV`` in this process, as ``python -m attnstudy.cli ARGV`` would run it from
    ``cwd`` with the environment changed by ``env`` (a None value unsets the variable).

    Args:
        capfd: pytest's ``capfd`` fixture of the calling test (whatever it captured before is
            dropped).

    Returns:
        The exit code (``cli.main``'s return value; 1 with a traceback on stderr if an exception
        escaped it) and what was written to stdout and stderr.
    """
    # the tracking client is imported before the state is saved: what a module sets when it is
    # imported (its MLflow variables: no artifact progress bars…) stays set, as in a process
    import attnstudy.tracking.client  # noqa: F401
    from attnstudy.cli import main as cli

    with process_state_restored():
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        os.chdir(cwd)
        capfd.readouterr()
        try:
            code = cli.main(list(argv))
        except SystemExit as err:  # as ``sys.exit`` would end the process
            code = err.code if isinstance(err.code, int) else 1
        except Exception:  # a real process would print a traceback and exit 1
            print(traceback.format_exc(), file=sys.stderr, end="")
            code = 1
        out = capfd.readouterr()
    # the arguments as the process would have had them
    return subprocess.CompletedProcess(
        [sys.executable, "-m", "attnstudy.cli", *argv], code, out.out, out.err
    )
