"""The battery's state after each finished batch, so an interrupted run continues from its last
finished batch (:func:`attnstudy.analysis.suite.run_suite`'s ``journal``).

What the suite keeps of a batch is all a later batch or the end needs from it: its per-step rows
(the Parquet part the step sink wrote, as bytes), its per-example sums of the summary statistics,
the per-example ablations' rows, what the example recorder took from it, its count of decoder
steps and the seconds each ablation spent on it. Batches depend on nothing but their own examples
(every random draw is keyed by example and step: docs/design.md §4), so a run that puts back
batches 0 … k−1 from their states and computes k, k+1, … writes the same tables, sums and records,
bit for bit, as one that computed them all; only the seconds differ.

A batch's state is one zip file (:func:`write_batch`): ``meta.json`` (the format, the run's key —
whatever its journal says must match, e.g. the ablation key, the model run and the code digest —
the batch's index, prefix and example ids), ``records.json`` and a Parquet file per table — data,
never code (no pickle). :func:`read_batch` refuses a file that is cut (no zip directory, a CRC
mismatch), of another format, of another key or of another batch (:class:`StateError`).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

FORMAT = 1
"""The layout of a batch file (its ``meta.json`` says which)."""


class StateError(ValueError):
    """A batch file that cannot be used: cut, of another format, key or batch."""


@dataclass
class UnitState:
    """One analysed unit's share of a batch.

    Attributes:
        unit: ``(layer, head)`` as the suite indexes units.
        steps: the Parquet bytes of the batch's per-step rows of this unit.
        sums: :func:`attnstudy.analysis.suite.example_sums` of those rows (indexed by example).
        parts: per-example ablation → its rows for the batch's examples.
    """

    unit: tuple[int, int]
    steps: bytes
    sums: pd.DataFrame
    parts: dict[str, pd.DataFrame] = field(default_factory=dict)


@dataclass
class BatchState:
    """What a finished batch leaves (see the module docstring).

    Attributes:
        index: the batch's position in the run's plan (the analysis prefix's batches, then the
            reference prefix's).
        prefix: ``greedy`` or ``reference``.
        example_ids: the batch's examples, in order.
        n_steps: its real decoder steps.
        units: every unit the run analyses, and ``n_layers`` the model's cross-attention layers
            (None: no attention), so a run whose every batch is put back knows them.
        unit_states: one per unit.
        records: what the example recorder took from the batch
            (:meth:`attnstudy.analysis.heatmaps.Recorder.part`).
        seconds: ablation → wall-clock seconds spent on the batch (timing, never a result).
        elapsed: wall-clock seconds of the run when the batch finished, from the battery's start,
            earlier processes of a resumed run included (timing; 0 in a batch file written
            before it was recorded).
    """

    index: int
    prefix: str
    example_ids: tuple[str, ...]
    n_steps: int
    units: list[tuple[int, int]]
    n_layers: int | None
    unit_states: list[UnitState]
    records: dict = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    elapsed: float = 0.0


def _canonical(key: dict) -> dict:
    return json.loads(json.dumps(key, sort_keys=True, default=str))


def _parquet(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf)  # the index too (the sums are indexed by example)
    return buf.getvalue()


def write_batch(state: BatchState, path: str | Path, key: dict) -> None:
    """Write ``state`` as one zip file at ``path``, atomically (a temporary file beside it, then
    :func:`os.replace`).

    Args:
        key: what a reader must match (JSON values), e.g. ``{"ablation_key": …, "model_run":
            …, "code_digest": …}``.

    Raises:
        OSError: the folder cannot be written.
    """
    path = Path(path)
    meta = {
        "format": FORMAT,
        "key": _canonical(key),
        "index": state.index,
        "prefix": state.prefix,
        "example_ids": list(state.example_ids),
        "n_steps": state.n_steps,
        "units": [list(u) for u in state.units],
        "n_layers": state.n_layers,
        "seconds": state.seconds,
        "elapsed": state.elapsed,
        "unit_states": [
            {"unit": list(u.unit), "parts": sorted(u.parts)} for u in state.unit_states
        ],
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("meta.json", json.dumps(meta))
            z.writestr("records.json", json.dumps(state.records, separators=(",", ":")))
            for k, u in enumerate(state.unit_states):
                z.writestr(f"unit{k}/steps.parquet", u.steps)
                z.writestr(f"unit{k}/sums.parquet", _parquet(u.sums))
                for name in sorted(u.parts):
                    z.writestr(f"unit{k}/part-{name}.parquet", _parquet(u.parts[name]))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def batch_meta(path: str | Path, key: dict, index: int, plan: Sequence[tuple[str, tuple]]) -> dict:
    """The ``meta.json`` of a batch file, checked: a whole zip (every member's CRC), this format,
    ``key``, batch ``index`` and the prefix and example ids ``plan[index]`` says.

    Raises:
        StateError: the file is cut or damaged, or of another format, key or batch (the
            message says which).
    """
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                raise StateError(f"member {bad} is damaged")
            meta = json.loads(z.read("meta.json"))
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, EOFError, zlib.error) as err:
        if isinstance(err, StateError):
            raise
        raise StateError(f"not a whole batch file ({type(err).__name__}: {err})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise StateError(f"not a batch file of format {FORMAT}")
    if meta.get("key") != _canonical(key):
        raise StateError("written by another run, settings or code (its key differs)")
    if index >= len(plan):
        raise StateError(f"batch {index} is past the run's {len(plan)} batches")
    prefix, ids = plan[index]
    if meta.get("index") != index or meta.get("prefix") != prefix:
        raise StateError(f"not batch {index} ({prefix} prefix)")
    if meta.get("example_ids") != list(ids):
        raise StateError(f"batch {index} holds other examples")
    return meta


def read_batch(
    path: str | Path, key: dict, index: int, plan: Sequence[tuple[str, tuple]]
) -> BatchState:
    """The state in a batch file written by :func:`write_batch` (checked as :func:`batch_meta`).

    Raises:
        StateError: as :func:`batch_meta`, or a member that does not read.
    """
    meta = batch_meta(path, key, index, plan)
    try:
        with zipfile.ZipFile(path) as z:
            records = json.loads(z.read("records.json"))
            units = []
            for k, u in enumerate(meta["unit_states"]):
                units.append(
                    UnitState(
                        unit=tuple(u["unit"]),
                        steps=z.read(f"unit{k}/steps.parquet"),
                        sums=pd.read_parquet(io.BytesIO(z.read(f"unit{k}/sums.parquet"))),
                        parts={
                            name: pd.read_parquet(
                                io.BytesIO(z.read(f"unit{k}/part-{name}.parquet"))
                            )
                            for name in u["parts"]
                        },
                    )
                )
        return BatchState(
            index=index,
            prefix=meta["prefix"],
            example_ids=tuple(meta["example_ids"]),
            n_steps=int(meta["n_steps"]),
            units=[tuple(u) for u in meta["units"]],
            n_layers=meta["n_layers"],
            unit_states=units,
            records=records,
            seconds={k: float(v) for k, v in meta["seconds"].items()},
            elapsed=float(meta.get("elapsed", 0.0)),
        )
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, TypeError, zlib.error) as err:
        raise StateError(f"batch {index} does not read ({type(err).__name__}: {err})") from None


class Journal:
    """Where a run's batch states go, and where an interrupted run's come back from: a folder.

    The suite calls :meth:`restorable` once with its plan (``(prefix, example ids)`` per batch,
    in order), :meth:`restore` for each batch it puts back, and :meth:`finished` after each batch
    it computed. A subclass keeps the files elsewhere (the ablation run's artifacts:
    :class:`attnstudy.study.ablation_resume.ArtifactJournal`).

    Args:
        folder: where the batch files are (``batch-000000.zip``, …).
        key: what every batch file must match (see :func:`write_batch`).
    """

    def __init__(self, folder: str | Path, key: dict):
        self.folder = Path(folder)
        self.key = key
        self.plan: list[tuple[str, tuple]] = []

    @staticmethod
    def name(index: int) -> str:
        """The file name of batch ``index``."""
        return f"batch-{index:06d}.zip"

    def restorable(self, plan: Sequence[tuple[str, tuple]]) -> int:
        """How many batches from the start of ``plan`` have a usable file (the first missing or
        refused one ends the count: a run resumes from its last finished batch, never past a
        gap)."""
        self.plan = list(plan)
        n = 0
        while n < len(self.plan) and (self.folder / self.name(n)).is_file():
            try:
                batch_meta(self.folder / self.name(n), self.key, n, self.plan)
            except StateError:
                break
            n += 1
        return n

    def restore(self, index: int) -> BatchState:
        """The state of batch ``index`` (one :meth:`restorable` counted).

        Raises:
            StateError: the file changed since it was counted.
        """
        return read_batch(self.folder / self.name(index), self.key, index, self.plan)

    def finished(self, state: BatchState) -> None:
        """Keep a computed batch's state (written atomically)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        write_batch(state, self.folder / self.name(state.index), self.key)
