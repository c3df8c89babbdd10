"""Memory per Ray task as a setting: ``training.memory_gib`` becomes each of a
model's tasks' Ray ``memory`` request (workers measured up to 0.8 GiB), and a study whose request
no node holds is refused before anything runs (Ray would keep the task pending for ever)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnstudy.config import ConfigError
from attnstudy.executors.distributed import GIB, check_memory, task_memory
from attnstudy.experiment import load_experiment

TINY = Path(__file__).parents[2] / "experiments" / "tiny.toml"
NODES = [{"CPU": 2.0, "memory": 3.5 * GIB}, {"CPU": 1.0, "memory": 1.0 * GIB}]


def test_memory_per_task_is_a_setting():
    cfg = load_experiment(TINY, ["training.memory_gib=1.5"])
    assert {task_memory(s)["memory"] for s in cfg.runs()} == {1_610_612_736}  # 1.5 × 2**30
    assert all(task_memory(s) == {} for s in load_experiment(TINY).runs())  # default: none
    check_memory(cfg, NODES)  # the first node holds it


def test_a_request_no_node_holds_is_refused_in_one_line():
    cfg = load_experiment(TINY, ["training.memory_gib=4"])
    with pytest.raises(ConfigError) as caught:
        check_memory(cfg, NODES)
    assert str(caught.value) == (
        f"no node of the Ray cluster can run {cfg.runs()[0].name!r}: training.memory_gib = 4 GiB, "
        "the largest node has 3.5 GiB for tasks; lower training.memory_gib, or add such a node"
    )


@pytest.mark.parametrize("bad", ["0", "-1", "5000"])
def test_a_bad_memory_setting_is_refused(bad):
    with pytest.raises(Exception, match="memory_gib"):
        load_experiment(TINY, [f"training.memory_gib={bad}"])


def test_memory_is_not_part_of_the_model_key():
    from attnstudy.study.model_runs import model_key

    plain = [model_key(s) for s in load_experiment(TINY).runs()]
    with_memory = [model_key(s) for s in load_experiment(TINY, ["training.memory_gib=2"]).runs()]
    assert plain == with_memory
