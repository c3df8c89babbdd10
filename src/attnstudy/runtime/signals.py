"""Interrupts that never land inside a store write.

A Ctrl-C (SIGINT) or SIGTERM that arrives while MLflow is inside a database session can leave the
session broken (the process then locks itself out of its own SQLite store) or a run half-ended.
Every store call therefore runs inside :func:`deferred_signals`: a signal that arrives meanwhile
is remembered and acted on right after the call, as if it had arrived then.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

SIGNALS = (signal.SIGINT, signal.SIGTERM)

_lock = threading.Lock()
_requested = False
_depth = 0
_saved: dict[int, object] = {}
_pending: list[int] = []


class Interrupted(KeyboardInterrupt):
    """An interrupt whose message says what it left behind, for an interrupt that took effect
    after the current run had already ended (the CLI prints the message instead of saying that
    the current run is marked KILLED)."""


def _remember(signum: int, frame) -> None:  # noqa: ARG001 - the signal handler signature
    _pending.append(signum)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM for the duration of the block, then deliver the first one that came.

    Re-entrant (nested blocks deliver once, at the outermost exit). Outside the main thread,
    where Python cannot change signal handlers, the block runs unprotected.

    Raises:
        KeyboardInterrupt: after the block, if a signal arrived during it and its handler raises
            one (the default SIGINT handler does; the CLI's SIGTERM handler does too).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _enter()
    try:
        yield
    finally:
        pending = _leave()
        if pending is not None:
            _deliver(pending)


def _enter() -> None:
    """Open a block: at the outermost one, swap every handler in :data:`SIGNALS` for ``_remember``.

    A signal can arrive between two swaps and be handled by its own handler, which may raise; the
    handlers swapped so far are then put back before the exception travels on, so no signal is
    left on ``_remember`` outside a block.
    """
    global _depth
    with _lock:
        if _depth == 0:
            swapped: list[int] = []
            try:
                for s in SIGNALS:
                    _saved[s] = signal.getsignal(s)
                    swapped.append(s)  # before the swap: putting back an unswapped one is harmless
                    signal.signal(s, _remember)
            except BaseException:
                try:
                    _restore(swapped)
                finally:
                    _pending.clear()
                raise
        _depth += 1


def _leave() -> int | None:
    """Close a block; at the outermost one, put the saved handlers back and return the first signal
    that arrived during the block (``None`` if none did).

    The handlers are put back before the remembered signals are read, so a signal arriving at any
    point is either remembered and returned here or handled by its own handler, never held for a
    later block.

    Raises:
        KeyboardInterrupt: if a signal arrives between two handlers being put back and its own
            handler raises one; every handler is put back all the same.
    """
    global _depth
    with _lock:
        _depth -= 1
        if _depth:
            return None
        try:
            _restore(list(SIGNALS))
        finally:
            pending = _pending[0] if _pending else None
            _pending.clear()
    return pending


def _restore(signums: list[int]) -> None:
    """Put back the saved handler of every signal in ``signums``, each of them even if a signal's
    handler raises between two (the exception travels on once the rest are put back).

    A handler that raises can only belong to a signal already put back, so one signal can no longer
    leave another on ``_remember``; it would take a second signal inside the few bytecodes of the
    ``finally`` below.
    """
    if not signums:
        return
    try:
        signal.signal(signums[0], _saved[signums[0]])  # type: ignore[arg-type]
    finally:
        _restore(signums[1:])


def _deliver(signum: int) -> None:
    """Act on a held signal as its own handler would have."""
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


def request_interrupt(signum: int, frame) -> None:  # noqa: ARG001 - the signal handler signature
    """The CLI's SIGINT/SIGTERM handler: remember the request and raise :class:`KeyboardInterrupt`.

    A KeyboardInterrupt raised while Python runs a finalizer (a weakref callback, ``__del__``) is
    printed and dropped; the request stays remembered, and the next :func:`check_interrupt` (every
    training batch, every store call) raises it again, so no Ctrl-C or SIGTERM is ever lost.
    """
    global _requested
    _requested = True
    raise KeyboardInterrupt


def quiet_dropped_interrupts(info) -> None:
    """``sys.unraisablehook`` for the CLI: a KeyboardInterrupt that Python drops because it was
    raised inside a finalizer is not printed (a traceback the user cannot act on) — it is
    remembered by :func:`request_interrupt` and raised again at the next :func:`check_interrupt`.
    Every other unraisable exception goes to Python's default hook."""
    if isinstance(info.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(info)


def acknowledge_interrupt() -> None:
    """The interrupt was caught where it is handled (a run is being marked KILLED, the CLI exits)."""
    global _requested
    _requested = False


def check_interrupt() -> None:
    """Raise :class:`KeyboardInterrupt` if an interrupt was requested and not yet handled."""
    if _requested:
        raise KeyboardInterrupt
