"""A study's progress lines name what happens to a pretrained variant (``model.source =
"hf:FOLDER"``): it is evaluated, never trained — the line said ``train … started`` and a worker
study's note ``[training …]``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prerequisites import require  # noqa: E402

require(
    importlib.util.find_spec("transformers") is not None,
    "transformers is not installed (pip install -e '.[hf]')",
    module_level=True,
)

from attnstudy.models.hf_tiny import build_tiny  # noqa: E402

LINES = "cat dog\tcat dog\nsnow rain fire\tsnow rain fire\nblue fish\tblue fish\n"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("hf") / "tiny", steps=0)


def _experiment(tmp_path: Path, folder: Path, overrides: list[str] | None = None):
    from attnstudy.experiment import load_experiment

    for split in ("train", "dev", "test"):
        (tmp_path / f"{split}.tsv").write_text(LINES, encoding="utf-8")
    toml = tmp_path / "hf.toml"
    toml.write_text(
        f"""
[experiment]
name = "hf-progress"
[data]
task = "tsv"
train_path = "train.tsv"
dev_path = "dev.tsv"
test_path = "test.tsv"
[ablation]
n_examples = 2
ablations = ["uniform"]
bootstrap_resamples = 20
[[models]]
model = {{ source = "hf:{folder}" }}
""",
        encoding="utf-8",
    )
    return load_experiment(toml, overrides=overrides or [])


def test_a_pretrained_variant_is_evaluated_not_trained(fresh_root, tmp_path, folder, capsys):
    from attnstudy import api

    api.run(_experiment(tmp_path, folder), progress=True, report=False)
    err = capsys.readouterr().err.splitlines()
    starts = [line for line in err if line.endswith(": started")]
    name = "tsv/hf-tiny/seed1"
    assert starts == [
        f"evaluate {name} (model 1 of 1): started",
        f"ablate {name} (model 1 of 1): started",
    ], err


def test_the_task_words_of_a_trained_and_a_pretrained_model(tmp_path, folder):
    from attnstudy.study.model_runs import model_task

    (hf,) = _experiment(tmp_path, folder).runs()
    (rnn,) = _experiment(tmp_path, folder, ['models=[{model={attention="dot"}}]']).runs()
    assert [model_task(hf), model_task(hf, noun=True)] == ["evaluate", "evaluation"]
    assert [model_task(rnn), model_task(rnn, noun=True)] == ["train", "training"]
    for spec in (hf, rnn):
        assert [model_task(spec, "ablation"), model_task(spec, "ablation", noun=True)] == [
            "ablate",
            "ablation",
        ]
