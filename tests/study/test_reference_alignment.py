"""Attention's alignment beside eflomal's in a study of the NT fixture: the reference row computed
once per data settings (a run of its own, reused by the next study), the side-by-side and the
flip-split tables of the report and of ``report --results``, the known answers behind them, and
the one-line refusal when eflomal-align is missing."""

from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from figures import figures_undrawn
from prerequisites import require

from attnstudy import api
from attnstudy.cli.main import main
from attnstudy.data import eflomal, nt
from attnstudy.experiment import load_experiment
from attnstudy.report import build_report
from attnstudy.report.store import load_study
from attnstudy.tracking import Kind, Tag, Tracker

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nt"
FILES = nt.NTFiles(
    FIXTURE / "SBLGNT.tsv", FIXTURE / "nt_BSB.tsv", FIXTURE / "SBLGNT-BSB-manual.json"
)

EXPERIMENT = """
[experiment]
name = "nt-fixture"
seeds = [1]

[data]
task = "nt-greek-english"
nt_min_test_verses = 0
nt_test_fraction = 0.3
nt_vocab_size = 120

[model]
embedding_dim = 8
encoder_hidden = 8
decoder_hidden = 16
attention_dim = 8

[training]
epochs = 1
batch_size = 8

[ablation]
ablations = ["permutation", "uniform", "erase_max", "alignment", "attribution_alignment"]
prefix = "reference"
layers = "each"
n_examples = 10
bootstrap_resamples = 50
[ablation.permutation]
n = 5
[ablation.attribution_alignment.integrated_gradients]
n_steps = 4

[[models]]
model = { attention = "additive", flow = "bahdanau" }

[[models]]
model = { architecture = "transformer", layers = 2, heads = 2, d_model = 8, d_ff = 16 }
"""


def _eflomal_installed() -> bool:
    return (
        shutil.which(eflomal.COMMAND) is not None
        or (Path(sys.executable).parent / eflomal.COMMAND).is_file()
    )


