"""Two workers writing the same row at once (Ray against one server): MLflow creates a dataset and
a registered-model alias by look-up-then-insert, so the slower insert violates the key; the
tracker retries, finds the other worker's row, and links or updates it. Measured against
PostgreSQL: ``duplicate key value violates unique constraint "dataset_pk"`` failed a training of a
2-worker dates study, and ``… "registered_model_alias_pk"`` (two seeds of one model both setting
``best``) one of the CI cluster test's copy trainings."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException

from attnstudy.data.types import Example
from attnstudy.tracking import Tracker
from attnstudy.tracking import client as tracking_client
from attnstudy.tracking import datasets as ds
from attnstudy.tracking.client import TrackingError

SPLITS = {
    "train": [Example(f"t/{i}", ("a", "b"), ("b", "a")) for i in range(5)],
    "test": [Example("x/0", ("c",), ("c",))],
}
RACE = (
    '(psycopg.errors.UniqueViolation) duplicate key value violates unique constraint "dataset_pk"'
)


@pytest.fixture
def tracker(tmp_path, monkeypatch):
    monkeypatch.setattr(tracking_client.time, "sleep", lambda s: None)
    return Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")


def _failing_first(real, message: str, times: int = 1):
    calls = {"n": 0}

    def log_inputs(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] <= times:
            raise MlflowException(message)
        return real(*args, **kwargs)

    return log_inputs, calls


def test_a_run_that_loses_the_dataset_race_links_the_winners_dataset(tracker, monkeypatch):
    exp = tracker.experiment_id("race")
    first, second = (tracker.start_run(exp, n) for n in ("a", "b"))
    ds.log_splits(tracker, first, SPLITS, "copy", {"task": "copy"})
    failing, calls = _failing_first(tracker.client.log_inputs, RACE)
    monkeypatch.setattr(tracker.client, "log_inputs", failing)
    out = ds.log_splits(tracker, second, SPLITS, "copy", {"task": "copy"})
    assert calls["n"] == 2 and out["train"][0] == "copy/train"
    a, b = (tracker.client.get_run(r).inputs.dataset_inputs for r in (first, second))
    assert sorted(d.dataset.digest for d in a) == sorted(d.dataset.digest for d in b)
    assert len(b) == 2  # both splits linked to the second run, no duplicate dataset made


def test_other_store_errors_are_not_retried(tracker, monkeypatch):
    exp = tracker.experiment_id("race")
    run = tracker.start_run(exp, "a")
    failing, calls = _failing_first(tracker.client.log_inputs, "RESOURCE_DOES_NOT_EXIST: no run")
    monkeypatch.setattr(tracker.client, "log_inputs", failing)
    with pytest.raises(TrackingError, match="RESOURCE_DOES_NOT_EXIST"):
        ds.log_splits(tracker, run, SPLITS, "copy", {"task": "copy"})
    assert calls["n"] == 1


def test_a_race_that_never_resolves_gives_up_with_the_store_error(tracker, monkeypatch):
    exp = tracker.experiment_id("race")
    run = tracker.start_run(exp, "a")
    failing, calls = _failing_first(tracker.client.log_inputs, RACE, times=99)
    monkeypatch.setattr(tracker.client, "log_inputs", failing)
    with pytest.raises(TrackingError, match="dataset_pk"):
        ds.log_splits(tracker, run, SPLITS, "copy", {"task": "copy"})
    assert calls["n"] == tracking_client.RACE_RETRIES + 1


ALIAS_RACE = (
    "(psycopg.errors.UniqueViolation) duplicate key value violates unique constraint "
    '"registered_model_alias_pk"'
)


def test_an_alias_set_by_two_workers_at_once_is_retried_and_points_at_the_version(
    tracker, monkeypatch
):
    tracker.client.create_registered_model("m")
    exp = tracker.experiment_id("race")
    run = tracker.start_run(exp, "a")
    for _ in range(2):
        tracker.client.create_model_version("m", source="file:///nowhere", run_id=run)
    tracker.set_alias("m", "best", "1")  # the other worker's alias, set first
    failing, calls = _failing_first(tracker.client.set_registered_model_alias, ALIAS_RACE)
    monkeypatch.setattr(tracker.client, "set_registered_model_alias", failing)
    tracker.set_alias("m", "best", "2")
    assert calls["n"] == 2
    assert str(tracker.client.get_model_version_by_alias("m", "best").version) == "2"
