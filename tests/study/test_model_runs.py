"""Two trainings of one model key at once (NEW-10 of the 2026-12-06 review).

The model key leaves out the experiment, so two studies in different experiments that share a
model configuration took the same checkpoint lock; each got ``TrainingConflictError … already
being trained by PID …`` for the other's model and both ended FAILED. Now the second training of
one model in one experiment waits for the first (bounded, with a note naming the PID) and then
reuses its run, or trains the model itself when the first left no finished run; a wait that runs
out is one clear error line. Two experiments keep their own checkpoints, and lock, and train at
once (tests/study/test_checkpoints_per_experiment.py).

The first training runs in a thread of this process (a lock is per open file, so a thread holds
it against the main thread as another process would).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
ADDITIVE_ONLY = 'models=[{model={attention="additive",flow="bahdanau"}}]'


def _spec(experiment: str = "tiny"):
    from attnstudy.experiment import load_experiment

    cfg = load_experiment(
        TINY, ["training.epochs=1", ADDITIVE_ONLY, f'experiment.name="{experiment}"']
    )
    (spec,) = cfg.runs()
    return spec


def _lock_file(spec) -> Path:
    from attnstudy import api
    from attnstudy.runtime.paths import checkpoint_dir

    return checkpoint_dir(spec.experiment, api.model_key(spec)) / ".lock"


def _wait_until_locked(spec, thread: threading.Thread) -> None:
    """Until the thread holds the model's lock (it writes this process's PID once it has it)."""
    lock = _lock_file(spec)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and thread.is_alive():
        if lock.is_file() and lock.read_text().split()[:1] == [str(os.getpid())]:
            return
        time.sleep(0.01)
    raise AssertionError("the first training never took the lock")


class _Trainer(threading.Thread):
    """``train_spec`` in a thread, its training slowed by ``delay`` seconds (it holds the lock
    meanwhile); ``result`` or ``error`` afterwards."""

    def __init__(self, spec, delay: float):
        super().__init__(daemon=True)
        self.spec, self.delay = spec, delay
        self.result, self.error = None, None

    def run(self):
        from attnstudy import api
        from attnstudy.tracking import Tracker

        try:
            tracker = Tracker()
            exp_id = tracker.experiment_id(self.spec.experiment)
            self.result = api.train_spec(self.spec, tracker, experiment_id=exp_id, progress=False)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            self.error = err


@pytest.fixture
def slow_training_in_threads(monkeypatch):
    """Training in a non-main thread first sleeps, so the main thread meets it holding the lock."""
    from attnstudy.study import model_runs

    train = model_runs.train

    def slowed(*a, **k):
        if threading.current_thread() is not threading.main_thread():
            time.sleep(getattr(threading.current_thread(), "delay", 0.0))
        return train(*a, **k)

    monkeypatch.setattr(model_runs, "train", slowed)


def _train_here(spec):
    from attnstudy import api
    from attnstudy.tracking import Tracker

    tracker = Tracker()
    return api.train_spec(
        spec, tracker, experiment_id=tracker.experiment_id(spec.experiment), progress=False
    )


def _store() -> None:
    """Create the store (before a checkpoint folder exists, as a first training would)."""
    from attnstudy.tracking import Tracker

    Tracker()


def _notes(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "attnstudy"]


def test_a_second_training_of_one_model_waits_and_reuses_its_run(
    fresh_root, slow_training_in_threads, caplog
):
    caplog.set_level(logging.WARNING, logger="attnstudy")
    spec = _spec()
    first = _Trainer(spec, delay=1.5)
    first.start()
    _wait_until_locked(spec, first)
    second = _train_here(spec)
    first.join(60)
    assert first.error is None, first.error
    assert second.reused and second.run_id == first.result.run_id
    assert any(f"waiting for PID {os.getpid()}" in n for n in _notes(caplog)), _notes(caplog)


def test_two_experiments_sharing_a_model_both_succeed(fresh_root, slow_training_in_threads, caplog):
    """The review's case: another experiment's run is not reused (reuse stays within one
    experiment), and each experiment keeps its own checkpoints (and lock), so the second trains
    its own at once, without waiting for the first."""
    caplog.set_level(logging.WARNING, logger="attnstudy")
    alpha, beta = _spec("alpha"), _spec("beta")
    first = _Trainer(alpha, delay=1.5)
    first.start()
    _wait_until_locked(alpha, first)
    second = _train_here(beta)
    first.join(60)
    assert first.error is None, first.error
    assert not second.reused and second.run_id != first.result.run_id
    from attnstudy.tracking import Tracker

    tracker = Tracker(create=False)
    runs = {r: tracker.get_run(r) for r in (first.result.run_id, second.run_id)}
    assert {r.status for r in runs.values()} == {"FINISHED"}
    assert runs[second.run_id].experiment_id == tracker.experiment_id("beta", create=False)
    assert _lock_file(alpha).parent != _lock_file(beta).parent
    notes = _notes(caplog)
    assert not any("waiting for PID" in n for n in notes), notes


def test_when_the_holder_leaves_no_finished_run_the_second_trains(fresh_root, caplog):
    """The first training fails or dies (here: it holds the lock and lets go without a run)."""
    from attnstudy.models.training import checkpoint_lock

    caplog.set_level(logging.WARNING, logger="attnstudy")
    spec = _spec()
    _store()
    held, release = threading.Event(), threading.Event()

    def hold():
        with checkpoint_lock(_lock_file(spec).parent):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30)
    threading.Timer(1.0, release.set).start()
    t0 = time.monotonic()
    model = _train_here(spec)
    assert time.monotonic() - t0 >= 0.9  # it waited
    assert not model.reused
    from attnstudy.tracking import Tracker

    assert Tracker(create=False).get_run(model.run_id).status == "FINISHED"
    assert any("waiting for PID" in n for n in _notes(caplog))


@pytest.fixture
def held_lock(fresh_root):
    """The tiny model's lock held by a thread of this process until the test ends."""
    from attnstudy.models.training import checkpoint_lock

    spec = _spec()
    _store()
    held, release = threading.Event(), threading.Event()

    def hold():
        with checkpoint_lock(_lock_file(spec).parent):
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(30)
    yield spec
    release.set()
    t.join(30)


