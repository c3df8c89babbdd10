"""A study's records past a thousand models.

Study membership was kept in comma-joined tags on the study run (``model_run_ids`` …) and on
every model (``study_ids``), which MLflow caps at 8,000 characters (~240 run ids); every search
stopped at 1,000 runs (the orphan sweep and ``--resume`` included); the report read the runs one
``get_run`` at a time. Now each member run carries ``attnstudy.study.<study id> = "<role>
<position>"``, searches page through every result, and the report reads a study's runs with one
paged search. The 2,000-model stub study of ``tests/fixtures/stub_store.py`` holds the store
where no training could; a study recorded the old way is still read.
"""

from __future__ import annotations

import uuid

import pytest

from attnstudy.tracking import Kind, Role, Tag, Tracker, store
from attnstudy.tracking import client as tracking_client


def _runs(tracker: Tracker, exp_id: str, n: int, tags: dict[str, str] | None = None) -> list[str]:
    ids = []
    for i in range(n):
        ids.append(tracker.start_run(exp_id, f"r{i}", dict(tags or {})))
        tracker.end_run(ids[-1])
    return ids


def test_search_runs_pages_through_every_result(store_root, monkeypatch):
    """One request answered at most ``max_results`` runs (1,000 by default): the rest were
    silently left out. Now every page is asked for (MLflow's page token)."""
    tracker = Tracker()
    exp_id = tracker.experiment_id(f"paging-{uuid.uuid4().hex[:6]}")
    made = _runs(tracker, exp_id, 12)
    monkeypatch.setattr(tracking_client, "SEARCH_PAGE", 5)  # 12 runs: three pages
    every = tracker.search_runs([exp_id])
    assert [r.run_id for r in every] == made[::-1]  # newest first, none twice
    first = tracker.search_runs([exp_id], max_results=7)  # across two pages
    assert [r.run_id for r in first] == made[::-1][:7]


def test_runs_by_id_reads_in_bulk_in_the_given_order(store_root, monkeypatch):
    tracker = Tracker()
    exp_id = tracker.experiment_id(f"bulk-{uuid.uuid4().hex[:6]}")
    made = _runs(tracker, exp_id, 5)
    elsewhere = _runs(tracker, tracker.experiment_id(f"other-{uuid.uuid4().hex[:6]}"), 1)[0]
    monkeypatch.setattr(tracking_client, "IDS_PER_SEARCH", 2)
    calls = []
    monkeypatch.setattr(
        tracker, "get_run", lambda i: calls.append(i) or Tracker.get_run(tracker, i)
    )
    order = [made[3], made[0], elsewhere, made[4], made[0]]
    assert [r.run_id for r in tracker.runs_by_id([exp_id], order)] == order
    assert calls == [elsewhere]  # only the run outside the experiment is read alone


def test_a_study_record_writes_changes_only_and_drops_who_left(store_root):
    """A resumed study whose earlier failure now succeeded: the failed run leaves the study (the
    comma-joined list was rewritten whole); a member of another role is left alone."""
    tracker = Tracker()
    exp_id = tracker.experiment_id(f"record-{uuid.uuid4().hex[:6]}")
    study_id = store.start_study(tracker, exp_id, "record", "key", "commit")
    model, failed, adversary, other = _runs(tracker, exp_id, 4, {Tag.KIND: Kind.MODEL})
    store.add_member(tracker, study_id, adversary, Role.ADVERSARY, 0)
    record = store.StudyRecord(tracker, study_id, exp_id)
    roles = (Role.MODEL, Role.ABLATION, Role.FAILED)
    record.write({model: (Role.MODEL, 1), failed: (Role.FAILED, 0)}, roles)
    writes = []
    real = tracker.set_tags
    tracker.set_tags = lambda run_id, tags: writes.append(run_id) or real(run_id, tags)
    again = store.StudyRecord(tracker, study_id, exp_id)  # a resumed study reads what is held
    again.write({model: (Role.MODEL, 1), other: (Role.MODEL, 0)}, roles)
    assert writes == [other]  # the model's tag was already right
    tag = store.member_tag(study_id)
    assert tracker.get_run(model).tags[tag] == "model 1"
    assert tag not in tracker.get_run(failed).tags
    members = store.study_members(tracker, tracker.get_run(study_id))
    assert {k: [r.run_id for r in v] for k, v in members.items()} == {
        "model": [other, model],  # by position
        "adversary": [adversary],
    }


