"""Progress output in a log file: plain lines, at most one every LOG_INTERVAL seconds, naming the
model and the phase; no bar redrawn per batch, no cursor escapes."""

import io
import re
import time
from pathlib import Path

import pytest

from attnstudy.runtime import progress
from attnstudy.runtime.progress import Progress

ROOT = Path(__file__).parents[2]  # not conftest's: tests/analysis has its own conftest


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_outside_a_terminal_one_plain_line_per_interval(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()  # not a TTY
    bar = Progress(1000, "ablations g2p/additive-bahdanau/seed1", unit="example", stream=out)
    for i in range(1000):  # 1000 updates over 25 simulated seconds
        clock.t = i * 0.025
        bar.update(1, note="permutation")
    bar.close()
    lines = out.getvalue().splitlines()
    # one line at 10 s, one at 20 s, one at the end: never one per update
    assert len(lines) == 3, lines
    assert all(line.startswith("ablations g2p/additive-bahdanau/seed1: ") for line in lines)
    assert lines[-1].startswith("ablations g2p/additive-bahdanau/seed1: 1000/1000 examples")
    assert "[permutation]" in lines[-1]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_disabled_progress_writes_nothing():
    out = io.StringIO()
    bar = Progress(10, "x", enabled=False, stream=out)
    bar.update(10)
    bar.write("epoch line")
    bar.close()
    assert out.getvalue() == ""


@pytest.mark.parametrize("unit,plural", [("batch", "batches"), ("example", "examples")])
def test_unit_plural(unit, plural):
    assert progress._plural(unit) == plural


def test_training_log_is_a_few_lines_naming_model_and_epoch(tmp_path, capsys):
    """Training used a tqdm bar that redrew per batch outside a terminal (500 KB of log for a
    2-minute training)."""
    from attnstudy import api
    from attnstudy.experiment import load_experiment
    from attnstudy.models.training import train

    spec = load_experiment(ROOT / "experiments" / "tiny.toml").runs()[0]
    splits, src, tgt = api.load_data(spec)
    train(spec, splits, src, tgt, tmp_path / "ckpt", progress=True)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and "\x1b" not in err
    epochs = spec.training.epochs
    # per epoch: at most one line per 10 s while it runs, its closing count, its summary
    summaries = [line for line in lines if line.startswith(f"{spec.name} epoch ")]
    assert len(summaries) == epochs, lines
    assert all(f"train {spec.name} epoch" in line for line in lines if line not in summaries)
    assert len(lines) <= 3 * epochs, lines


def test_close_repeats_no_line(monkeypatch):
    """A plain line due at the last update was printed again by close (some training lines
    appeared twice in a log: the interval fell on an epoch's last batch)."""
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()
    bar = Progress(7, "train copy/additive-bahdanau/seed1 epoch 1", unit="batch", stream=out)
    for i in range(7):
        clock.t = 10.0 * (i == 6)  # the interval elapses at the last batch
        bar.update(1, note="loss 2.439")
    bar.close()
    assert out.getvalue().splitlines() == [
        "train copy/additive-bahdanau/seed1 epoch 1: 7/7 batches, 10 s, 0.7/s, ETA 0 s [loss 2.439]"
    ]


def test_stage_names_the_model_k_of_n():
    out = io.StringIO()
    with progress.stage("model 2 of 6"):
        bar = Progress(3, "train g2p/general-luong/seed1 epoch 1", unit="batch", stream=out)
    bar.update(3)
    bar.close()
    after = Progress(1, "train x", stream=out)  # outside the block: no stage
    assert out.getvalue().splitlines() == [
        "train g2p/general-luong/seed1 epoch 1 (model 2 of 6): 3/3 batches, 0 s"
    ]
    assert after.desc == "train x"


def test_ablation_progress_counts_examples_times_prefixes_and_names_what_runs(
    tiny_models, monkeypatch, capsys
):
    """'0/120 examples' for n_examples = 60 was 60 examples × 2 prefixes, unexplained; the note
    kept the last ablation of a batch (``[importance]``) while others ran."""
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.suite import run_suite

    from attnstudy.study.model_runs import load_model

    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.0)  # a line at every update
    monkeypatch.setattr(progress.time, "monotonic", Clock())
    model = next(m for m in tiny_models if m.spec.model.attention == "additive")
    _, loaded = load_model(f"runs:/{model.run_id}")
    cfg = AblationConfig(ablations=["uniform", "alignment"], n_examples=6, bootstrap_resamples=10)
    capsys.readouterr()
    run_suite(loaded.model, loaded_test(model), loaded.src_vocab, loaded.tgt_vocab, cfg, label="m")
    head = "ablations m on 6 examples × 2 prefixes: "
    assert capsys.readouterr().err.splitlines() == [
        head + "0/12 examples × prefixes, 0 s [uniform, greedy prefix]",
        head + "6/12 examples × prefixes, 0 s",
        head + "6/12 examples × prefixes, 0 s [alignment, reference prefix]",
        head + "12/12 examples × prefixes, 0 s",
    ]


