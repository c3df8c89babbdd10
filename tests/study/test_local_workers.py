"""The local executor with several worker processes (attnstudy.executors.local_workers): the same
store as
the one-process study, and the number of workers it picks."""

from __future__ import annotations

import contextlib
import io
import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import torch
from figures import figures_undrawn

ROOT = Path(__file__).parents[2]
# wall-clock and CPU times, and the progress metric logged by the clock: the only values that
# may differ
TIMES = ("seconds", "per_second", "progress/")
RUN_IDS = ("run_id", "run id")


def _tiny(workers: int | None, seeds=(1, 2), scores: tuple[str, ...] = ()):
    from attnstudy.experiment import parse_experiment

    text = (ROOT / "experiments" / "tiny.toml").read_text(encoding="utf-8")
    if scores:  # registered step scores of the permutation ablation
        text = text.replace(
            "[ablation.permutation]\n",
            f"[ablation.permutation]\nscores = {list(scores)!r}\n".replace("'", '"'),
        )
    cfg = parse_experiment(tomllib.loads(text))
    meta = cfg.experiment.model_copy(update={"workers": workers, "seeds": list(seeds)})
    return cfg.model_copy(update={"experiment": meta})


def _stored(root: Path) -> dict[str, dict]:
    """Every run of the store under ``root`` by its name: its metric histories (times left
    out), params, and every table (Parquet), JSON, text and weights file it stored (run-id
    columns left out)."""
    from attnstudy.tracking import Tracker

    tracker = Tracker(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}", create=False)
    exp_id = tracker.experiment_id("tiny")
    out: dict[str, dict] = {}
    for run in tracker.search_runs([exp_id], "", max_results=1000):
        full = tracker.client.get_run(run.run_id)
        metrics = {
            k: [(m.step, m.value) for m in tracker.client.get_metric_history(run.run_id, k)]
            for k in full.data.metrics
            if not any(t in k for t in TIMES)
        }
        files: dict[str, object] = {}
        base = Path(full.info.artifact_uri.removeprefix("file://"))
        for path in sorted(base.rglob("*")) if base.is_dir() else []:
            rel = str(path.relative_to(base))
            if path.suffix == ".parquet":
                table = pd.read_parquet(path)
                drop = [c for c in table.columns if any(t in str(c) for t in TIMES + RUN_IDS)]
                files[rel] = table.drop(columns=drop)
            elif path.suffix == ".pt":
                files[rel] = torch.load(path, map_location="cpu", weights_only=True)
            elif path.suffix in (".json", ".pharaoh", ".ids", ".src-tgt"):
                files[rel] = path.read_text(encoding="utf-8")
        out[full.info.run_name] = {"metrics": metrics, "params": full.data.params, "files": files}
    return out


def _assert_same(a: object, b: object, where: str) -> None:
    if isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True, obj=where)
    elif isinstance(a, dict) and a and all(isinstance(v, torch.Tensor) for v in a.values()):
        assert a.keys() == b.keys(), where
        for k in a:
            assert torch.equal(a[k], b[k]), f"{where}: {k}"
    else:
        assert a == b, where


