"""What is in MLflow's trash is named as such: a deleted experiment, a deleted run and a registered
model whose versions were deleted (field cases: MLflow issues 2651/6223, 8205, PR 1323).

Before: ``run`` on a deleted experiment printed MLflow's "The experiment 1 must be in the 'active'
state…" (exit 1), ``report --experiment`` said it "has no study run"; ``predict`` and ``ablate``
used a deleted run without a word (``ablate`` even logged a new run under it); ``models:/NAME/latest``
said "no registered model" of a name that exists with no versions left.

Each test works on a copy of the session store's database (its artifacts stay where they are, read
only), so nothing it deletes touches the store other tests read.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from attnstudy.cli import main as cli

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"


@pytest.fixture
def store_copy(tiny_models, store_root, tmp_path, monkeypatch):
    """A project root whose database is a copy of the session store's: (root, MlflowClient)."""
    from mlflow.tracking import MlflowClient

    root = tmp_path / "copy"
    (root / "mlruns").mkdir(parents=True)
    shutil.copy(store_root / "mlruns" / "mlflow.db", root / "mlruns" / "mlflow.db")
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    return root, MlflowClient(uri, registry_uri=uri)


def main(capsys, *argv: str) -> tuple[int, str, list[str]]:
    """``attnstudy ARGV`` in this process: (exit code, stdout, stderr lines)."""
    capsys.readouterr()
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, [line for line in out.err.splitlines() if line.strip()]


def count_runs(root: Path) -> int:
    with sqlite3.connect(root / "mlruns" / "mlflow.db") as con:
        return con.execute("select count(*) from runs").fetchone()[0]


def test_a_deleted_experiment_is_named_with_the_ways_out(store_copy, capsys):
    root, client = store_copy
    exp = client.get_experiment_by_name("tiny")
    client.delete_experiment(exp.experiment_id)
    before = count_runs(root)
    restore = (
        f"restore it (mlflow experiments restore --experiment-id {exp.experiment_id} with "
        f"MLFLOW_TRACKING_URI=sqlite:///{root / 'mlruns' / 'mlflow.db'}, or "
        f"MlflowClient().restore_experiment('{exp.experiment_id}'))"
    )
    writer, reader = "set another experiment.name", "name another experiment"
    for argv, other in (
        (["run", str(TINY), "--quiet", "--no-report"], writer),
        (["train", str(TINY), "--quiet"], writer),
        (["report", "--experiment", "tiny"], reader),
        (["report", "--experiment", "tiny", "--results", str(root / "res")], reader),
    ):
        code, out, err = main(capsys, *argv)
        assert code == cli.EXIT_USAGE and out == "", (argv, err)
        assert err == [
            f"attnstudy: error: experiment 'tiny' is deleted (in the store's trash); {restore} "
            f"or {other}"
        ], argv
    assert count_runs(root) == before  # nothing written to the deleted experiment
    assert not (root / "res").exists()


def test_a_deleted_run_is_refused_by_predict_and_ablate(store_copy, tiny_models, capsys):
    root, client = store_copy
    name = f"tiny-copy-{tiny_models[0].spec.label}"
    mv = client.get_model_version_by_alias(name, "seed1")
    run_id, version = mv.run_id, mv.version
    client.delete_run(run_id)
    before = count_runs(root)
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    way_out = (
        f"is deleted (in the store's trash); restore it (mlflow runs restore --run-id "
        f"{run_id} with MLFLOW_TRACKING_URI={uri}, or "
        f"MlflowClient().restore_run('{run_id}')) or train the model again"
    )
    for argv, named in (
        (["predict", f"runs:/{run_id}", "abc"], f"runs:/{run_id}: the run"),
        (["predict", f"runs:/{run_id}", "abc", "--force"], f"runs:/{run_id}: the run"),
        (
            ["ablate", f"runs:/{run_id}", "--n-examples", "1", "--ablations", "uniform"],
            f"runs:/{run_id}: the run",
        ),
        (
            ["predict", f"models:/{name}@seed1", "abc"],
            f"models:/{name}@seed1 (version {version}): its run {run_id}",
        ),
        (
            ["predict", f"models:/{name}/{version}", "abc"],
            f"models:/{name}/{version} (version {version}): its run {run_id}",
        ),
        (
            ["ablate", f"models:/{name}@seed1", "--n-examples", "1", "--ablations", "uniform"],
            f"models:/{name}@seed1 (version {version}): its run {run_id}",
        ),
    ):
        code, out, err = main(capsys, *argv)
        assert code == cli.EXIT_USAGE and out == "", (argv, out, err)
        assert err == [f"attnstudy: error: {named} {way_out}"], argv
    assert count_runs(root) == before  # ablate logged nothing under the deleted run


def test_a_registered_model_without_versions_says_so(store_copy, tiny_models, capsys):
    _, client = store_copy
    name = f"tiny-copy-{tiny_models[1].spec.label}"
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))
    for v in versions:
        client.delete_model_version(name, str(v))
    for ref in ("latest", "@seed1", f"{versions[0]}"):
        uri = f"models:/{name}{'' if ref.startswith('@') else '/'}{ref}"
        code, out, err = main(capsys, "predict", uri, "abc")
        assert code == cli.EXIT_USAGE and out == ""
        assert err == [
            f"attnstudy: error: {uri}: registered model '{name}' exists but has no versions "
            "(they were deleted); train the model again to register a new version"
        ]
    # a name that never existed is still "no registered model"
    code, _, err = main(capsys, "predict", "models:/no-such-model/latest", "abc")
    assert code == cli.EXIT_USAGE and "no registered model 'no-such-model'" in err[0]


