"""Progress output that reads well in a terminal and in a log file.

In a terminal: one tqdm bar per phase (a training epoch, a model's ablations), naming what it
does. Outside a terminal (a log file, CI): no bar redrawn per batch, no cursor escapes; a plain
line at most every :data:`LOG_INTERVAL` seconds and one at the end (never the same count twice).

Every display names what it counts (``batches``, ``examples × prefixes``), what is running now (its
note) and, inside a study, which model of how many (:func:`stage`).
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time

from tqdm.auto import tqdm

LOG_INTERVAL = 10.0
"""Seconds between two progress lines when stderr is not a terminal."""

_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("attnstudy_progress_stage", default="")


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


class Progress:
    """A progress display for ``total`` units.

    Args:
        total: number of units (examples, batches).
        desc: what is being done, e.g. ``ablations g2p/additive-bahdanau/seed1`` (the current
            :func:`stage` is added in parentheses).
        enabled: False shows nothing (``--quiet``).
        unit: the unit's name (``batch``; a product of units as ``example × prefix``, shown as
            ``examples × prefixes``).
        position: tqdm's line, for bars shown at once in a terminal.
        stream: where to write (default stderr).
    """

    def __init__(
        self,
        total: int,
        desc: str,
        enabled: bool = True,
        unit: str = "it",
        position: int = 0,
        stream=None,
    ):
        where = _STAGE.get()
        desc = f"{desc} ({where})" if where else desc
        self.total, self.desc, self.unit, self.enabled = total, desc, unit, enabled
        self.stream = stream or sys.stderr
        self.done = 0
        self.shown = 0  # the count of the last plain line (close repeats none)
        self.note = ""
        self.t0 = self.last = time.monotonic()
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

    def update(self, n: int = 1, note: str | None = None) -> None:
        """Count ``n`` more units done (``note``: what is running now, e.g. the ablation; ``""``
        when nothing named is)."""
        self.done += n
        if note is not None:
            self.note = note
        if self.bar is not None:
            if note is not None:
                self.bar.set_postfix_str(note, refresh=False)
            self.bar.update(n)
        elif self.enabled and time.monotonic() - self.last >= LOG_INTERVAL:
            self._line()

    def write(self, line: str) -> None:
        """A line of its own (an epoch's summary), without breaking the bar."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def _line(self) -> None:
        self.last = time.monotonic()
        self.shown = self.done
        note = f" [{self.note}]" if self.note else ""
        print(
            f"{self.desc}: {self.done}/{self.total} {_plural(self.unit)}, "
            f"{self.last - self.t0:.0f} s{note}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.enabled and self.done and self.done != self.shown:
            self._line()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
