"""What a notebook reads of an ablation run through ``attnstudy.api`` (docs/tutorial.ipynb):
``ablation_summary`` (what ``attnstudy ablate`` prints), ``example_records`` (the browser's
records, ``ablations/heatmaps.json``) and ``ablation_table`` — on the committed golden store."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """The golden store in a fresh project root; (root, an attention model's ablation run id)."""
    golden = ROOT / "tests" / "fixtures" / "golden"
    spec = importlib.util.spec_from_file_location("golden_build", golden / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path_factory.mktemp("golden-api")
    module.load(root)
    heatmaps = sorted((root / "mlruns" / "artifacts").glob("*/*/artifacts/ablations/heatmaps.json"))
    run = next(p for p in heatmaps if json.loads(p.read_text(encoding="utf-8")))
    return root, run.parents[2].name


@pytest.fixture
def store(golden, monkeypatch):
    root, run_id = golden
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return root / "mlruns" / "artifacts", run_id


def test_a_notebook_reads_an_ablation_runs_tables_records_and_summary(store):
    from attnstudy import api

    artifacts, run_id = store
    (folder,) = artifacts.glob(f"*/{run_id}/artifacts/ablations")
    examples = api.ablation_table(run_id, "examples")
    assert examples.equals(pd.read_csv(folder / "examples.csv"))
    steps = api.ablation_table(run_id, "steps")
    assert len(steps) == len(pd.read_parquet(folder / "steps.parquet")) > 0
    assert list(api.ablation_table(run_id, "summary").columns) == list(
        pd.read_csv(folder / "summary.csv").columns
    )
    records = api.example_records(run_id)
    assert records == json.loads((folder / "heatmaps.json").read_text(encoding="utf-8"))
    assert {r["id"] for r in records} <= set(examples["example_id"])
    lines = api.ablation_summary(run_id)
    assert lines[-1] == f"ablation run: runs:/{run_id}"
    assert any(line.startswith("verdict: used ") for line in lines)
    browser = next(line for line in lines if line.startswith("example browser: "))
    assert Path(browser.removeprefix("example browser: ")) == folder / "browser.html"
    with pytest.raises(ValueError, match="no ablation table 'heatmaps'; valid: steps, examples"):
        api.ablation_table(run_id, "heatmaps")
