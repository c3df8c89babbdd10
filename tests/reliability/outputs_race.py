"""A writer of one folder among several at once, for test_outputs' race test: run in a process of
its own (``multiprocessing``'s spawn: this module imports nothing but
:mod:`attnstudy.runtime.outputs`)."""

from __future__ import annotations

import os
from pathlib import Path

from attnstudy.runtime import outputs

FILES = 20
"""Files each writer's folder holds (beside a sub-folder with one more)."""


def build(writer: str, folder: Path) -> None:
    """A report folder whose every file names its ``writer``."""
    for k in range(FILES):
        (folder / f"f{k}.txt").write_text(writer)
    (folder / "sub").mkdir()
    (folder / "sub" / "g.txt").write_text(writer)


def writer(out: str, start, results, rounds: int) -> None:
    """Replace ``out`` ``rounds`` times once every writer has reached ``start`` (a barrier); put
    ``(outcome, text)`` on ``results`` for each: ``ok``, ``raced`` (the one line of
    :class:`outputs.ReplacedMeanwhileError`) or ``error`` (anything else, with its type)."""
    start.wait()
    for i in range(rounds):
        name = f"{os.getpid()}-{i}"
        try:
            outputs.replace_folder(
                out, lambda d, name=name: build(name, d), kind="report", option="--out"
            )
            results.put(("ok", name))
        except outputs.ReplacedMeanwhileError as err:
            results.put(("raced", str(err)))
        except BaseException as err:  # noqa: BLE001 - reported to the test, which fails
            results.put(("error", f"{type(err).__name__}: {err}"))