@pytest.mark.slow
def test_two_workers_store_the_same_tables_and_metrics_as_one(tmp_path, monkeypatch, capsys):
    """The tiny experiment with two seeds (4 models, their ablations, the seed variance) run with
    one worker (in the test process) and with two worker processes, into two stores: every
    metric (every step), param, table, JSON and weights file is the same, bit for bit, apart
    from times and run ids. The workers' start and progress lines reach the driver's stderr."""
    from attnstudy.analysis import step_scores

    from attnstudy import api

    # a step score registered as in a notebook: its function's module is an interactive
    # __main__, which a spawned worker cannot import (it reaches the workers by value)
    notebook = {"__name__": "__main__"}
    exec(NOTEBOOK_SCORE, notebook)
    step_scores.register_step_score("notebook_gap", notebook["notebook_gap"])
    stores = {}
    try:
        for workers in (1, 2):
            root = tmp_path / f"workers{workers}"
            (root / "mlruns").mkdir(parents=True)
            monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
            # figures saved undrawn in this process (PNG files are not compared)
            with figures_undrawn() if workers == 1 else contextlib.nullcontext():
                cfg = _tiny(workers, scores=("notebook_gap",))
                result = api.run(cfg, progress=True, report=False)
            assert not result.failures and len(result.ablations) == 4, result.failures
            stores[workers] = _stored(root)
            err = capsys.readouterr().err
            assert "\r" not in err
            for k, spec in enumerate(cfg.runs(), 1):
                for task in ("train", "ablate"):
                    assert f"{task} {spec.name} (model {k} of 4): started" in err, err
                epoch = f"train {spec.name} epoch 1 (model {k} of 4): "
                assert any(line.startswith(epoch) for line in err.splitlines()), err
    finally:
        step_scores.unregister_step_score("notebook_gap")
    one, two = stores[1], stores[2]
    assert sorted(one) == sorted(two) and len(one) == 9  # 4 models, 4 ablations, the study
    for name in one:
        assert one[name]["metrics"] == two[name]["metrics"], name
        assert one[name]["params"] == two[name]["params"], name
        assert one[name]["files"].keys() == two[name]["files"].keys(), name
        for rel, value in one[name]["files"].items():
            other = two[name]["files"][rel]
            if rel == "experiment.json":  # the study's config: its experiment.workers differ
                value, other = json.loads(value), json.loads(other)
                assert (value["experiment"].pop("workers"), other["experiment"].pop("workers")) == (
                    1,
                    2,
                )
            _assert_same(value, other, f"{name} {rel}")
    n_tables = sum(
        isinstance(v, pd.DataFrame) for run in one.values() for v in run["files"].values()
    )
    assert n_tables >= 12  # predictions, steps, examples of every model (and the seed variance)
    gaps = [  # the user's score computed in the worker processes too (compared above)
        v["permutation_median_notebook_gap"]
        for run in two.values()
        for v in run["files"].values()
        if isinstance(v, pd.DataFrame) and "permutation_median_notebook_gap" in v
    ]
    assert gaps and all(g.notna().any() and (g.dropna() >= 0).all() for g in gaps)


NOTEBOOK_SCORE = """
def notebook_gap(probs, reference, target):
    \"\"\"The largest probability change over the vocabulary.\"\"\"
    return (probs - reference).abs().amax(-1)
"""


def test_workers_default_to_the_cores_capped_by_the_models(monkeypatch):
    """``experiment.workers`` wins, then ``$ATTNSTUDY_WORKERS``, then the cores divided by the
    threads per model; always capped by the models and at least 1."""
    from attnstudy.config import ConfigError
    from attnstudy.executors import local_workers as lw

    monkeypatch.setattr(lw, "available_cores", lambda: 16)
    monkeypatch.delenv(lw.WORKERS_VAR, raising=False)
    assert lw.local_workers(_tiny(None)) == 4  # 2 variants × 2 seeds
    assert lw.local_workers(_tiny(None, seeds=(1,))) == 2
    assert lw.local_workers(_tiny(3)) == 3
    assert lw.local_executor(_tiny(1)) is None  # one worker: the one-process study
    monkeypatch.setattr(lw, "available_cores", lambda: 3)
    assert lw.local_workers(_tiny(None)) == 3
    monkeypatch.setenv(lw.WORKERS_VAR, "1")
    assert lw.local_workers(_tiny(None)) == 1
    assert lw.local_workers(_tiny(2)) == 2  # the config over the environment
    monkeypatch.setenv(lw.WORKERS_VAR, "two")
    with pytest.raises(ConfigError, match="ATTNSTUDY_WORKERS='two' is not a count"):
        lw.local_workers(_tiny(None))


