"""Progress output in a log file: plain lines, at most one every LOG_INTERVAL seconds, naming the
model and the phase; no bar redrawn per batch, no cursor escapes."""

import io
from pathlib import Path

import pytest

from attnstudy import progress
from attnstudy.progress import Progress

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
    from attnstudy.training import train

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
