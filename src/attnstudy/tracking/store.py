"""The study store: how studies, model runs and ablation runs are written and found again.

The writer side (starting and recording runs with their tags) and the reader side (what a report
reads back: exactly the runs a study recorded) share :mod:`attnstudy.tracking.schema`, so a tag
or artifact path is spelled once. Everything returns plain :class:`RunRecord` objects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..models.io import MODEL_FILES
from .client import Tracker, owner_alive
from .leases import lease_expired
from .schema import Artifact, Kind, Role, RunRecord, Tag


def _q(value: str) -> str:
    """A value quoted for an MLflow filter string."""
    return "'" + value.replace("'", "\\'") + "'"


def find_finished_model(
    tracker: Tracker, experiment_id: str, model_key: str, model_files: bool = True
) -> RunRecord | None:
    """The newest FINISHED model run with this model key whose model files are all in the store,
    or None (a run whose files were deleted is never reused). ``model_files=False``: a run that
    stores none (a pretrained model's, whose files are its folder)."""
    runs = tracker.search_runs(
        [experiment_id],
        f"tags.{Tag.MODEL_KEY} = {_q(model_key)} and tags.{Tag.KIND} = '{Kind.MODEL}' "
        "and attributes.status = 'FINISHED'",
        max_results=20,
    )
    for r in runs:
        if not model_files or all(
            tracker.has_artifact(r.run_id, f"{Artifact.MODEL_DIR}/{f}") for f in MODEL_FILES
        ):
            return r
    return None


def member_tag(study_id: str) -> str:
    """The tag that makes a run a member of the study ``study_id``:
    ``attnstudy.study.<study id>``, its value ``"<role> <position>"``."""
    return f"{Tag.STUDY_MEMBER_PREFIX}{study_id}"


def _members_query(study_id: str) -> str:
    return f"tags.`{member_tag(study_id)}` LIKE '%'"


def add_member(tracker: Tracker, study_id: str, run_id: str, role: Role, position: int) -> None:
    """Record one run of a study (a trained adversary, a reference aligner run): its
    ``attnstudy.study.<study id>`` tag, ``"<role> <position>"``."""
    tracker.set_tags(run_id, {member_tag(study_id): f"{role} {position}"})


class StudyRecord:
    """Which runs a study recorded, kept on the member runs: one tag each,
    ``attnstudy.study.<study id> = "<role> <position>"`` (no size limit: the comma-joined lists
    on the study run that older versions wrote stopped at ~240 run ids, MLflow's 8,000
    characters). :meth:`write` changes only what differs from what the store holds (read once,
    by one search, on the first write: a resumed study's earlier members included).

    Args:
        experiment_id: the study's experiment (its members' too).
    """

    def __init__(self, tracker: Tracker, study_id: str, experiment_id: str):
        self.tracker, self.study_id, self.experiment_id = tracker, study_id, experiment_id
        self.tag = member_tag(study_id)
        self.held: dict[str, str] | None = None  # run id → the tag's value in the store

    def write(self, members: dict[str, tuple[Role, int]], roles: tuple[Role, ...]) -> None:
        """Make the study's members of ``roles`` exactly ``members`` (run id → (role, position)):
        new or changed ones are tagged, members of those roles no longer listed lose the tag (a
        resumed study's earlier failure that now succeeded)."""
        if self.held is None:
            self.held = {
                r.run_id: r.tags.get(self.tag, "")
                for r in self.tracker.search_runs(
                    [self.experiment_id], _members_query(self.study_id), deleted=True
                )
            }
        wanted = {run_id: f"{role} {position}" for run_id, (role, position) in members.items()}
        for run_id, value in wanted.items():
            if self.held.get(run_id) != value:
                self.tracker.set_tags(run_id, {self.tag: value})
                self.held[run_id] = value
        for run_id, value in list(self.held.items()):
            if run_id not in wanted and value.partition(" ")[0] in roles:
                self.tracker.delete_tags(run_id, [self.tag])
                del self.held[run_id]


def study_members(tracker: Tracker, study: RunRecord) -> dict[str, list[RunRecord]]:
    """Role → the runs ``study`` recorded in that role (its members' tags, trash included), by
    position; empty for a study recorded before those tags (its comma-joined lists are read by
    :func:`study_runs`). One paged search, whatever the number of runs."""
    runs = tracker.search_runs([study.experiment_id], _members_query(study.run_id), deleted=True)
    placed = sorted(
        ((m, r) for r in runs if (m := r.membership(study.run_id)) is not None),
        key=lambda mr: (mr[0][1], mr[1].kind, mr[1].run_id),
    )
    out: dict[str, list[RunRecord]] = {}
    for (role, _), r in placed:
        out.setdefault(role, []).append(r)
    return out


def start_study(
    tracker: Tracker, experiment_id: str, experiment: str, study_key: str, git_commit: str
) -> str:
    """A new study run ``<experiment>/study``; returns its id."""
    run_id = tracker.start_run(
        experiment_id,
        f"{experiment}/study",
        {
            Tag.KIND: Kind.STUDY,
            Tag.EXPERIMENT: experiment,
            Tag.GIT_COMMIT: git_commit,
            Tag.STUDY_KEY: study_key,
        },
    )
    tracker.set_tags(run_id, {Tag.STUDY_ID: run_id})
    return run_id


def interrupted_studies(
    tracker: Tracker, experiment_id: str, study_key: str | None = None
) -> list[str]:
    """The KILLED or FAILED study runs of an experiment, newest first: those with this study key,
    or all of them (``None``)."""
    query = f"tags.{Tag.KIND} = '{Kind.STUDY}'"
    if study_key is not None:
        query += f" and tags.{Tag.STUDY_KEY} = {_q(study_key)}"
    runs = tracker.search_runs([experiment_id], query)
    return [r.run_id for r in runs if r.status in ("KILLED", "FAILED")]


def find_resumable_study(tracker: Tracker, experiment_id: str, study_key: str) -> str | None:
    """The newest KILLED or FAILED study run with this study key, or None."""
    return next(iter(interrupted_studies(tracker, experiment_id, study_key)), None)


def finished_ablations(tracker: Tracker, study_id: str, ablation_key: str) -> dict[str, str]:
    """Model run id → FINISHED ablation run of this study with this ablation key (for ``--resume``)."""
    exp_id = tracker.get_run(study_id).experiment_id
    runs = tracker.search_runs(
        [exp_id],
        f"tags.{Tag.KIND} = '{Kind.ABLATION}' and tags.{Tag.STUDY_ID} = {_q(study_id)} and "
        f"tags.{Tag.ABLATION_KEY} = {_q(ablation_key)} and attributes.status = 'FINISHED'",
    )
    return {r.tags.get(Tag.SOURCE_RUN_ID, ""): r.run_id for r in reversed(runs)}  # the newest wins


def owner_note(run: RunRecord) -> str:
    """Why a RUNNING run is running: its owner is alive, gone, or on another host."""
    if run.status != "RUNNING":
        return ""
    alive = owner_alive(run.tags)
    pid = run.tags.get(Tag.OWNER_PID, "?")
    if alive is None:
        return f" (owner PID {pid} on {run.tags.get(Tag.OWNER_HOST, 'another host')})"
    return (
        f" (still being written by PID {pid})"
        if alive
        else f" (its process {pid} is gone: it was killed)"
    )


def reconcile_orphans(tracker: Tracker, experiment_id: str, now: float | None = None) -> list[str]:
    """Close as KILLED the RUNNING runs whose owner is gone, whichever node they ran on.

    A SIGKILL, an OOM kill, a full disk or a lost cluster node can end a process before it closes
    its runs; the next process that writes the experiment closes them, so no dead run looks
    unfinished for ever. A run's owner is gone when

    * its owner process is on this host and no longer runs (the PID check, at once), or
    * its lease expired (:mod:`attnstudy.tracking.leases`: a run of a tracking server carries a
      lease its owner renews every quarter of its length), on any host; a run whose owner
      process still runs on this host is never closed for its lease alone.

    Each closed run gets ``error.class=OwnerGone``, ``error.message`` and a description saying
    why (a resumed study run drops them again: :meth:`Tracker.reopen_run`).

    Args:
        now: Unix time to judge leases by (default: the clock; a fake one in tests).

    Returns:
        The run ids marked KILLED.
    """
    import socket
    from datetime import UTC, datetime

    now = time.time() if now is None else now
    closed = []
    for r in tracker.search_runs([experiment_id], "attributes.status = 'RUNNING'"):
        pid = r.tags.get(Tag.OWNER_PID, "?")
        host = r.tags.get(Tag.OWNER_HOST) or "an unknown host"
        alive = owner_alive(r.tags)
        if alive is False:
            why = f"process {pid} ended without closing the run"
        elif alive is None and lease_expired(r.tags, now):
            when = datetime.fromtimestamp(float(r.tags[Tag.LEASE_EXPIRES]), UTC)
            here = "" if host != socket.gethostname() else " (this host)"
            why = (
                f"its owner, process {pid} on {host}{here}, stopped renewing its lease (expired "
                f"{when:%Y-%m-%d %H:%M:%S} UTC): the process or its node is gone"
            )
        else:
            continue
        tracker.set_tags(
            r.run_id,
            {
                Tag.ERROR_CLASS: "OwnerGone",
                Tag.ERROR_MESSAGE: why,
                Tag.NOTE: f"Killed: {why} (marked by a later process)",
            },
        )
        tracker.end_run(r.run_id, "KILLED")
        closed.append(r.run_id)
    return closed


def latest_study(tracker: Tracker, experiment: str) -> tuple[str, str]:
    """The newest FINISHED study run of ``experiment`` (else the newest study of any status).

    Returns:
        (study run id, a note when it is not simply the newest study, else "").

    Raises:
        LookupError: no such experiment, or it has no study run.
    """
    exp_id = tracker.experiment_id(experiment, create=False)
    if exp_id is None:
        raise LookupError(
            f"no experiment named {experiment!r} in {tracker.uri}; run 'attnstudy run' first"
        )
    runs = tracker.search_runs([exp_id], f"tags.{Tag.KIND} = '{Kind.STUDY}'")
    if not runs:
        raise LookupError(f"experiment {experiment!r} has no study run; run 'attnstudy run' first")
    finished = [r for r in runs if r.status == "FINISHED"]
    chosen = finished[0] if finished else runs[0]
    note = ""
    if chosen is not runs[0]:
        note = (
            f"reporting the newest finished study {chosen.run_id}; the newer study {runs[0].run_id} "
            f"is {runs[0].status} (name it with --study to report it)"
        )
    elif not finished:
        note = (
            f"experiment {experiment!r} has no finished study; reporting the newest, {chosen.run_id}, "
            f"which is {chosen.status}"
        )
    return chosen.run_id, note


@dataclass
class StudyRuns:
    """The runs of one study, as the study recorded them (the report's input).

    Attributes:
        study: the study run.
        models: its model runs (trained or reused), in order, then those whose training failed.
        ablations: model run id → that model's ablation run of this study (finished or failed).
        adversaries: its trained adversary runs, in order.
        references: its reference aligner runs, in order.
    """

    study: RunRecord
    models: list[RunRecord] = field(default_factory=list)
    ablations: dict[str, RunRecord] = field(default_factory=dict)
    adversaries: list[RunRecord] = field(default_factory=list)
    references: list[RunRecord] = field(default_factory=list)


def study_runs(tracker: Tracker, study_id: str) -> StudyRuns:
    """Read back exactly the runs a study recorded, in bulk: its members' tags
    (:class:`StudyRecord`, one paged search); a study recorded by an older version, its
    comma-joined lists (``model_run_ids``, ``ablation_run_ids``, ``failed_run_ids``,
    ``adversary_run_ids``, ``reference_alignment_run_ids``; the runs read by id in bulk), and
    one recorded before those, its ablation runs' ``study_id`` tag.

    Raises:
        ModelNotFoundError: no run with that id. LookupError: it is not a study run.
    """
    study = tracker.find_run(study_id)
    if study.kind != Kind.STUDY:
        raise LookupError(f"run {study_id} is not a study run (kind={study.kind or None!r})")
    members = study_members(tracker, study)
    if members:
        failed = members.get(Role.FAILED, [])
        models = members.get(Role.MODEL, []) + [r for r in failed if r.kind == Kind.MODEL]
        ablations = members.get(Role.ABLATION, []) + [r for r in failed if r.kind == Kind.ABLATION]
        return StudyRuns(
            study,
            models,
            {r.tags.get(Tag.SOURCE_RUN_ID, ""): r for r in ablations},
            members.get(Role.ADVERSARY, []),
            members.get(Role.REFERENCE, []),
        )
    lists = (
        Tag.MODEL_RUN_IDS,
        Tag.ABLATION_RUN_IDS,
        Tag.FAILED_RUN_IDS,
        Tag.ADVERSARY_RUN_IDS,
        Tag.REFERENCE_RUN_IDS,
    )
    every = tracker.runs_by_id([study.experiment_id], [i for t in lists for i in study.ids(t)])
    by_id = {r.run_id: r for r in every}

    def runs(tag: str) -> list[RunRecord]:
        return [by_id[i] for i in study.ids(tag)]

    failed = runs(Tag.FAILED_RUN_IDS)
    if Tag.ABLATION_RUN_IDS in study.tags:
        ablations = runs(Tag.ABLATION_RUN_IDS)
    else:
        ablations = list(
            reversed(
                tracker.search_runs(
                    [study.experiment_id],
                    f"tags.{Tag.KIND} = '{Kind.ABLATION}' and tags.{Tag.STUDY_ID} = {_q(study_id)}",
                )
            )
        )
    ablations += [r for r in failed if r.kind == Kind.ABLATION]
    models = runs(Tag.MODEL_RUN_IDS) + [r for r in failed if r.kind == Kind.MODEL]
    return StudyRuns(
        study,
        models,
        {r.tags.get(Tag.SOURCE_RUN_ID, ""): r for r in ablations},
        runs(Tag.ADVERSARY_RUN_IDS),
        runs(Tag.REFERENCE_RUN_IDS),
    )


def running_task_runs(tracker: Tracker, experiment_id: str, token: str) -> list[RunRecord]:
    """The RUNNING runs a cluster task started (its ``attnstudy.cluster_task`` tag is ``token``),
    newest first."""
    return tracker.search_runs(
        [experiment_id],
        f"tags.`{Tag.CLUSTER_TASK}` = {_q(token)} and attributes.status = 'RUNNING'",
    )


def fail_task_runs(
    tracker: Tracker, experiment_id: str, token: str, reason: str, status: str = "FAILED"
) -> list[str]:
    """End every run that a cluster task started (its ``attnstudy.cluster_task`` tag is ``token``)
    and left RUNNING: its worker died (or was cancelled) before it could close them.

    Args:
        reason: why, for the runs' error tags and description.
        status: ``FAILED`` (a dead worker) or ``KILLED`` (an interrupted study).

    Returns:
        The run ids ended, innermost (newest) first.
    """
    runs = running_task_runs(tracker, experiment_id, token)
    end_task_runs(tracker, runs, reason, status)
    return [r.run_id for r in runs]


def end_task_runs(
    tracker: Tracker, runs: list[RunRecord], reason: str, status: str = "FAILED"
) -> None:
    """End ``runs`` (left RUNNING by a cluster task's dead attempt) with ``status`` — ``FAILED``
    (a dead worker) or ``KILLED`` (an interrupted study, or a retry taking over) — and ``reason``
    in their error tags and description."""
    for r in runs:
        tracker.set_tags(
            r.run_id,
            {
                Tag.ERROR_CLASS: "WorkerDied" if status == "FAILED" else "Interrupted",
                Tag.ERROR_MESSAGE: reason[:500],
                Tag.NOTE: f"{'Failed' if status == 'FAILED' else 'Killed'}: {reason}",
            },
        )
        tracker.end_run(r.run_id, status)
