"""Model URIs of ``predict`` and ``ablate`` that name a folder: ``ablate FOLDER`` said "unknown model
URI" of a folder ``predict`` accepts (ablate logs under the model's run, which a folder lacks: it
now says so and what to do), and ``predict ./nonexist`` said "unknown model URI" of a path."""

from __future__ import annotations

import pytest

from attnstudy.cli import main as cli


def main(capsys, *argv: str) -> tuple[int, list[str]]:
    """``attnstudy ARGV`` in this process: (exit code, stderr lines)."""
    capsys.readouterr()
    code = cli.main(list(argv))
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_ablate_of_a_model_folder_says_why_and_what_to_do(tmp_path, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    code, err = main(capsys, "ablate", str(folder))
    assert code == cli.EXIT_USAGE
    assert err == [
        f"attnstudy: error: {folder}: ablate logs its ablation run under the model's run, and a "
        "model folder has none: ablate the run the model came from (runs:/<run_id> or "
        f"models:/<name>/<version>); a Hugging Face save_pretrained folder is ablated as hf:{folder}"
    ]


@pytest.mark.parametrize(
    "uri,said",
    [
        ("./nonexist", "no such folder: './nonexist'"),
        ("~/attnstudy-no-such-model", "no such folder: '~/attnstudy-no-such-model'"),
        ("sub/nonexist", "no such folder: 'sub/nonexist'"),
        ("a-file", "is not a folder: 'a-file'"),
    ],
)
def test_predict_of_a_path_that_is_no_folder_says_so(uri, said, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("x")
    code, err = main(capsys, "predict", uri, "abc")
    assert code == cli.EXIT_USAGE
    assert err == [
        f"attnstudy: error: {said}; give the folder holding the model files (weights, config, "
        "vocabularies), runs:/<run_id> or models:/<name>/<version>"
    ]


def test_an_unknown_scheme_is_still_an_unknown_model_uri(capsys):
    code, err = main(capsys, "predict", "s3://bucket/model", "abc")
    assert code == cli.EXIT_USAGE and len(err) == 1
    assert "unknown model URI 's3://bucket/model'" in err[0]
