"""Task nt-greek-english end to end on the installed bible-alignments package: the task on a few
chapters, a tiny model trained two epochs, its subword attention scored against the word-level
gold, and eflomal-align run on the same verses. Needs `make test-deps` (skipped with the reason on
a developer's machine, a failure under CI=true)."""

from __future__ import annotations

import math
import shutil
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from attnstudy.analysis.ablations import alignment
from attnstudy.analysis.batch import prepare_batches
from prerequisites import require

from attnstudy.api import load_data
from attnstudy.data import eflomal, nt
from attnstudy.experiment import load_experiment
from attnstudy.models.training import train

EXPERIMENT = Path(__file__).parents[2] / "experiments" / "nt-greek-english.toml"


def _installed() -> bool:
    try:
        return version(nt.PACKAGE) == nt.PACKAGE_VERSION
    except PackageNotFoundError:
        return False


@pytest.mark.slow
def test_train_a_tiny_model_and_run_eflomal_on_a_few_chapters(tmp_path):
    require(_installed(), f"{nt.PACKAGE}=={nt.PACKAGE_VERSION} is not installed (make test-deps)")
    require(
        shutil.which(eflomal.COMMAND) is not None
        or (Path(sys.executable).parent / eflomal.COMMAND).is_file(),
        "eflomal-align is not installed (make test-deps installs eflomal==2.0.0)",
    )
    overrides = [
        "data.n_train=150",
        "data.n_dev=20",
        "data.n_test=30",
        "data.nt_vocab_size=500",
        "training.epochs=2",
        "model.embedding_dim=16",
        "model.encoder_hidden=16",
        "model.decoder_hidden=32",
        "model.attention_dim=16",
    ]
    runs = load_experiment(EXPERIMENT, overrides).runs()
    (spec,) = [s for s in runs if getattr(s.model, "attention", None) == "additive"]
    splits, sv, tv = load_data(spec)
    assert (len(splits.train), len(splits.dev), len(splits.test)) == (150, 20, 30)
    assert all(e.id.startswith("nt/test/") and e.tgt_words for e in splits.test)
    result = train(spec, splits, sv, tv, tmp_path, progress=False)
    assert len(result.history) == 2
    assert result.history[1]["train/loss"] < result.history[0]["train/loss"]

    examples = splits.test[:8]
    batch = next(prepare_batches(result.model, examples, sv, tv, "reference", 8))
    rows = alignment.derive(alignment.run(result.model, batch, None, None))
    # every gold link's English word is counted once (on its first subword); punctuation never
    assert rows["alignment_n_sure"].sum() == sum(len(e.alignment.sure) for e in examples)
    aer = 1 - rows["alignment_aer_num"].sum() / rows["alignment_aer_den"].sum()
    assert 0 <= aer <= 1

    scores, counts = eflomal.nt_reference(None, spec.data, timeout_s=90, resamples=100)
    assert counts["train_verses"] == 150 and counts["test_verses"] == 30
    assert counts["gold_links"] == sum(len(e.alignment.sure) for e in splits.test)
    for name in ("aer", "precision", "recall"):
        e = scores[name]
        assert 0 < e.value < 1 and math.isfinite(e.low) and e.low <= e.value <= e.high