def test_a_missing_version_or_alias_lists_the_versions_there_are(store_copy, tiny_models, capsys):
    _, client = store_copy
    name = f"tiny-copy-{tiny_models[0].spec.label}"
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name = '{name}'"))
    listed = ", ".join(map(str, versions[-5:]))  # the newest five
    for ref, missing in (("/999", "no version '999'"), ("@nope", "no alias 'nope'")):
        code, _, err = main(capsys, "predict", f"models:/{name}{ref}", "abc")
        assert code == cli.EXIT_USAGE
        assert err == [
            f"attnstudy: error: models:/{name}{ref}: registered model '{name}' has {missing} "
            f"(its versions: {listed})"
        ]


def test_a_deleted_pretrained_model_run_is_refused(fresh_root, tmp_path, capsys):
    """``ablate runs:/<pretrained model run> --tsv`` and ``predict`` read a deleted run's folder."""
    pytest.importorskip("transformers")
    from mlflow.tracking import MlflowClient

    from attnstudy.models.hf_tiny import build_tiny

    folder = build_tiny(tmp_path / "tiny-marian", steps=2)
    tsv = tmp_path / "copy.tsv"
    tsv.write_text("cat dog\tcat dog\nsnow rain\tsnow rain\n", encoding="utf-8")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    common = ["--ablations", "uniform", "--n-examples", "1", "--quiet", "--tracking-uri", uri]
    code, out, err = main(capsys, "ablate", f"hf:{folder}", "--tsv", str(tsv), *common)
    assert code == 0, err
    model_run = out.split("model run: runs:/")[1].split()[0]
    MlflowClient(uri).delete_run(model_run)
    restore = (
        f"runs:/{model_run}: the run is deleted (in the store's trash); restore it (mlflow runs "
        f"restore --run-id {model_run} with MLFLOW_TRACKING_URI={uri}, or "
        f"MlflowClient().restore_run('{model_run}')) or "
    )
    code, out, err = main(capsys, "ablate", f"runs:/{model_run}", "--tsv", str(tsv), *common)
    assert code == cli.EXIT_USAGE and out == ""
    assert err == [f"attnstudy: error: {restore}ablate hf:FOLDER again to record the model anew"]
    code, out, err = main(capsys, "predict", f"runs:/{model_run}", "cat", "--tracking-uri", uri)
    assert code == cli.EXIT_USAGE and out == ""
    assert err == [f"attnstudy: error: {restore}ablate hf:FOLDER again to record the model anew"]


def test_a_deleted_experiment_reached_through_a_run_is_named(store_copy, tiny_models, capsys):
    """Deleting experiment ``tiny`` deletes its runs too: ``ablate``/``predict`` of a model in it
    named the run, not the experiment; once the run alone was restored, ablate printed MLflow's
    "The experiment 1 must be in the 'active' state" (exit 1)."""
    root, client = store_copy
    exp = client.get_experiment_by_name("tiny")
    name = f"tiny-copy-{tiny_models[0].spec.label}"
    mv = client.get_model_version_by_alias(name, "seed1")
    client.delete_experiment(exp.experiment_id)
    before = count_runs(root)
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    deleted = (
        f"the run's experiment 'tiny' is deleted (in the store's trash); restore it (mlflow "
        f"experiments restore --experiment-id {exp.experiment_id} with MLFLOW_TRACKING_URI={uri}, "
        f"or MlflowClient().restore_experiment('{exp.experiment_id}')) or name another model"
    )
    ablate = ["ablate", f"runs:/{mv.run_id}", "--n-examples", "1", "--ablations", "uniform"]
    cases = (
        (ablate, f"runs:/{mv.run_id}"),
        (
            ["predict", f"models:/{name}/{mv.version}", "abc"],
            f"models:/{name}/{mv.version} (version {mv.version})",
        ),
    )
    for restored in (False, True):
        if restored:  # the run alone restored: its experiment is still deleted
            client.restore_run(mv.run_id)
        for argv, named in cases:
            code, out, err = main(capsys, *argv)
            assert code == cli.EXIT_USAGE and out == "", (argv, err)
            assert err == [f"attnstudy: error: {named}: {deleted}"], argv
    assert count_runs(root) == before


def test_a_missing_registered_model_lists_the_models_there_are(store_copy, capsys):
    """``predict models:/nosuch/1`` said "no registered model 'nosuch'" with no way out."""
    root, client = store_copy
    names = sorted(m.name for m in client.search_registered_models())
    assert len(names) >= 2
    uri = f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"
    shown = ", ".join(names[:5]) + (", … (attnstudy ui lists them all)" if len(names) > 5 else "")
    for ref in ("models:/nosuch/1", "models:/nosuch/latest", "models:/nosuch@best"):
        code, out, err = main(capsys, "predict", ref, "abc")
        assert code == cli.EXIT_USAGE and out == ""
        assert err == [
            f"attnstudy: error: {ref}: no registered model 'nosuch' in {uri}; the registered "
            f"models are: {shown}"
        ]
    for name in names:
        client.delete_registered_model(name)
    code, _, err = main(capsys, "predict", "models:/nosuch/1", "abc")
    assert err == [
        f"attnstudy: error: models:/nosuch/1: no registered model 'nosuch' in {uri}; the store has "
        "no registered model (attnstudy train registers each model it trains)"
    ]
