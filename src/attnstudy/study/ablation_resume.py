"""An interrupted ablation run continued from its last finished batch (``--resume``).

While the battery runs, each finished batch's state (:mod:`attnstudy.analysis.suite_state`: its
per-step rows, per-example sums and rows, recorded maps) is written as one zip file, atomically,
and logged as an artifact of the ablation run, ``ablations/partial/batch-000012.zip`` — in the
run's artifact store, so any node that reaches the store can resume it. A batch counts only once
its whole file reads back (zip directory and CRCs), so a file cut by a SIGKILL or a lost node is a
batch not finished.

With ``resume``, :func:`attnstudy.study.ablation_runs.ablate_run` looks for the newest KILLED or
FAILED
ablation run of the same model run, study, ablation key (:func:`attnstudy.study.ablation_runs.
ablation_key`: every setting of the results) and code digest
(:mod:`attnstudy.runtime.code_version`),
reopens it, puts back its finished batches and computes the rest; every batch file carries the
same three keys and is refused if one differs, so a state is never reused across other settings
or code. The tables, summaries, pages and report are then those of an uninterrupted run, bit for
bit; only the timings differ (:data:`TIMING_METRICS`). Once the run is FINISHED its batch files are
removed.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from attnstudy.analysis.suite_state import BatchState, Journal
from attnstudy.runtime.notices import notice
from attnstudy.tracking import Kind, Tag, Tracker, TrackingError

PARTIAL = "ablations/partial"
"""Where an ablation run's batch files are, among its artifacts."""

TIMING_METRICS = ("ablation/seconds", "timing/", "system/", "progress/")
"""Metrics (a name, or a prefix ending in ``/``) that measure time or the machine, not results:
the only ones in which a resumed run may differ from an uninterrupted one."""


def is_timing_metric(name: str) -> bool:
    """Whether metric ``name`` is one of :data:`TIMING_METRICS`."""
    return any(name == t or (t.endswith("/") and name.startswith(t)) for t in TIMING_METRICS)


def resume_key(model_run_id: str, ablation_key: str, code_digest: str) -> dict[str, str]:
    """What every batch file of a run carries and a resume must match."""
    return {"model_run": model_run_id, "ablation_key": ablation_key, "code_digest": code_digest}


def _q(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def find_interrupted(
    tracker: Tracker,
    experiment_id: str,
    *,
    model_run_id: str,
    ablation_key: str,
    code_digest: str,
    study_id: str | None,
) -> str | None:
    """The newest KILLED or FAILED ablation run of ``model_run_id`` with this ablation key and
    code digest, in study ``study_id`` (None: one in no study), or None.

    A RUNNING run whose owner is gone is closed first (:func:`attnstudy.tracking.store.
    reconcile_orphans`: a SIGKILL, a lost node); one whose owner still runs is never taken.
    """
    from attnstudy.tracking import store

    store.reconcile_orphans(tracker, experiment_id)
    runs = tracker.search_runs(
        [experiment_id],
        f"tags.{Tag.KIND} = '{Kind.ABLATION}' and tags.{Tag.SOURCE_RUN_ID} = {_q(model_run_id)} "
        f"and tags.{Tag.ABLATION_KEY} = {_q(ablation_key)} "
        f"and tags.{Tag.CODE_DIGEST} = {_q(code_digest)}",
    )
    for r in runs:  # newest first
        if r.status in ("KILLED", "FAILED") and r.tags.get(Tag.STUDY_ID) == study_id:
            return r.run_id
    return None


class ArtifactJournal(Journal):
    """The batch files of one ablation run, kept among its artifacts (:data:`PARTIAL`).

    Args:
        tracker: the store.
        run_id: the ablation run.
        key: :func:`resume_key`.
        staging: a local folder for the files on their way (removed by :meth:`close`).
        resumed: whether the run is an interrupted one being continued (its files are read).
    """

    def __init__(self, tracker: Tracker, run_id: str, key: dict, *, resumed: bool = False):
        self._tmp = tempfile.TemporaryDirectory(prefix="attnstudy-partial-")
        super().__init__(Path(self._tmp.name), key)
        self.tracker = tracker
        self.run_id = run_id
        self.resumed = resumed
        self.restored = 0

    def restorable(self, plan) -> int:
        """Download the run's batch files (a resumed run only) and count the usable ones."""
        if not self.resumed:
            self.plan = list(plan)
            return 0
        try:
            if self.tracker.has_artifact(self.run_id, f"{PARTIAL}/{self.name(0)}"):
                got = Path(self.tracker.download_artifact(self.run_id, PARTIAL, self._tmp.name))
                if got != self.folder:
                    for f in got.iterdir():
                        shutil.move(str(f), self.folder / f.name)
        except TrackingError as err:
            notice(f"the finished batches of ablation run {self.run_id} cannot be read ({err})")
            return 0
        self.restored = super().restorable(plan)
        notice(
            f"--resume: ablation run {self.run_id} continues after the {self.restored} of its "
            f"{len(self.plan)} batches it finished"
        )
        return self.restored

    def finished(self, state: BatchState) -> None:
        """Write the batch's file and log it as an artifact of the run (then drop the local copy)."""
        super().finished(state)
        path = self.folder / self.name(state.index)
        self.tracker.log_artifact(self.run_id, path, PARTIAL)
        path.unlink(missing_ok=True)

    def __enter__(self) -> ArtifactJournal:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(finished=exc_type is None)

    def close(self, finished: bool) -> None:
        """Remove the local folder, and with ``finished`` the run's batch files from the store
        (the run holds its tables now; a store that cannot delete keeps them, with a note)."""
        self._tmp.cleanup()
        if finished:
            try:
                self.tracker.delete_artifacts(self.run_id, PARTIAL)
            except TrackingError as err:
                notice(f"ablation run {self.run_id} keeps its batch files {PARTIAL}/ ({err})")
