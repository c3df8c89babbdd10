"""The Ray executor and the team server without a cluster: what is refused before anything runs,
how a dead worker's runs are closed, and that the default install needs neither Ray nor psycopg
(the real cluster is tests/distributed/test_cluster.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from prerequisites import require

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"


def _cli(root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    import os

    e = dict(os.environ, ATTNSTUDY_ROOT=str(root)) | env
    e.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", *args],
        cwd=root,
        env=e,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_ray_without_a_tracking_server_is_refused_in_one_line(tmp_path):
    (tmp_path / "mlruns").mkdir()
    res = _cli(tmp_path, "run", str(TINY), "--executor", "ray")
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(err) == 1, res.stderr
    assert err[0].startswith("attnstudy: error: --executor ray needs an http(s):// tracking server")
    assert "sqlite:///" in err[0] and "attnstudy server --backend-store-uri" in err[0]
    assert not (tmp_path / "mlruns" / "mlflow.db").exists()
    res = _cli(tmp_path, "run", str(TINY), "--ray-address", "127.0.0.1:1")
    assert res.returncode == 2
    assert res.stderr.strip() == "attnstudy: error: --ray-address is for --executor ray"
    res = _cli(
        tmp_path,
        "run",
        str(TINY),
        "--executor",
        "ray",
        "--tracking-uri",
        "http://127.0.0.1:1",
        "--ray-address",
        "head.example",
    )
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        "attnstudy: error: --ray-address 'head.example': give HOST:PORT of the Ray head"
    )


@pytest.mark.parametrize(
    "args,expect",
    [
        ([], "give the database: --backend-store-uri postgresql+psycopg://"),
        (["--backend-store-uri", "file:/srv/mlruns"], "is not a database URI a team server can"),
        (["--backend-store-uri", "postgresql+psycopg2://u@h/db"], "use postgresql+psycopg://"),
        (["--backend-store-uri", "sqlite:///x.db", "--host", " "], "--host is empty"),
        (["--backend-store-uri", "sqlite:///x.db", "--port", "0"], "--port must be between"),
    ],
)
def test_server_arguments_are_checked_before_anything_starts(tmp_path, args, expect):
    res = _cli(tmp_path, "server", "--artifacts", str(tmp_path / "a"), *args)
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(err) == 1 and expect in err[0], res.stderr
    assert not (tmp_path / "a").exists()


def test_a_database_password_is_never_printed():
    from attnstudy.serving.server import mask

    assert mask("postgresql+psycopg://ann:s3cr3t@db:5432/mlflow") == (
        "postgresql+psycopg://ann:***@db:5432/mlflow"
    )
    assert mask("postgresql+psycopg://ann@db/mlflow") == "postgresql+psycopg://ann@db/mlflow"


def test_the_default_install_needs_neither_ray_nor_a_database_driver():
    """The CLI, the executor's and the server's modules import without Ray, psycopg, torch or
    mlflow (Ray is imported inside functions of attnstudy.executors.distributed only)."""
    code = (
        "import sys, attnstudy.cli.main, attnstudy.executors.distributed, attnstudy.serving.server\n"
        "print(sorted(m for m in ('ray', 'psycopg', 'torch', 'mlflow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_artifacts_must_live_behind_the_server():
    from attnstudy.config import ConfigError
    from attnstudy.executors.distributed import check_artifact_location

    check_artifact_location("mlflow-artifacts:/3", "tiny", "http://h:5000")  # proxied: fine
    with pytest.raises(ConfigError, match=r"keeps its artifacts at /srv/art/3, a path workers"):
        check_artifact_location("/srv/art/3", "tiny", "http://h:5000")
    with pytest.raises(ConfigError, match="file:///srv"):
        check_artifact_location("file:///srv/art/3", "tiny", "http://h:5000")


def test_runs_a_dead_worker_left_running_are_failed_with_the_reason(store_root):
    """Only the RUNNING runs of that task: a finished run of the task and another task's runs keep
    their status."""
    from attnstudy.tracking import Tag, Tracker, store

    mine = Tracker(run_tags={Tag.CLUSTER_TASK: "study/0/train/abc"})
    other = Tracker(run_tags={Tag.CLUSTER_TASK: "study/1/train/def"})
    exp = mine.experiment_id("dead-worker")
    left = mine.start_run(exp, "copy/additive-bahdanau/seed1", {Tag.KIND: "model"})
    done = mine.start_run(exp, "copy/none-bahdanau/seed1", {Tag.KIND: "model"})
    mine.end_run(done)
    alive = other.start_run(exp, "copy/none-bahdanau/seed2", {Tag.KIND: "model"})
    reason = "the Ray worker running it died (WorkerCrashedError: …)"
    assert store.fail_task_runs(mine, exp, "study/0/train/abc", reason) == [left]
    runs = {r.run_id: r for r in mine.search_runs([exp])}
    assert runs[left].status == "FAILED" and runs[left].tags[Tag.ERROR_CLASS] == "WorkerDied"
    assert runs[left].tags[Tag.NOTE] == f"Failed: {reason}"
    assert runs[done].status == "FINISHED" and runs[alive].status == "RUNNING"
    assert runs[left].tags[Tag.CLUSTER_TASK] == "study/0/train/abc"
    other.end_run(alive)


def test_ablation_settings_cross_to_a_worker_unchanged(tiny_config):
    """A task gets the ablation config as JSON: its per-ablation tables survive the trip (a pickled
    Params instance would belong to another class on the worker and fall back to defaults)."""
    from attnstudy.analysis.catalogue import AblationConfig

    sent = tiny_config.ablation.model_dump(mode="json")
    got = AblationConfig.model_validate(sent)
    assert got.resolved() == tiny_config.ablation.resolved()
    assert got.params_for("adversarial").steps == 20 and got.params_for("permutation").n == 10


def test_no_ray_head_at_the_address_fails_fast_in_one_line():
    require(importlib.util.find_spec("ray") is not None, "the [distributed] extra (ray)")
    import time

    from attnstudy.executors.distributed import ClusterNotFoundError, RayExecutor, free_port

    t0 = time.monotonic()
    # a ClusterNotFoundError: the CLI exits 2 (what the user named is not there)
    with pytest.raises(
        ClusterNotFoundError, match=r"^no Ray head answers at 127\.0\.0\.1:\d+; start one"
    ):
        RayExecutor(f"127.0.0.1:{free_port()}")._connect()
    assert time.monotonic() - t0 < 30  # ray.init alone would wait minutes


_IMPORT_ORDER = """
import os, sys
os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
if sys.argv[1] == "ray-first":
    import ray  # a notebook's own import, before attnstudy could set Ray up
