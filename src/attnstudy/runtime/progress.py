"""Progress output that reads well in a terminal and in a log file, and a progress metric.

In a terminal: one tqdm bar per phase (a training epoch, a model's ablations), naming what it
does. Outside a terminal (a log file, CI, a worker process): no bar redrawn per batch, no cursor
escapes and no carriage return; a plain line at most every :func:`line_interval` seconds and one
at the end (never the same count twice), with the rate and the time left once anything is done.
A unit that takes long (one adversarial batch of a Transformer can take minutes) still shows a
line at least every :func:`line_interval` seconds: a heartbeat thread writes the count again with
the time passed.

Every display names what it counts (``batches``, ``examples × prefixes``), what is running now (its
note) and, inside a study, which model of how many (:func:`stage`); :func:`started` writes the line
a task begins with. Within :func:`reporting`, every display also hands its fraction done to a sink
(the run's ``progress/fraction`` metric, so the MLflow UI shows how far a RUNNING run is) at most
every :func:`metric_interval` seconds — whether or not anything is shown (``--quiet``).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Callable

from tqdm.auto import tqdm

from attnstudy.runtime.env import env_seconds

LOG_INTERVAL = 10.0
"""Seconds between two progress lines when stderr is not a terminal (``$ATTNSTUDY_PROGRESS_SECONDS``
overrides it)."""
METRIC_INTERVAL = 30.0
"""Seconds between two progress metrics of a run (``$ATTNSTUDY_PROGRESS_METRIC_SECONDS``
overrides it)."""
LINE_VAR = "ATTNSTUDY_PROGRESS_SECONDS"
METRIC_VAR = "ATTNSTUDY_PROGRESS_METRIC_SECONDS"
HEARTBEAT_FLOOR = 1.0
"""The heartbeat thread wakes at most once a second, whatever the intervals (0 in tests)."""

_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("attnstudy_progress_stage", default="")
_SINK: contextvars.ContextVar[Callable[[float], None] | None] = contextvars.ContextVar(
    "attnstudy_progress_sink", default=None
)
_stream = None  # where progress goes when no stream is given (None: sys.stderr at the time)
_last_line = time.monotonic()  # when this process last wrote a plain progress line


def _seconds(var: str, default: float) -> float:
    return env_seconds(var, default, low=0, high=86_400)


def line_interval() -> float:
    """Seconds between two plain progress lines: ``$ATTNSTUDY_PROGRESS_SECONDS``, else
    :data:`LOG_INTERVAL`.

    Raises:
        ConfigError: a value that is not a number of seconds in [0, 86400] (one line).
    """
    return _seconds(LINE_VAR, LOG_INTERVAL)


def metric_interval() -> float:
    """Seconds between two progress metrics of a run: ``$ATTNSTUDY_PROGRESS_METRIC_SECONDS``,
    else :data:`METRIC_INTERVAL`.

    Raises:
        ConfigError: a value that is not a number of seconds in [0, 86400] (one line).
    """
    return _seconds(METRIC_VAR, METRIC_INTERVAL)


def check_intervals() -> None:
    """Refuse a malformed interval variable before any work starts (a study checks it first).

    Raises:
        ConfigError: one line naming the variable.
    """
    line_interval()
    metric_interval()


def set_stream(stream) -> None:
    """Where progress goes in this process when a display names no stream (None: ``sys.stderr``
    at the time; a local worker process sends its lines to the driver,
    :mod:`attnstudy.executors.local_workers`)."""
    global _stream
    _stream = stream


def _default_stream():
    return _stream if _stream is not None else sys.stderr


@contextlib.contextmanager
def stage(text: str):
    """Within the block, every :class:`Progress` created adds ``(text)`` to what it names, e.g.
    ``train g2p/additive-bahdanau/seed1 epoch 2 (model 1 of 6)``.

    Args:
        text: where the work stands, e.g. ``model 1 of 6``.
    """
    token = _STAGE.set(text)
    try:
        yield
    finally:
        _STAGE.reset(token)


@contextlib.contextmanager
def reporting(sink: Callable[[float], None]):
    """Within the block, every :class:`Progress` created hands its fraction done (0 to 1, mapped
    through its ``span``) to ``sink``: at its first update, at most every :func:`metric_interval`
    seconds while it runs (also when nothing is shown), and when it closes. A sink that raises
    in the heartbeat thread is ignored there (the next call tries again); in the caller's thread
    its error propagates.

    Args:
        sink: called with the fraction done, e.g. to log the run's ``progress/fraction``.
    """
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)


@contextlib.contextmanager
def task(what: str, enabled: bool = True, stream=None):
    """A task of a study: the line it begins with (:func:`started`) and, while the block runs
    outside a terminal, ``train NAME (model 1 of 6): running, 2 min 05 s`` whenever this process
    wrote no progress line for :func:`line_interval` seconds (between a training's epochs, while
    the test split is decoded or the run's pages are logged: work no :class:`Progress` counts).

    Args:
        what: the task, e.g. ``train NAME`` or ``ablate NAME``.
        enabled: False writes nothing (``--quiet``).
        stream: where to write (default: this process's progress stream, stderr).
    """
    started(what, enabled, stream)
    stream = stream or _default_stream()
    if not enabled or _is_tty(stream):  # a terminal's bars show that it runs
        yield
        return
    where = _STAGE.get()
    head = f"{what}{f' ({where})' if where else ''}: running, "
    t0, done = time.monotonic(), threading.Event()

    def watch() -> None:
        interval = max(line_interval(), HEARTBEAT_FLOOR)
        while not done.wait(min(interval, HEARTBEAT_FLOOR)):
            now = time.monotonic()
            if now - _last_line >= interval:
                try:
                    _emit(stream, head + _duration(now - t0))
                except (OSError, ValueError):  # a closed stream: nothing more to say
                    return

    thread = threading.Thread(target=watch, name="attnstudy-task", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)


def started(what: str, enabled: bool = True, stream=None) -> None:
    """The line a task begins with: ``train copy/additive-bahdanau/seed1 (model 1 of 6):
    started`` (the current :func:`stage` in parentheses); written above a terminal's bars.

    Args:
        what: the task, e.g. ``train NAME`` or ``ablate NAME``.
        enabled: False writes nothing (``--quiet``).
        stream: where to write (default: this process's progress stream, stderr).
    """
    if not enabled:
        return
    where = _STAGE.get()
    stream = stream or _default_stream()
    line = f"{what}{f' ({where})' if where else ''}: started"
    if _is_tty(stream):
        tqdm.write(line, file=stream)
    else:
        _emit(stream, line)


class Progress:
    """A progress display for ``total`` units.

    Args:
        total: number of units (examples, batches).
        desc: what is being done, e.g. ``ablations g2p/additive-bahdanau/seed1`` (the current
            :func:`stage` is added in parentheses).
        enabled: False shows nothing (``--quiet``); the fraction still reaches a
            :func:`reporting` sink.
        unit: the unit's name (``batch``; a product of units as ``example × prefix``, shown as
            ``examples × prefixes``).
        position: tqdm's line, for bars shown at once in a terminal.
        stream: where to write (default: this process's progress stream, stderr).
        span: the part of the whole task this display covers, as (start, stop) fractions (a
            training's epoch 2 of 4 is (0.25, 0.5)): what the sink receives.
        heartbeat: write a line (or redraw the bar) at least every :func:`line_interval` seconds
            even when no unit ends in between (off for a study's bar of tasks, whose workers
            write their own).
    """

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        enabled: bool = True,
        unit: str = "it",
        position: int = 0,
        stream=None,
        span: tuple[float, float] = (0.0, 1.0),
        heartbeat: bool = True,
    ):
        where = _STAGE.get()
        desc = f"{desc} ({where})" if where else desc
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.stream = stream or _default_stream()
        self.span = span
        self.sink = _SINK.get()
        self.interval, self.every = line_interval(), metric_interval()
        self.done = 0
        self.shown = 0  # the count of the last plain line (close repeats none)
        self.note = ""
        self.t0 = self.last = time.monotonic()
        self.reported: float | None = None  # the fraction last handed to the sink
        self.last_report = self.t0
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self.bar = None
        if enabled and _is_tty(self.stream):
            self.bar = tqdm(
                total=total,
                desc=desc,
                unit=_plural(unit) if " × " in unit else unit,
                position=position,
                leave=False,
                file=self.stream,
            )
        self._thread = None
        if heartbeat and (enabled or self.sink is not None):
            self._thread = threading.Thread(
                target=self._beat, name="attnstudy-progress", daemon=True
            )
            self._thread.start()

    @property
    def fraction(self) -> float:
        """The fraction of the whole task done (through ``span``), 0 to 1."""
        start, stop = self.span
        part = min(self.done / self.total, 1.0) if self.total else 1.0
        return start + (stop - start) * part

    def update(self, n: int = 1, note: str | None = None) -> None:
        """Count ``n`` more units done (``note``: what is running now, e.g. the ablation; ``""``
        when nothing named is)."""
        with self._lock:
            self.done += n
            if note is not None:
                self.note = note
            if self.bar is not None:
                if note is not None:
                    self.bar.set_postfix_str(note, refresh=False)
                self.bar.update(n)
            elif self.enabled and time.monotonic() - self.last >= self.interval:
                self._line()
        self._report(first=self.reported is None)

    def write(self, line: str) -> None:
        """A line of its own (an epoch's summary), without breaking the bar."""
        if not self.enabled:
            return
        with self._lock:
            if self.bar is not None:
                self.bar.write(line, file=self.stream)
            else:
                _emit(self.stream, line)

    def _line(self) -> None:
        self.last = time.monotonic()
        self.shown = self.done
        elapsed = self.last - self.t0
        note = f" [{self.note}]" if self.note else ""
        pace = ""
        if self.done and elapsed >= 1:  # a rate over less than a second says nothing
            rate = self.done / elapsed
            left = max(self.total - self.done, 0) / rate
            pace = f", {rate:.3g}/s, ETA {_duration(left)}"
        _emit(
            self.stream,
            f"{self.desc}: {self.done}/{self.total} {_plural(self.unit)}, "
            f"{_duration(elapsed)}{pace}{note}",
        )

    def _report(self, first: bool = False, final: bool = False) -> None:
        """Hand the fraction to the sink: the first time, when due, or at close if it changed."""
        if self.sink is None:
            return
        now = time.monotonic()
        fraction = self.fraction
        if final:
            due = fraction != self.reported
        else:
            due = first or now - self.last_report >= self.every
        if due:
            self.reported, self.last_report = fraction, now
            self.sink(fraction)

    def _beat(self) -> None:
        """The heartbeat thread: a line (or a redrawn bar) and the sink's fraction whenever
        nothing was written for an interval."""
        while not self._closed.wait(max(min(self.interval, self.every), HEARTBEAT_FLOOR)):
            try:
                with self._lock:
                    if self._closed.is_set():
                        return
                    now = time.monotonic()
                    if self.bar is not None:
                        self.bar.refresh()
                    elif self.enabled and now - self.last >= max(self.interval, HEARTBEAT_FLOOR):
                        self._line()
                if self.sink is not None and self.reported is not None:
                    if now - self.last_report >= max(self.every, HEARTBEAT_FLOOR):
                        self.last_report = now
                        self.sink(self.fraction)
            except Exception:  # noqa: BLE001 - a heartbeat never stops the work; tried again
                pass
            except KeyboardInterrupt:  # the main thread acts on the interrupt
                pass

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self.bar is not None:
                self.bar.close()
            elif self.enabled and self.done and self.done != self.shown:
                self._line()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._report(final=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _emit(stream, line: str) -> None:
    """One whole line in one write (the lines of several processes never interleave mid-line)."""
    global _last_line
    stream.write(line + "\n")
    stream.flush()
    _last_line = time.monotonic()


def _duration(seconds: float) -> str:
    """``42 s``, ``12 min 05 s``, ``2 h 05 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _plural(unit: str) -> str:
    """``example`` → ``examples``, ``batch`` → ``batches``, ``example × prefix`` → ``examples ×
    prefixes``."""
    if " × " in unit:
        return " × ".join(map(_plural, unit.split(" × ")))
    return unit + ("es" if unit.endswith(("ch", "sh", "s", "x")) else "s")