def test_a_study_recorded_the_old_way_is_still_read(store_root):
    """A store written before the membership tags: the study's comma-joined lists (and
    ``study_ids`` on its models) are read as they are, the runs in bulk."""
    tracker = Tracker()
    exp_id = tracker.experiment_id(f"old-{uuid.uuid4().hex[:6]}")
    study_id = store.start_study(tracker, exp_id, "old", "key", "commit")
    models = _runs(tracker, exp_id, 3, {Tag.KIND: Kind.MODEL, Tag.STUDY_IDS: study_id})
    ablations = [
        _runs(tracker, exp_id, 1, {Tag.KIND: Kind.ABLATION, Tag.SOURCE_RUN_ID: m})[0]
        for m in models[:2]
    ]
    failed = _runs(tracker, exp_id, 1, {Tag.KIND: Kind.ABLATION, Tag.SOURCE_RUN_ID: models[2]})
    adversary = _runs(tracker, exp_id, 1, {Tag.KIND: Kind.ADVERSARY})
    tracker.set_tags(  # as versions before 2026-12-07 recorded a study
        study_id,
        {
            Tag.MODEL_RUN_IDS: ",".join(models),
            Tag.ABLATION_RUN_IDS: ",".join(ablations),
            Tag.FAILED_RUN_IDS: ",".join(failed),
            Tag.ADVERSARY_RUN_IDS: ",".join(adversary),
        },
    )
    runs = store.study_runs(tracker, study_id)
    assert [r.run_id for r in runs.models] == models
    assert {k: r.run_id for k, r in runs.ablations.items()} == dict(
        zip(models, ablations + failed, strict=True)
    )
    assert [r.run_id for r in runs.adversaries] == adversary and runs.references == []


def test_a_reused_model_joins_a_second_study_without_a_growing_list(store_root):
    """``study_ids`` grew by a run id for every study that reused a model; now each study adds
    its own tag."""
    tracker = Tracker()
    exp_id = tracker.experiment_id(f"reuse-{uuid.uuid4().hex[:6]}")
    (model,) = _runs(tracker, exp_id, 1, {Tag.KIND: Kind.MODEL})
    studies = [store.start_study(tracker, exp_id, "reuse", "key", "c") for _ in range(3)]
    for study_id in studies:
        store.StudyRecord(tracker, study_id, exp_id).write({model: (Role.MODEL, 0)}, (Role.MODEL,))
    tags = tracker.get_run(model).tags
    assert Tag.STUDY_IDS not in tags
    assert [tags[store.member_tag(s)] for s in studies] == ["model 0"] * 3