@pytest.fixture
def fixture_files(monkeypatch):
    """The task reads the committed fixture; the models train in this process (a worker process
    would read the installed package)."""
    monkeypatch.setattr(nt, "package_files", lambda: FILES)
    monkeypatch.setenv("ATTNSTUDY_WORKERS", "1")


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_study_shows_attention_beside_eflomal_and_reuses_the_reference_run(
    fresh_root, fixture_files, tmp_path
):
    require(_eflomal_installed(), "eflomal-align is not installed (make test-deps)")
    toml = tmp_path / "nt.toml"
    toml.write_text(EXPERIMENT, encoding="utf-8")
    cfg = load_experiment(toml)
    with figures_undrawn():
        first = api.run(cfg, progress=False, report=False)
    tracker = Tracker(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    data = load_study(tracker, first.study_run_id)
    assert len(data.references) == 1
    ref = data.references[0]
    test_ids = [e.id for e in api.load_data(cfg.runs()[0])[0].test][:10]
    examples = api.load_data(cfg.runs()[0])[0].test[:10]
    # the same test examples as the battery, against the same gold
    assert ref["counts"]["test_verses"] == len(test_ids)
    assert ref["counts"]["gold_links"] == sum(len(e.alignment.sure) for e in examples)
    assert ref["aligner"] == "eflomal, grow-diag-final-and"

    # a second study with the same data settings reuses the reference run: a study of
    # attribution_alignment alone (e.g. integrated gradients on fewer verses), checked below too
    toml2 = tmp_path / "nt-attribution.toml"
    toml2.write_text(
        EXPERIMENT.replace(
            'ablations = ["permutation", "uniform", "erase_max", "alignment", '
            '"attribution_alignment"]',
            'ablations = ["attribution_alignment"]',
        ),
        encoding="utf-8",
    )
    with figures_undrawn():
        second = api.run(load_experiment(toml2), progress=False, report=False)
    exp = tracker.experiment_id("nt-fixture", create=False)
    refs = tracker.search_runs([exp], f"tags.{Tag.KIND} = '{Kind.REFERENCE_ALIGNMENT}'")
    assert len(refs) == 1
    assert load_study(tracker, second.study_run_id).references[0]["run_id"] == refs[0].run_id

    results = tmp_path / "results"
    with figures_undrawn():  # tables here; the report tests draw the same kinds of figure
        html = build_report(tracker, first.study_run_id, tmp_path / "report", results_dir=results)
    page = html.read_text(encoding="utf-8")
    assert "Attention&#39;s alignment beside a statistical aligner&#39;s" in page or (
        "Attention's alignment beside a statistical aligner's" in page
    )
    assert "AER = 1 − F1" in page
    side = _rows(results / "nt-fixture-alignment.csv")
    eflomal_row = side[0]
    assert eflomal_row["aligner"] == "eflomal, grow-diag-final-and"
    assert eflomal_row["AER"].startswith(f"{ref['scores']['aer'][0]:.3g}")
    summary = _rows(results / "nt-fixture.csv")
    attention = [r for r in side if r["aligner"] == "attention argmax"]
    # a row per model plus a row per Transformer layer and the layer mean
    assert [(r["model"].split()[-1], r["layer"]) for r in attention] == [
        ("additive-bahdanau", "analysed"),
        ("transformer-L2H2", "analysed"),
        ("transformer-L2H2", "layer 1"),
        ("transformer-L2H2", "layer 2"),
        ("transformer-L2H2", "layer mean"),
    ]
    # attention's numbers are the summary table's, and the attribution_alignment entry's
    # attention columns (the same argmax scored by its own code) give the same AER
    rnn = next(r for r in summary if r["model"] == attention[0]["model"])
    assert attention[0]["AER"] == rnn["AER"] and attention[0]["precision"] == rnn["precision"]
    assert rnn["AER attention"] == rnn["AER"]
    methods = {r["aligner"] for r in side if r["model"] == rnn["model"]}
    assert methods >= {
        "saliency argmax",
        "input × gradient argmax",
        "integrated gradients argmax",
        "occlusion argmax",
    }

    # the flip split, by hand from the stored per-step table
    flips = _rows(results / "nt-fixture-alignment-flips.csv")
    e = next(
        x for x in load_study(tracker, first.study_run_id).entries if x.variant == rnn["model"]
    )
    st = e.steps[(e.steps["prefix"] == "reference") & (e.steps["head"] == -1)]
    for aligned, label in ((1.0, "on a gold link"), (0.0, "off the gold links")):
        row = next(r for r in flips if r["model"] == e.variant and r["attention argmax"] == label)
        part = st[st["alignment_argmax_on_gold"] == aligned]
        assert row["steps"] == f"{len(part):,}"
        if len(part):
            value = part["permutation_flip_rate"].mean()
            assert row["permutation flip rate"].startswith(f"{value:.3g}")
    assert sum(int(r["steps"]) for r in flips if r["model"] == e.variant) == int(
        pd.Series(st["alignment_argmax_on_gold"]).notna().sum()
    )

    # the study of attribution_alignment alone still lists its models: attention's argmax scored
    # by attribution_alignment gives the same AER; its reference row is the reused run's
    with figures_undrawn():
        build_report(
            tracker, second.study_run_id, tmp_path / "report2", results_dir=tmp_path / "r2"
        )
    side2 = _rows(tmp_path / "r2" / "nt-fixture-alignment.csv")
    assert side2[0]["aligner"] == "eflomal, grow-diag-final-and"
    assert [side2[0][k] for k in ("AER", "precision", "recall")] == [
        eflomal_row[k] for k in ("AER", "precision", "recall")
    ]
    att2 = next(
        r for r in side2 if r["model"] == rnn["model"] and r["aligner"] == "attention argmax"
    )
    assert att2["AER"] == attention[0]["AER"] and att2["recall"] == attention[0]["recall"]
    assert att2["AER, next step"] == "not run"  # the alignment ablation's statistic
    assert {r["aligner"] for r in side2 if r["model"] == rnn["model"]} == {
        "attention argmax",
        "saliency argmax",
        "input × gradient argmax",
        "integrated gradients argmax",
        "occlusion argmax",
    }


def test_a_study_without_eflomal_is_refused_in_one_line_before_training(
    fresh_root, fixture_files, tmp_path, monkeypatch, capsys
):
    def missing():
        raise eflomal.EflomalMissing(
            f"the command {eflomal.COMMAND!r} is not installed; run: {eflomal.INSTALL}"
        )

    monkeypatch.setattr(eflomal, "find_command", missing)
    toml = tmp_path / "nt.toml"
    toml.write_text(EXPERIMENT, encoding="utf-8")
    assert main(["run", str(toml)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "attnstudy: error: the command 'eflomal-align' is not installed; run: "
        f"{eflomal.INSTALL} (the reference aligner of task 'nt-greek-english')"
    ]
    tracker = Tracker(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}")
    exp = tracker.experiment_id("nt-fixture", create=False)
    assert exp is None or not tracker.search_runs([exp], f"tags.{Tag.KIND} = '{Kind.MODEL}'")