def loaded_test(model):
    from attnstudy import api

    splits, _, _ = api.load_data(model.spec)
    return splits.test


DURATION = r"\d+ (?:s|min \d+ s|h \d+ min)"
UNTIMED = re.compile(rf", {DURATION}(?:, \S+/s, ETA {DURATION})?")
"""The elapsed time and the pace of a plain progress line (they vary from run to run)."""


def test_a_study_says_which_model_of_how_many(fresh_root, capsys, monkeypatch):
    """Every task writes a line when it starts (which model of how many, train or ablate) and
    progress lines while it runs, outside a terminal plain lines without a carriage return (a new
    user saw nothing for 15 minutes: lines came only when a task ended); its run logs
    ``progress/fraction`` while it runs (the MLflow UI's view of a RUNNING run)."""
    from attnstudy import api
    from attnstudy.experiment import load_experiment
    from attnstudy.tracking import Tracker

    monkeypatch.setenv("ATTNSTUDY_PROGRESS_SECONDS", "0")  # a line at every update
    monkeypatch.setenv("ATTNSTUDY_PROGRESS_METRIC_SECONDS", "0")  # a metric at every update
    cfg = load_experiment(
        ROOT / "experiments" / "tiny.toml",
        overrides=["training.epochs=1", "ablation.ablations=['uniform']", "ablation.n_examples=2"],
    )
    out = api.run(cfg, progress=True, report=False)
    text = capsys.readouterr().err
    assert "\r" not in text and "\x1b" not in text
    err = [UNTIMED.sub("", line) for line in text.splitlines()]
    names = ["copy/additive-bahdanau/seed1", "copy/none-bahdanau/seed1"]
    for k, name in enumerate(names, 1):
        head = f"train {name} epoch 1 (model {k} of 2): "
        assert f"train {name} (model {k} of 2): started" in err, err
        assert f"ablate {name} (model {k} of 2): started" in err, err
        # a line while it runs (the first batch), and the epoch's last count once
        assert sum(line.startswith(head + "1/7 batches [") for line in err) == 1, err
        assert sum(line.startswith(head + "7/7 batches [") for line in err) == 1, err
    starts = [line for line in err if line.endswith(": started")]
    assert starts == [  # all trainings, then all ablations, in the study's order
        f"{task} {name} (model {k} of 2): started"
        for task in ("train", "ablate")
        for k, name in enumerate(names, 1)
    ]
    # the none model has no attention: uniform is skipped, it shows no ablation progress
    assert "ablations copy/additive-bahdanau/seed1 (model 1 of 2): 2/2 examples" in err, err
    assert not any(line.startswith("ablations copy/none-bahdanau") for line in err), err

    tracker = Tracker()
    for m in out.models:  # one value per batch: 1/7 … 7/7 of the one epoch
        fractions = [v for _, v in tracker.metric_history(m.run_id, "progress/fraction")]
        assert fractions == pytest.approx([i / 7 for i in range(1, 8)]), m.spec.name
    additive = out.models[0].run_id
    fractions = [v for _, v in tracker.metric_history(out.ablations[additive], "progress/fraction")]
    assert fractions == [0.0, 1.0]  # at its start (RUNNING), then done


@pytest.mark.slow
def test_quiet_writes_no_progress_but_the_runs_still_log_it(fresh_root, capfd):
    """``attnstudy run --quiet``: no start line, no progress line; ``progress/fraction`` is
    still logged on every training and ablation run."""
    from cli_in_process import run_cli

    from attnstudy.tracking import Kind, Tag, Tracker

    res = run_cli(
        capfd,
        [
            "run",
            str(ROOT / "experiments" / "tiny.toml"),
            "--quiet",
            "--no-report",
            "--set",
            "training.epochs=1",
            "--set",
            "ablation.ablations=['uniform']",
            "--set",
            "ablation.n_examples=2",
        ],
        cwd=fresh_root,
        env={"ATTNSTUDY_PROGRESS_SECONDS": "0", "ATTNSTUDY_PROGRESS_METRIC_SECONDS": "0"},
    )
    assert res.returncode == 0, res.stderr
    for word in ("started", "batches", "examples", "epoch"):
        assert word not in res.stderr, res.stderr
    tracker = Tracker()
    runs = tracker.search_runs([tracker.experiment_id("tiny")])
    worked = [r for r in runs if r.kind in (Kind.MODEL, Kind.ABLATION)]
    assert len(worked) == 4, [(r.name, r.kind) for r in runs]
    for r in worked:
        last = tracker.metric_history(r.run_id, "progress/fraction")[-1][1]
        assert last == 1.0, (r.name, r.tags.get(Tag.KIND))


