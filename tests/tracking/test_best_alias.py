"""The ``best`` alias breaks a tie on the dev metric by the dev loss (lower wins), then the seed.

Four identical studies on the cluster put ``best`` on seed1 or seed2 alternately (whichever
version registered last won a tie on ``best_dev/acc``) although their dev losses differed.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from attnstudy.pages.run_pages import set_best_alias
from attnstudy.tracking import RunRecord


class FakeRegistry:
    """The three tracker calls ``set_best_alias`` makes, over fixed runs."""

    def __init__(self, runs: dict[str, RunRecord], order: list[str]):
        self.runs = runs
        self.versions = [SimpleNamespace(version=v, run_id=v) for v in order]
        self.aliases: dict[str, str] = {}

    def model_versions(self, name):
        return list(self.versions)

    def get_run(self, run_id):
        return self.runs[run_id]

    def set_alias(self, name, alias, version):
        self.aliases[alias] = version


def _run(version: str, seed: int, metrics: dict[str, float]) -> RunRecord:
    return RunRecord(version, "1", f"m/seed{seed}", "FINISHED", {"seed": str(seed)}, {}, metrics)


@pytest.mark.parametrize("order", [["1", "2"], ["2", "1"]], ids=["seed1-first", "seed2-first"])
def test_a_tie_on_the_dev_metric_goes_to_the_lower_dev_loss(order):
    runs = {
        "1": _run("1", 1, {"best_dev/acc": 0.75, "best_dev/loss": 0.40}),
        "2": _run("2", 2, {"best_dev/acc": 0.75, "best_dev/loss": 0.31}),
    }
    reg = FakeRegistry(runs, order)
    set_best_alias(reg, "m", "acc")
    assert reg.aliases == {"best": "2"}


@pytest.mark.parametrize("order", [["1", "2"], ["2", "1"]], ids=["seed1-first", "seed2-first"])
def test_a_tie_on_metric_and_loss_goes_to_the_lower_seed(order):
    runs = {
        "1": _run("1", 7, {"best_dev/per": 0.2, "best_dev/loss": 0.5}),
        "2": _run("2", 3, {"best_dev/per": 0.2, "best_dev/loss": 0.5}),
    }
    reg = FakeRegistry(runs, order)
    set_best_alias(reg, "m", "per")
    assert reg.aliases == {"best": "2"}  # seed 3 before seed 7


def test_the_metric_still_decides_before_the_loss():
    runs = {
        "1": _run("1", 1, {"best_dev/per": 0.10, "best_dev/loss": 0.9}),  # lower PER wins
        "2": _run("2", 2, {"best_dev/per": 0.20, "best_dev/loss": 0.1}),
        "3": _run("3", 3, {"best_dev/loss": 0.01}),  # no metric: never best
    }
    reg = FakeRegistry(runs, ["3", "2", "1"])
    set_best_alias(reg, "m", "per")
    assert reg.aliases == {"best": "1"}
