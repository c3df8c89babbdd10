"""A task lost with its Ray worker is reported when the driver learns of it, not when the study
ends (a field case: the line came 97 s after the kill, once every other variant had finished;
hours in a big study). The driver collects each task as it finishes (``ray.wait`` one at a time);
``RayExecutor._collect`` of a task whose worker died closes the runs it left RUNNING and says so
at once, naming the variant, the phase, the run it took down and the cause. Ray itself is
replaced by a stand-in whose ``get`` raises Ray's error (no cluster: fast, deterministic); the
real kill (of a node, then retried) is
tests/distributed/test_cluster.py::test_a_dead_node_is_retried_and_the_retry_continues_its_run."""

from __future__ import annotations

import types

from attnstudy.executors.distributed import RayExecutor
from attnstudy.runtime.notices import said
from attnstudy.study.tasks import Job
from attnstudy.tracking import Tag, Tracker


class _RayError(Exception):
    pass


class _EnvError(_RayError):
    pass


class _FakeRay:
    exceptions = types.SimpleNamespace(RayError=_RayError, RuntimeEnvSetupError=_EnvError)

    def __init__(self, error: _RayError | None = None):
        self.error = error or _RayError(
            "Task failed because the node it was running on is dead or unavailable.\nmore"
        )

    def get(self, ref):
        raise self.error


def test_a_lost_training_is_reported_at_once_with_its_run(fresh_root, tiny_config):
    tracker = Tracker(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    exp = tracker.experiment_id("lost-task")
    spec = tiny_config.runs()[0]
    job = Job.new("study0", 0, spec)
    # the run the dead worker left RUNNING (its task token), and one of another task
    dead = tracker.start_run(exp, spec.name, {Tag.CLUSTER_TASK: job.train_token})
    other = tracker.start_run(exp, "other", {Tag.CLUSTER_TASK: job.ablate_token})
    ctx = types.SimpleNamespace(tracker=tracker, experiment_id=exp)
    executor = RayExecutor("127.0.0.1:1")
    executor._ray = _FakeRay()
    before = len(said())
    executor._collect(ctx, job, "training", object())
    lines = said()[before:]
    assert lines == [
        f"{spec.name}: its training task was lost (the Ray worker running it died (_RayError: "
        "Task failed because the node it was running on is dead or unavailable.)); "
        f"run {dead} closed FAILED; the rest of the study goes on (attnstudy run … --resume "
        "then redoes it)"
    ]
    assert tracker.get_run(dead).status == "FAILED"
    assert tracker.get_run(other).status == "RUNNING"  # another task's run is not touched
    assert job.failure.run_id == dead and job.train_failed


def test_an_ablation_not_run_after_its_lost_training_is_not_reported_twice(fresh_root, tiny_config):
    tracker = Tracker(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    exp = tracker.experiment_id("lost-task")
    job = Job.new("study0", 0, tiny_config.runs()[0])
    ctx = types.SimpleNamespace(tracker=tracker, experiment_id=exp)
    executor = RayExecutor("127.0.0.1:1")
    executor._ray = _FakeRay()
    before = len(said())
    executor._collect(ctx, job, "training", object())
    executor._collect(ctx, job, "ablation", object())
    lines = said()[before:]
    assert len(lines) == 1 and "no run of it was open" in lines[0], lines


def test_a_node_that_cannot_take_the_shipped_code_is_named_as_the_cause(fresh_root, tiny_config):
    """Ray's runtime-env setup failing on a node (the code the driver ships could not be
    installed there) is said as that, not as a dead worker."""
    tracker = Tracker(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    exp = tracker.experiment_id("lost-task")
    job = Job.new("study0", 0, tiny_config.runs()[0])
    ctx = types.SimpleNamespace(tracker=tracker, experiment_id=exp)
    executor = RayExecutor("127.0.0.1:1")
    executor._ray = _FakeRay(_EnvError("Failed to set up runtime environment.\ndetails"))
    before = len(said())
    executor._collect(ctx, job, "training", object())
    (line,) = said()[before:]
    assert (
        "its training task was lost (its node could not take the code the driver ships "
        "through Ray's runtime_env (_EnvError: Failed to set up runtime environment.)); no run "
        "of it was open" in line
    ), line


def test_a_retry_takes_over_the_runs_its_dead_attempt_left_running(fresh_root, tiny_config):
    """A task run again by Ray finds its dead attempt's RUNNING runs by its token: a training
    gets its model run back to continue; every other run (an ablation's) is ended KILLED so the
    ablation resumes it; another task's runs are not touched; a first attempt finds nothing."""
    from attnstudy.study.tasks import _take_over
    from attnstudy.tracking import Kind

    tracker = Tracker(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    exp = tracker.experiment_id("retry")
    spec = tiny_config.runs()[0]
    job = Job.new("study0", 0, spec)
    train_job = {"experiment_id": exp, "token": job.train_token}
    ablate_job = {"experiment_id": exp, "token": job.ablate_token}
    assert _take_over(tracker, train_job, spec, "training") is None  # a first attempt
    model = tracker.start_run(
        exp, spec.name, {Tag.CLUSTER_TASK: job.train_token, Tag.KIND: Kind.MODEL}
    )
    ablation = tracker.start_run(
        exp, f"ablations of {spec.name}", {Tag.CLUSTER_TASK: job.ablate_token, Tag.KIND: "ablation"}
    )
    before = len(said())
    assert _take_over(tracker, train_job, spec, "training") == model
    assert tracker.get_run(model).status == "RUNNING"  # reopened by the training itself
    assert tracker.get_run(ablation).status == "RUNNING"  # another task's
    assert _take_over(tracker, ablate_job, spec, "ablation") == ""
    assert tracker.get_run(ablation).status == "KILLED"
    lines = said()[before:]
    assert lines == [
        f"{spec.name}: its training task was run again after its worker died; the retry "
        f"continues run {model} from its last checkpoint",
        f"{spec.name}: its ablation task was run again after its worker died; the retry "
        f"resumes run {ablation} from its last finished batch",
    ]
