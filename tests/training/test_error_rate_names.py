"""Task-appropriate metric names from the task registry: a G2P run logs the phoneme error rate as
``per``; every other task's runs log the token error rate as ``token_error_rate`` (a TSV or copy
task logged ``test/per``, a G2P term); the report reads both, so stored runs keep their numbers."""

from __future__ import annotations

import pytest

from attnstudy.config import RunSpec
from attnstudy.data.tasks import TASKS, error_rate_name, report_metrics
from attnstudy.data.types import Example
from attnstudy.models.training import LOWER_IS_BETTER, early_stopping_metric
from attnstudy.scoring.metrics import evaluate, heldout_metrics


def test_each_task_names_its_error_rate():
    assert {name: t.error_rate for name, t in TASKS.items()} == {
        name: "per" if name == "g2p" else "token_error_rate" for name in TASKS
    }
    assert error_rate_name("no-such-task") == "per"  # a store of another version
    assert "token_error_rate" in LOWER_IS_BETTER


def test_the_metrics_carry_the_name_given():
    examples = [Example(id="a", src=("a", "b"), tgt=("a", "b")), Example("b", ("c",), ("c", "d"))]
    hyps = [["a", "b"], ["c"]]
    m = evaluate(hyps, examples, error_rate="token_error_rate")
    assert m["token_error_rate"] == pytest.approx(1 / 4) and "per" not in m
    assert evaluate(hyps, examples)["per"] == pytest.approx(1 / 4)  # the default, unchanged
    held = heldout_metrics(hyps, examples, lambda i: i == "b", "token_error_rate")
    assert held["test_heldout/token_error_rate"] == pytest.approx(1 / 2)


def test_the_report_reads_a_run_logged_before_and_after_alike():
    old = {"test/per": 0.25, "best_dev/per": 0.3, "test/exact_match": 0.5}
    new = {"test/token_error_rate": 0.25, "best_dev/token_error_rate": 0.3, "test/exact_match": 0.5}
    assert report_metrics("copy", old) == old
    assert report_metrics("copy", new) == new | {"test/per": 0.25, "best_dev/per": 0.3}
    g2p = {"test/per": 0.1}
    assert report_metrics("g2p", g2p) == g2p and report_metrics("g2p", g2p) is not g2p


@pytest.mark.parametrize(
    ("task", "configured", "chosen"),
    [
        ("copy", "auto", "exact_match"),
        ("copy", "per", "token_error_rate"),
        ("copy", "token_error_rate", "token_error_rate"),
        ("g2p", "auto", "per"),
        ("g2p", "token_error_rate", "per"),
        ("copy", "loss", "loss"),
    ],
)
def test_early_stopping_on_the_error_rate_reads_the_tasks_name(task, configured, chosen):
    data = (
        {"task": task, "n_train": 10, "n_dev": 5, "n_test": 5} if task == "copy" else {"task": task}
    )
    spec = RunSpec(
        experiment="x", seed=1, data=data, model={}, training={"early_stopping": configured}
    )
    assert early_stopping_metric(spec) == chosen


def test_a_copy_run_logs_its_token_error_rate_under_the_registry_name(tiny_models):
    from attnstudy.tracking import Tracker

    tracker = Tracker(create=False)
    for m in tiny_models:
        metrics = tracker.get_run(m.run_id).metrics
        assert "test/token_error_rate" in metrics and "dev/token_error_rate" in metrics
        assert not any(k.endswith("/per") for k in metrics), sorted(metrics)
