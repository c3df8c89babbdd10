"""Task nt-greek-english trained end to end on the committed fixture: the model run logs BLEU
and chrF (greedy and beam) with intervals, carries the data card in its description, and the
table of trainings that ``attnstudy report --results`` writes shows them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("sacrebleu")

from attnstudy import api
from attnstudy.data import nt  # noqa: E402
from attnstudy.data.tasks import TRANSLATION_METRICS  # noqa: E402
from attnstudy.experiment import ExperimentConfig  # noqa: E402
from attnstudy.report import results  # noqa: E402
from attnstudy.tracking import Tag, Tracker  # noqa: E402

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nt"
FILES = nt.NTFiles(
    FIXTURE / "SBLGNT.tsv", FIXTURE / "nt_BSB.tsv", FIXTURE / "SBLGNT-BSB-manual.json"
)


def _config() -> ExperimentConfig:
    return ExperimentConfig.model_validate(
        {
            "experiment": {"name": "nt-fixture", "seeds": [1]},
            "data": {"task": nt.TASK, "nt_min_test_verses": 0, "nt_vocab_size": 120},
            "model": {
                "embedding_dim": 8,
                "encoder_hidden": 8,
                "decoder_hidden": 16,
                "attention_dim": 8,
            },
            "training": {"epochs": 2, "batch_size": 4, "beam_size": 2},
            "models": [{"model": {"attention": "additive", "flow": "bahdanau"}}],
        }
    )


@pytest.mark.slow
def test_a_model_run_logs_bleu_and_chrf_and_the_data_card(fresh_root, monkeypatch):
    monkeypatch.setattr(nt, "package_files", lambda: FILES)
    (model,) = api.train_experiment(_config(), progress=False)
    run = Tracker().get_run(model.run_id)
    m = run.metrics
    for tm in TRANSLATION_METRICS:
        assert tm.key in m, tm.key
        assert m[f"{tm.key}_ci_low"] <= m[tm.key] <= m[f"{tm.key}_ci_high"]
        assert 0 <= m[tm.key] <= 100
    assert "train/cpu_seconds" in m and m["train/cpu_seconds"] > 0

    splits = api.load_data(model.spec)[0]
    assert m["test/n"] == len(splits.test) > 0

    note = run.tags[Tag.NOTE]
    assert nt.ATTRIBUTION in note and "CC BY 4.0" in note and "public domain" in note
    assert "chrF, greedy" in note

    path = api.report(experiment="nt-fixture", results_dir=str(fresh_root / "res"))
    (row,) = results.read_rows(path)
    for tm in TRANSLATION_METRICS:
        value, low, high = m[tm.key], m[f"{tm.key}_ci_low"], m[f"{tm.key}_ci_high"]
        assert row[tm.label] == f"{value:.1f} [{low:.1f}, {high:.1f}]"
    assert float(row["CPU minutes"]) == pytest.approx(m["train/cpu_seconds"] / 60, abs=0.05)
    assert math.isfinite(float(row["best dev loss"]))
