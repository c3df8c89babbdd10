"""CPU and memory of every training and ablation run as ``system/*`` metrics
(attnstudy.tracking.system_metrics): a long run's resource figures were only known from a
``ps`` sampled by hand. Off in the rest of the suite (tests/conftest.py); on here."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
MACHINE = ("cpu_utilization_percentage", "system_memory_usage_megabytes")
PROCESS = (
    "process_cpu_utilization_percentage",
    "process_memory_rss_megabytes",
    "process_memory_peak_megabytes",
)


@pytest.fixture
def sampling_on(monkeypatch):
    monkeypatch.setenv("ATTNSTUDY_SYSTEM_METRICS", "1")
    monkeypatch.setenv("ATTNSTUDY_SYSTEM_METRICS_SECONDS", "0.2")


def test_a_busy_block_logs_its_cpu_and_memory_while_the_run_runs(store_root, sampling_on):
    """The thread samples every interval while the run is RUNNING, and once more at the end:
    steps 0, 1, …; a block that keeps a core busy shows its process's CPU."""
    from attnstudy.tracking import Tracker

    tracker = Tracker()
    run_id = tracker.start_run(tracker.experiment_id("sys"), "busy")
    with tracker.active(run_id), tracker.system_metrics(run_id):
        end = time.process_time() + 0.7  # 0.7 s of CPU, whatever the machine's load
        while time.process_time() < end:
            pass
    run = tracker.get_run(run_id)
    for name in MACHINE + PROCESS:
        assert f"system/{name}" in run.metrics, sorted(run.metrics)
    cpu = tracker.metric_history(run_id, "system/process_cpu_utilization_percentage")
    assert len(cpu) >= 2 and [s for s, _ in cpu] == list(range(len(cpu)))
    # one busy core is 100 %; a loaded machine gives the process less (50 % at load 12 on 2 cores)
    assert all(v >= 0 for _, v in cpu) and max(v for _, v in cpu) > 5
    rss = run.metrics["system/process_memory_rss_megabytes"]
    assert 20 < rss <= run.metrics["system/process_memory_peak_megabytes"] + 1


def test_off_logs_nothing(store_root, monkeypatch):
    from attnstudy.tracking import Tracker

    monkeypatch.setenv("ATTNSTUDY_SYSTEM_METRICS", "0")
    tracker = Tracker()
    run_id = tracker.start_run(tracker.experiment_id("sys"), "quiet")
    with tracker.active(run_id), tracker.system_metrics(run_id):
        pass
    assert not any(k.startswith("system/") for k in tracker.get_run(run_id).metrics)


@pytest.mark.parametrize(
    "var,value",
    [("ATTNSTUDY_SYSTEM_METRICS", "maybe"), ("ATTNSTUDY_SYSTEM_METRICS_SECONDS", "often")],
)
def test_a_malformed_setting_is_refused_in_one_line(monkeypatch, var, value):
    from attnstudy.config import ConfigError
    from attnstudy.tracking import Tracker

    monkeypatch.setenv("ATTNSTUDY_SYSTEM_METRICS", "1")
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=rf"^{var}="):
        Tracker()


@pytest.mark.slow
def test_a_training_and_its_ablation_log_system_metrics(fresh_root, sampling_on):
    """Both kinds of run carry the figures (the wiring in model_runs and ablation_runs)."""
    from attnstudy.analysis.catalogue import AblationConfig

    from attnstudy.experiment import load_experiment
    from attnstudy.study.ablation_runs import ablate_run
    from attnstudy.study.model_runs import load_model, train_spec
    from attnstudy.tracking import Tracker

    cfg = load_experiment(ROOT / "experiments" / "tiny.toml", overrides=["training.epochs=1"])
    spec = cfg.runs()[0]
    tracker = Tracker()
    model = train_spec(spec, tracker, experiment_id=tracker.experiment_id("tiny"), progress=False)
    _, loaded = load_model(f"runs:/{model.run_id}", tracker)
    abl = AblationConfig(ablations=["uniform"], n_examples=2, bootstrap_resamples=10)
    ablation_id, _ = ablate_run(model.run_id, loaded, abl, tracker, progress=False)
    for run_id in (model.run_id, ablation_id):
        metrics = tracker.get_run(run_id).metrics
        for name in MACHINE + PROCESS:
            assert f"system/{name}" in metrics, (run_id, sorted(metrics))
        assert metrics["system/process_memory_rss_megabytes"] > 50  # torch is loaded
