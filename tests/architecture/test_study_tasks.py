"""The study's tasks have one home: the executors that run models side by side (the local worker
processes and Ray) take the tasks, the job records, the interrupt clean-up and the best-alias
settling from :mod:`attnstudy.study.tasks` by public names, and neither reaches into another
module's private names nor the standard library's (``ProcessPoolExecutor._processes``)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "attnstudy"
EXECUTORS = ("executors/local_workers.py", "executors/distributed.py", "study/tasks.py")


def _private_reaches(path: Path) -> list[str]:
    """``from M import _name`` and ``obj._attr`` of something not its own (``self``, ``cls``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            out += [
                f"{path.name}:{node.lineno} imports {node.module}.{a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
        elif (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            out.append(f"{path.name}:{node.lineno} reads {ast.unparse(node)}")
    return out


def test_the_executors_reach_no_private_names():
    bad = [line for name in EXECUTORS for line in _private_reaches(SRC / name)]
    assert not bad, "\n".join(bad)


def test_the_tasks_live_in_study_tasks_and_the_executors_share_them():
    from attnstudy.executors import distributed, local_workers
    from attnstudy.study import tasks as study_tasks

    for name in ("Job", "record_jobs", "settle_best_aliases", "end_interrupted"):
        assert getattr(local_workers, name) is getattr(study_tasks, name)
        assert getattr(distributed, name) is getattr(study_tasks, name)
    assert local_workers.train_task is study_tasks.train_task
    assert local_workers.ablate_task is study_tasks.ablate_task
    # the Ray tasks are the same functions with the Ray task's device placement
    text = (SRC / "executors" / "distributed.py").read_text(encoding="utf-8")
    assert "study_tasks.train_task(job, placed_here)" in text
    assert "study_tasks.ablate_task(trained, job, placed_here)" in text