def test_a_long_unit_still_shows_a_line_every_interval(monkeypatch):
    """One unit that takes long (an adversarial batch of a Transformer: minutes) showed nothing
    until it ended: the heartbeat writes the count again with the time passed, and the run's
    progress metric again."""
    import time

    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.05)
    monkeypatch.setattr(progress, "METRIC_INTERVAL", 0.05)
    monkeypatch.setattr(progress, "HEARTBEAT_FLOOR", 0.05)
    out, reported = io.StringIO(), []
    with progress.reporting(reported.append):
        bar = Progress(4, "ablations m", unit="example", stream=out)
    bar.update(1, note="adversarial")  # the first unit; the second takes long
    time.sleep(0.5)
    lines = out.getvalue().splitlines()
    bar.close()
    assert len(lines) >= 2, lines
    assert all(line.startswith("ablations m: 1/4 examples, ") for line in lines), lines
    assert all(line.endswith(" [adversarial]") for line in lines), lines
    assert "\r" not in out.getvalue()
    assert len(reported) >= 2 and set(reported) == {0.25}, reported  # again while it runs


def test_a_task_says_it_is_running_while_no_progress_line_is_written(monkeypatch):
    """Between a training's epochs, while the test split is decoded or the pages are logged, no
    display counted anything: a task's watchdog writes that it is still running."""
    import time

    monkeypatch.setattr(progress, "LOG_INTERVAL", 0.1)
    monkeypatch.setattr(progress, "HEARTBEAT_FLOOR", 0.05)
    out = io.StringIO()
    with progress.stage("model 2 of 3"), progress.task("train m", stream=out):
        time.sleep(0.5)  # work no Progress counts
    lines = out.getvalue().splitlines()
    assert lines[0] == "train m (model 2 of 3): started"
    assert len(lines) >= 3, lines
    assert all(line.startswith("train m (model 2 of 3): running, ") for line in lines[1:]), lines
    assert "\r" not in out.getvalue()
    quiet = io.StringIO()
    with progress.task("train m", enabled=False, stream=quiet):
        time.sleep(0.2)
    assert quiet.getvalue() == ""


def test_pace_and_time_left_once_a_second_has_passed(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    out = io.StringIO()
    bar = Progress(600, "ablations m", unit="example × prefix", stream=out)
    clock.t = 150.0
    bar.update(100)
    bar.close()
    assert out.getvalue().splitlines() == [
        "ablations m: 100/600 examples × prefixes, 2 min 30 s, 0.667/s, ETA 12 min 30 s"
    ]


def test_a_span_maps_an_epoch_onto_the_whole_training():
    got = []
    with progress.reporting(got.append):
        bar = Progress(4, "train m epoch 2", enabled=False, unit="batch", span=(0.25, 0.5))
    for _ in range(4):
        bar.update(1)
    bar.close()
    assert got[0] == pytest.approx(0.25 + 0.25 / 4) and got[-1] == 0.5


def test_started_names_the_task_and_the_model_k_of_n():
    out = io.StringIO()
    with progress.stage("model 3 of 6"):
        progress.started("ablate copy/general-luong/seed2", stream=out)
        progress.started("ablate x", enabled=False, stream=out)
    assert out.getvalue() == "ablate copy/general-luong/seed2 (model 3 of 6): started\n"


@pytest.mark.parametrize("value", ["soon", "-1", "1e9"])
def test_a_malformed_interval_is_refused_in_one_line(monkeypatch, value):
    from attnstudy.config import ConfigError

    monkeypatch.setenv("ATTNSTUDY_PROGRESS_METRIC_SECONDS", value)
    with pytest.raises(
        ConfigError, match=r"^ATTNSTUDY_PROGRESS_METRIC_SECONDS=.* in \[0, 86400\];"
    ):
        progress.check_intervals()


@pytest.mark.slow
def test_the_report_says_it_started_and_is_running(fresh_root, capfd, monkeypatch):
    """The driver's work after the tasks — the report, minutes on a big study — begins with a
    line and, outside a terminal, says it is running while it builds (nothing was written)."""
    from cli_in_process import run_cli

    import attnstudy.report.build as report  # StudyReport.build calls it here

    build = report.build_report

    def slow_build(*args, **kwargs):
        time.sleep(2.5)  # longer than one heartbeat: a running line is due
        return build(*args, **kwargs)

    monkeypatch.setattr(report, "build_report", slow_build)
    res = run_cli(
        capfd,
        [
            "run",
            str(ROOT / "experiments" / "tiny.toml"),
            "--set",
            "training.epochs=1",
            "--set",
            "ablation.ablations=['uniform']",
            "--set",
            "ablation.n_examples=2",
        ],
        cwd=fresh_root,
        env={"ATTNSTUDY_PROGRESS_SECONDS": "1"},
    )
    assert res.returncode == 0, res.stderr
    err = [UNTIMED.sub("", line) for line in res.stderr.splitlines()]
    assert "report tiny: started" in err, err
    assert "report tiny: running" in err, err  # its elapsed time removed (UNTIMED)
