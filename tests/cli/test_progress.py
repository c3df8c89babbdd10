"""Progress output in a log file: plain lines, at most one every LOG_INTERVAL seconds, naming the
model and the phase; no bar redrawn per batch, no cursor escapes."""

import io
import re
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
        "train copy/additive-bahdanau/seed1 epoch 1: 7/7 batches, 10 s [loss 2.439]"
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

    from attnstudy.model_runs import load_model

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


def test_a_study_says_which_model_of_how_many(fresh_root, capsys):
    from attnstudy import api
    from attnstudy.experiment import load_experiment

    cfg = load_experiment(
        ROOT / "experiments" / "tiny.toml",
        overrides=["training.epochs=1", "ablation.ablations=['uniform']", "ablation.n_examples=2"],
    )
    api.run(cfg, progress=True, report=False)
    err = [re.sub(r", \d+ s\b", "", line) for line in capsys.readouterr().err.splitlines()]
    for k, name in enumerate(["copy/additive-bahdanau/seed1", "copy/none-bahdanau/seed1"], 1):
        head = f"train {name} epoch 1 (model {k} of 2): 7/7 batches ["
        assert sum(line.startswith(head) for line in err) == 1, err
    # the none model has no attention: uniform is skipped, it shows no ablation progress
    assert "ablations copy/additive-bahdanau/seed1 (model 1 of 2): 2/2 examples" in err, err
    assert not any(line.startswith("ablations copy/none-bahdanau") for line in err), err