def test_a_dead_worker_fails_its_model_and_ends_its_runs_failed(fresh_root):
    """A worker process that dies (killed, out of memory) breaks the pool: its task's future
    raises BrokenProcessPool. The model fails with that reason, and the run the task left
    RUNNING (found by the task's token) ends FAILED with it; another task's run is left alone."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool
    from types import SimpleNamespace

    from attnstudy.executors.local_workers import LocalPoolExecutor
    from attnstudy.study.tasks import Job
    from attnstudy.tracking import Tag, Tracker

    tracker = Tracker()
    exp_id = tracker.experiment_id("tiny")
    spec = _tiny(2).runs()[0]
    job = Job(0, spec, "study/0/train/aaaa", ablate_token="study/0/ablate/aaaa")
    left = Tracker(run_tags={Tag.CLUSTER_TASK: job.train_token}).start_run(exp_id, spec.name)
    other = Tracker(run_tags={Tag.CLUSTER_TASK: "study/1/train/bbbb"}).start_run(exp_id, "other")
    fut: Future = Future()
    fut.set_exception(BrokenProcessPool("A process in the process pool was terminated abruptly"))
    ctx = SimpleNamespace(tracker=tracker, experiment_id=exp_id)
    out = LocalPoolExecutor(2)._collect(ctx, job, "training", fut)
    assert out == {"ok": False} and job.model is None
    assert (job.failure.name, job.failure.phase, job.failure.run_id) == (
        spec.name,
        "training",
        left,
    )
    assert job.failure.error.startswith("a worker process of the study died (A process in the")
    run = tracker.get_run(left)
    assert (run.status, run.tags[Tag.ERROR_CLASS]) == ("FAILED", "WorkerDied")
    assert tracker.get_run(other).status == "RUNNING"


def test_a_worker_refuses_sources_changed_since_the_study_started():
    """A worker started after the package's sources were edited would train other code than the
    study records: its task is refused in one line, before any run starts."""
    from dataclasses import asdict

    from attnstudy.executors.local_workers import _run_task
    from attnstudy.runtime.code_version import this_code

    driver = asdict(this_code()) | {"digest": "0" * 64}
    out = _run_task("training", {"code": driver, "spec": "{}"})
    assert out["ok"] is False and out["failed_run_id"] is None
    assert out["error"].startswith(
        "the attnstudy sources changed after the study started (code 000000000000"
    )
    assert "run the study again (--resume) once the edits are done" in out["error"]


@pytest.mark.slow
def test_sigterm_stops_the_workers_and_ends_their_runs_killed(fresh_root):
    """SIGTERM (as Ctrl-C) to ``attnstudy run`` with two workers while they train: exit 1 with
    the one interrupted line and no traceback, no run left RUNNING, the study and the trainings
    that were running KILLED (``--resume`` continues them), and no training started after the
    signal."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from attnstudy.tracking import Tracker

    env = dict(os.environ, ATTNSTUDY_ROOT=str(fresh_root))
    env.pop("ATTNSTUDY_WORKERS", None)
    cmd = [sys.executable, "-c", "from attnstudy.cli.main import entry; entry()", "run"]
    cmd += [str(ROOT / "experiments" / "tiny.toml"), "--quiet", "--no-report"]
    cmd += ["--set", "experiment.workers=2", "--set", "experiment.seeds=[1,2]"]
    cmd += ["--set", "training.epochs=500", "--set", "training.patience=500"]
    proc = subprocess.Popen(
        cmd, cwd=fresh_root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    checkpoints = fresh_root / "mlruns" / "checkpoints"
    deadline = time.monotonic() + 1800  # a guard against a hang, not a timing
    while len(list(checkpoints.glob("*/*/last.pt"))) < 2:  # both workers are training
        if proc.poll() is not None:
            pytest.fail(f"the study ended before two trainings ran: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()  # its workers leave with it (the pool's pipe closes)
            pytest.fail("no two trainings within 30 minutes")
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("attnstudy: error: interrupted; ")
    tracker = Tracker(create=False)
    runs = tracker.search_runs([tracker.experiment_id("tiny")], "", max_results=100)
    status = {r.tags["mlflow.runName"]: r.status for r in runs}
    assert "RUNNING" not in status.values(), status
    assert status["tiny/study"] == "KILLED"
    # the study and the two trainings that were running, KILLED; nothing started after the signal
    # (the pool had handed a third training to a worker, which started it after the interrupt and
    # ran it until the driver's 20 s stop wait ran out)
    assert sorted(status.values()) == ["KILLED"] * 3, status


def test_a_worker_does_not_repeat_the_notices_its_driver_gave():
    """Each worker loads the study's data again: a notice the driver already printed (the
    Greek–English task's counts were printed three times by a two-worker study) is not repeated,
    a new one is given."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from attnstudy.executors.local_workers import _init_worker
    from attnstudy.runtime import notices

    with ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_init_worker,
        initargs=(None, ("task 't': 5 verses dropped",)),
    ) as pool:
        pool.submit(notices.notice, "task 't': 5 verses dropped").result(timeout=120)
        pool.submit(notices.notice, "a worker's own note").result(timeout=120)
        assert pool.submit(notices.said).result(timeout=120) == ["a worker's own note"]


def test_a_workers_progress_lines_reach_the_drivers_stderr_whole():
    """A worker's start and progress lines reach the driver, which writes them to its stderr
    above its bar, each line whole (a worker wrote none: a study with workers showed a line only
    when a task ended, nothing for 15 minutes)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from attnstudy.executors import local_workers as lw
    from attnstudy.runtime import progress

    spawn = multiprocessing.get_context("spawn")
    inbox, lines = spawn.Pipe(duplex=False)
    out = io.StringIO()  # the driver's stderr, not a terminal
    bar = progress.Progress(2, "local tasks", unit="task", stream=out, heartbeat=False)
    relay = lw._relay(inbox, bar)
    long = "x" * 5000  # longer than one atomic pipe write: cut, never split
    with ProcessPoolExecutor(
        max_workers=1, mp_context=spawn, initializer=lw._init_worker, initargs=(None, (), lines)
    ) as pool:
        pool.submit(progress.started, "train copy/additive-bahdanau/seed1").result(timeout=120)
        pool.submit(progress.started, long).result(timeout=120)
    lines.send_bytes(lw._END)
    relay.join(timeout=10)
    assert not relay.is_alive()
    got = out.getvalue().splitlines()
    assert got[0] == "train copy/additive-bahdanau/seed1: started"
    assert got[1] == long[: lw.LINE_BYTES] and len(got) == 2


def test_notices_are_recorded_in_order_and_skipped_only_when_said_elsewhere(caplog, monkeypatch):
    from attnstudy.runtime import notices

    monkeypatch.setattr(notices, "_said", [])
    monkeypatch.setattr(notices, "_said_elsewhere", frozenset({"old"}))
    with caplog.at_level("WARNING", logger="attnstudy"):
        for line in ("old", "new", "new\nline"):
            notices.notice(line)
    assert notices.said() == ["new", "new line"]
    assert [r.getMessage() for r in caplog.records if r.name == "attnstudy"] == ["new", "new line"]


def test_a_score_that_cannot_travel_is_refused_only_for_worker_processes():
    """A user score whose function cannot be pickled (a closure over a lock) is refused before a
    study with worker processes trains, with the advice to run with one worker — and a
    one-process study, which needs no pickling, takes it."""
    import threading

    from attnstudy.analysis import step_scores

    from attnstudy.config import ConfigError
    from attnstudy.study.driver import _check_step_scores

    lock = threading.Lock()

    def locked_gap(probs, reference, target):
        with lock:
            return (probs - reference).abs().amax(-1)

    step_scores.register_step_score("locked_gap", locked_gap)
    try:
        ablation = _tiny(2, scores=("locked_gap",)).ablation
        _check_step_scores(ablation, in_workers=False)
        with pytest.raises(ConfigError, match=r"\(locked_gap\) cannot be sent to worker processes"):
            _check_step_scores(ablation, in_workers=True)
        with pytest.raises(ConfigError, match="run with experiment.workers = 1"):
            _check_step_scores(ablation, in_workers=True)
    finally:
        step_scores.unregister_step_score("locked_gap")


def test_workers_report_their_pids_and_the_driver_finds_them_alive():
    """The driver interrupts its workers by the PIDs they report when they start (it read the
    pool's private ``_processes`` before): every started worker is found, alive, and a worker
    that has exited is not."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    from attnstudy.executors import local_workers as lw

    spawn = multiprocessing.get_context("spawn")
    workers = lw._Workers(spawn)
    with ProcessPoolExecutor(
        max_workers=2,
        mp_context=spawn,
        initializer=lw._init_worker,
        initargs=(None, (), None, workers.sender),
    ) as pool:
        pids = {pool.submit(os.getpid).result(timeout=120) for _ in range(4)}
        found = {p.pid for p in workers.alive()}
        assert pids <= found and len(found) <= 2
        assert all(p.is_alive() for p in workers.alive())
    assert workers.alive() == []  # shut down: none is a running child any more
    workers.close()
