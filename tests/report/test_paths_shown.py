"""Paths are shown absolute, or said to be relative and to what: the report named a TSV study's
data 'hf-example/train.tsv' (the path's last two parts), and ``ablate hf:FOLDER --tsv FILE``
recorded FILE as typed, relative to a working directory the run does not record."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from attnstudy.report.tables import data_label

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cli_in_process import run_cli  # noqa: E402


def test_a_tsv_study_names_its_training_file_absolute_or_says_relative_to_what():
    tsv = {"data.task": "tsv"}
    assert data_label(tsv | {"data.train_path": "/data/hf-example/train.tsv"}) == (
        "TSV file /data/hf-example/train.tsv"
    )
    assert data_label(tsv | {"data.train_path": "hf-example/train.tsv"}) == (
        "TSV file hf-example/train.tsv (relative to the folder its run was started in)"
    )
    assert data_label(tsv) == "tsv"


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="transformers is not installed"
)
def test_ablate_records_the_tsv_it_read_as_an_absolute_path(capfd, fresh_root, tmp_path):
    import mlflow

    from attnstudy.models.hf_tiny import build_tiny

    folder = build_tiny(tmp_path / "tiny", steps=0)
    (fresh_root / "two.tsv").write_text("cat dog\tcat dog\nblue fish\tblue fish\n")
    argv = ["ablate", f"hf:{folder}", "--tsv", "two.tsv", "--ablations", "saliency", "--quiet"]
    argv += ["--record"]
    res = run_cli(capfd, argv, cwd=fresh_root, env={})
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip().splitlines()[-1].removeprefix("ablation run: runs:/")
    run = mlflow.MlflowClient(f"sqlite:///{fresh_root / 'mlruns' / 'mlflow.db'}").get_run(run_id)
    assert run.data.params["data"] == str(fresh_root / "two.tsv")