@pytest.mark.slow
def test_a_2000_model_study_is_read_resumed_and_swept_whole(stub_study):
    """The report's reading, ``--resume``'s finished ablations and the orphan sweep each see all
    2,000 models (each stopped at 1,000 runs, or read them one request at a time)."""
    from tests.fixtures import stub_store

    tracker = Tracker(stub_study.uri, create=False)
    runs = store.study_runs(tracker, stub_study.study_id)
    assert [r.run_id for r in runs.models] == stub_study.models
    assert {k: r.run_id for k, r in runs.ablations.items()} == dict(
        zip(stub_study.models, stub_study.ablations, strict=True)
    )
    assert runs.models[1999].metrics == {"test/exact_match": 0.99}

    done = store.finished_ablations(tracker, stub_study.study_id, "stub-ablation-key")
    assert done == dict(zip(stub_study.models, stub_study.ablations, strict=True))
    tracker.end_run(stub_study.study_id, "KILLED")
    assert store.find_resumable_study(tracker, stub_study.experiment_id, "stub-study-key") == (
        stub_study.study_id
    )

    # 1,001 RUNNING models, the oldest left by a process that is gone (this PID with another
    # start time: a reused PID); the others owned by this live process: the newest 1,000 were
    # all a search returned
    alive = tracking_client.owner_tags()
    gone = alive | {Tag.OWNER_START: "0"}
    stub_store.mark_running(stub_study, {0: gone} | {i: alive for i in range(1, 1001)})
    closed = store.reconcile_orphans(tracker, stub_study.experiment_id)
    assert closed == [stub_study.models[0]]
    assert tracker.get_run(stub_study.models[0]).status == "KILLED"


@pytest.mark.slow
def test_a_study_records_more_members_than_a_tag_held(stub_study):
    """250 models recorded by a second study (the comma-joined list of 250 run ids, 8,250
    characters, was refused by MLflow: 8,000 at most); the first study keeps its 2,000."""
    tracker = Tracker(stub_study.uri, create=False)
    exp_id = stub_study.experiment_id
    second = store.start_study(tracker, exp_id, "stub", "another-key", "commit")
    members = {m: (Role.MODEL, i) for i, m in enumerate(stub_study.models[:250])}
    store.StudyRecord(tracker, second, exp_id).write(members, (Role.MODEL, Role.ABLATION))
    runs = store.study_runs(tracker, second)
    assert [r.run_id for r in runs.models] == stub_study.models[:250] and not runs.ablations
    first = store.study_runs(tracker, stub_study.study_id)
    assert len(first.models) == 2000 and len(first.ablations) == 2000


def _stub_study(tracker: Tracker, n: int) -> str:
    """A study of ``n`` finished stub models and their ablations, recorded as a study does."""
    exp_id = tracker.experiment_id(f"lookups-{uuid.uuid4().hex[:6]}")
    study_id = store.start_study(tracker, exp_id, "lookups", "key", "commit")
    members = {}
    for i in range(n):
        tags = {Tag.KIND: Kind.MODEL, Tag.TASK: "copy", Tag.VARIANT: f"v{i}", Tag.SEED: "1"}
        (model,) = _runs(tracker, exp_id, 1, tags)
        tags = {Tag.KIND: Kind.ABLATION, Tag.SOURCE_RUN_ID: model}
        (ablation,) = _runs(tracker, exp_id, 1, tags)
        members |= {model: (Role.MODEL, i), ablation: (Role.ABLATION, i)}
    store.StudyRecord(tracker, study_id, exp_id).write(members, (Role.MODEL, Role.ABLATION))
    return study_id


def test_the_report_reads_a_study_without_a_lookup_per_run(store_root, monkeypatch):
    """The report read each recorded run with its own get_run, and each artifact check looked the
    run up again (six per model: 12,000 lookups and 420 s for a 2,000-model study on a busy
    machine). Now the store's run lookups do not grow with the number of models."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from attnstudy.report.store import load_study

    tracker = Tracker()
    small, large = _stub_study(tracker, 2), _stub_study(tracker, 6)
    lookups = []
    real = SqlAlchemyStore.get_run
    monkeypatch.setattr(
        SqlAlchemyStore,
        "get_run",
        lambda self, run_id: lookups.append(run_id) or real(self, run_id),
    )
    counts = []
    for study_id, n in ((small, 2), (large, 6)):
        lookups.clear()
        data = load_study(tracker, study_id)
        assert [e.variant for e in data.entries] and len(data.entries) == n
        counts.append(len(lookups))
    assert counts[0] == counts[1] <= 1, counts  # the study run itself