from attnstudy.executors.distributed import ClusterError, _ray
try:
    _ray(loopback=True)
except ClusterError as err:
    print("refused:", err)
from ray._private import ray_constants, services
print(ray_constants.ENABLE_RAY_CLUSTER, services.resolve_ip_for_localhost("127.0.0.1"))
"""


@pytest.mark.parametrize("order", ["attnstudy-first", "ray-first"])
def test_a_loopback_head_is_looked_for_on_loopback_whatever_the_import_order(order):
    """Regression: Ray reads RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER once, at import; the private head's
    driver imported Ray before setting it, so on a machine with an outside address it resolved
    127.0.0.1 to that address and waited there for ever (the head listens on loopback only).
    Now the variable is set before the import; a process that imported Ray first is refused in
    one line instead."""
    require(importlib.util.find_spec("ray") is not None, "the [distributed] extra (ray)")
    res = subprocess.run(
        [sys.executable, "-c", _IMPORT_ORDER, order], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.strip().splitlines()
    if order == "attnstudy-first":
        assert lines == ["False 127.0.0.1"]
    else:
        assert lines[0].startswith("refused: Ray was set up for a cluster")
        assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before importing ray" in lines[0]


def test_a_task_no_node_can_run_is_refused_instead_of_waiting_for_ever(tiny_config):
    from attnstudy.config import ConfigError
    from attnstudy.executors.distributed import check_placeable, task_requests
    from attnstudy.experiment import parse_experiment

    raw = {"training": {"threads": 2}, "models": [{"model": {"attention": "additive"}}]}
    raw["models"].append({"model": {"attention": "none"}, "training": {"device": "cuda"}})
    req = task_requests(parse_experiment(raw))
    assert req["train copy/additive-bahdanau/seed1"] == (2.0, 0.0)
    assert req["train copy/none-bahdanau/seed1"] == (2.0, 1.0)
    assert req["ablate copy/none-bahdanau/seed1"] == (2.0, 0.0)  # ablation.device stays auto
    check_placeable(req, [{"CPU": 2.0}, {"CPU": 4.0, "GPU": 1.0}])  # every task has a node
    with pytest.raises(
        ConfigError,
        match=r"^no node of the Ray cluster can run 'train copy/none-bahdanau/seed1': it asks "
        r"2 CPU\(s\) .* and 1 GPU\(s\) .*, the nodes have 8 CPU/0 GPU, 1 CPU/1 GPU;",
    ):
        check_placeable(req, [{"CPU": 8.0}, {"CPU": 1.0, "GPU": 1.0}])
    with pytest.raises(ConfigError, match="asks 2 CPU"):
        check_placeable(req, [{"CPU": 1.0, "GPU": 1.0}])


def test_the_driver_settles_best_on_the_best_version_after_racing_workers(tmp_path, tiny_config):
    """Two seeds registered at once: the worker that saw only its own version wrote ``best``
    last, onto the worse seed; the driver sets it again from every version."""
    from types import SimpleNamespace

    from attnstudy import api
    from attnstudy.study.tasks import Job, settle_best_aliases
    from attnstudy.tracking import Tracker

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")  # its own store: no earlier versions
    spec = tiny_config.runs()[0]
    name = api.registered_name(spec)
    exp = tracker.experiment_id("best-race")
    tracker.client.create_registered_model(name)
    for seed, per in ((1, 0.30), (2, 0.10)):  # seed 2 is better on dev
        run = tracker.start_run(exp, f"seed{seed}")
        tracker.log_metrics(run, {"best_dev/per": per, "best_dev/exact_match": 1 - per})
        tracker.end_run(run)
        tracker.client.create_model_version(name, source="file:///nowhere", run_id=run)
    tracker.set_alias(name, "best", "1")  # the racing worker's stale choice
    jobs = [
        Job(0, spec, "t0", model=SimpleNamespace(reused=False)),
        Job(1, spec, "t1", model=SimpleNamespace(reused=False)),
    ]
    settle_best_aliases(SimpleNamespace(tracker=tracker), jobs)
    assert str(tracker.client.get_model_version_by_alias(name, "best").version) == "2"


_HEAD_THEN_WAIT = """
import json, sys, time
from attnstudy.executors.distributed import LocalRayHead
head = LocalRayHead(num_cpus=1)
head.start()
print(json.dumps({"head": head.proc.pid, "pids": sorted(head.pids())}), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_private_head_does_not_outlive_its_driver_killed_with_sigkill():
    """Regression: a driver killed with SIGKILL (no cleanup runs) left its private Ray head — GCS,
    raylet, agents, 0.3 GiB and a dozen ports — running until someone found it. Its guardian now
    stops the head's whole session once the driver is gone."""
    require(importlib.util.find_spec("ray") is not None, "the [distributed] extra (ray)")
    import json
    import signal
    import time

    from attnstudy.serving.ui_guard import session_members

    driver = subprocess.Popen(
        [sys.executable, "-c", _HEAD_THEN_WAIT], stdout=subprocess.PIPE, text=True
    )
    try:
        started = json.loads(driver.stdout.readline())
        pids, sid = set(started["pids"]), started["head"]  # `ray start` leads the head's session
        assert len(pids) >= 3, pids  # ray start, the GCS, the raylet (and agents)
        assert session_members(sid) >= pids
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
    deadline = time.monotonic() + 30
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not session_members(sid), f"the head outlived its driver: {session_members(sid)}"


def test_a_ray_ablation_task_uses_the_experiments_verdict_thresholds(monkeypatch):
    """Ray studies tagged their ablation runs' verdicts with the default thresholds, the local
    executor with the experiment's [report.verdict]."""
    import contextlib
    import types

    from attnstudy.executors import distributed
    from attnstudy.study import ablation_runs, model_runs
    from attnstudy.study import tasks as study_tasks
    from attnstudy.verdict.findings import VerdictThresholds

    seen = {}

    @contextlib.contextmanager
    def worker(job, placement):  # the task's progress line names the spec's model
        assert placement is distributed.placed_here  # a Ray task's devices: its placement
        yield types.SimpleNamespace(name="copy additive-bahdanau"), "tracker"

    def ablate_run(model_run_id, loaded, cfg, tracker, **kw):
        seen.update(kw)
        return "ablation-run", None

    monkeypatch.setattr(study_tasks, "_worker", worker)
    monkeypatch.setattr(study_tasks, "_take_over", lambda *a: None)  # a first attempt
    monkeypatch.setattr(model_runs, "load_model", lambda uri, tracker: ("m", "loaded"))
    monkeypatch.setattr(ablation_runs, "ablate_run", ablate_run)
    from dataclasses import asdict

    from attnstudy.runtime.code_version import this_code

    job = {
        "code": asdict(this_code()),
        "ablation": {"ablations": ["uniform"]},
        "verdict": {"used_flip": 0.3},
        "done": {},
        "study_id": "s",
    }
    out = distributed.ablate_task({"ok": True, "run_id": "m"}, job)
    assert out == {"ok": True, "run_id": "ablation-run"}
    assert seen["thresholds"] == VerdictThresholds(used_flip=0.3)