def test_the_wait_is_bounded_with_one_clear_error(fresh_root, held_lock, monkeypatch):
    from attnstudy.models.training import TrainingConflictError

    monkeypatch.setenv("ATTNSTUDY_TRAINING_WAIT", "0.5")
    t0 = time.monotonic()
    with pytest.raises(TrainingConflictError) as err:
        _train_here(held_lock)
    assert 0.4 <= time.monotonic() - t0 < 10
    text = str(err.value)
    assert "\n" not in text
    assert f"PID {os.getpid()}" in text and "0.5 s" in text and "ATTNSTUDY_TRAINING_WAIT" in text


def test_the_cli_says_the_wait_ran_out_in_one_line(fresh_root, held_lock, monkeypatch, capsys):
    from attnstudy.cli import main as cli

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    hook = sys.unraisablehook
    logger = logging.getLogger("attnstudy")
    handlers, propagate = list(logger.handlers), logger.propagate
    monkeypatch.setenv("ATTNSTUDY_TRAINING_WAIT", "0.5")
    try:
        code = cli.main(
            ["train", str(TINY), "--set", "training.epochs=1", "--set", ADDITIVE_ONLY, "--quiet"]
        )
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
        sys.unraisablehook = hook
        logger.handlers[:], logger.propagate = handlers, propagate
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("attnstudy: error: ")]
    assert code == 1 and len(errors) == 1, err
    assert "Traceback" not in err
    assert f"still being trained by PID {os.getpid()}" in errors[0]


def test_a_malformed_wait_setting_is_refused(monkeypatch):
    from attnstudy.config import ConfigError
    from attnstudy.models.training import training_wait

    monkeypatch.setenv("ATTNSTUDY_TRAINING_WAIT", "soon")
    with pytest.raises(ConfigError, match="ATTNSTUDY_TRAINING_WAIT"):
        training_wait()
    monkeypatch.setenv("ATTNSTUDY_TRAINING_WAIT", "0")
    assert training_wait() == 0.0
    monkeypatch.delenv("ATTNSTUDY_TRAINING_WAIT")
    assert training_wait() > 0


@pytest.mark.slow
def test_two_studies_in_two_experiments_at_once(tmp_path):
    """The review's reproduction: ``run`` of tiny and of tiny2 at once; both ended FAILED."""
    root = tmp_path / "root"
    (root / "mlruns").mkdir(parents=True)
    env = dict(os.environ, ATTNSTUDY_ROOT=str(root), ATTNSTUDY_THREADS="1")
    for k in ("MLFLOW_TRACKING_URI", "ATTNSTUDY_DEBUG", "ATTNSTUDY_TRAINING_WAIT"):
        env.pop(k, None)
    cmd = [sys.executable, "-m", "attnstudy.cli", "run", str(TINY), "--quiet", "--no-report"]
    # the conflict is the trainings' (the shared model key's checkpoint lock): the whole `run`
    # (train, ablate, study), of one ablation instead of the battery (its CPU seconds, twice)
    cmd += ["--set", 'ablation.ablations=["uniform"]']
    a = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.5)
    b = subprocess.run(
        [*cmd, "--set", 'experiment.name="tiny2"'], cwd=root, env=env, capture_output=True
    )
    a_out, a_err = a.communicate(timeout=600)
    assert a.returncode == 0, a_err.decode()[-2000:]
    assert b.returncode == 0, b.stderr.decode()[-2000:]
