"""A study that survives its own failures: isolation, resume, reports of partial studies, and a
model key that follows the data (every test has its own store)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
pytestmark = pytest.mark.slow

THREE = [
    'models=[{model={attention="additive",flow="bahdanau"}},{model={attention="general",flow="luong"}},'
    '{model={attention="none",flow="bahdanau"}}]'
]


def _cfg(*overrides: str):
    from attnstudy.experiment import load_experiment

    return load_experiment(TINY, list(overrides))


def _tracker():
    from attnstudy.tracking import Tracker

    return Tracker()


def test_one_failing_variant_does_not_stop_the_study(fresh_root, monkeypatch, capsys):
    """The first failing variant used to end the whole `attnstudy run`: later variants never ran and the
    failed run carried no reason."""
    from attnstudy.analysis.ablations import erase_max as erase_module

    from attnstudy.cli import main as cli
    from attnstudy.study import model_runs

    real_train, real_erase = model_runs.train, erase_module.run

    def train(spec, *args, **kw):
        if spec.model.attention == "general":
            raise RuntimeError("boom in training")
        return real_train(spec, *args, **kw)

    def erase_max(model, batch, params, ctx):
        if model.attention.__class__.__name__ == "AdditiveAttention":
            raise RuntimeError("boom in ablation")
        return real_erase(model, batch, params, ctx)

    monkeypatch.setattr(model_runs, "train", train)
    monkeypatch.setattr(erase_module, "run", erase_max)
    code = cli.main(["run", str(TINY), "--quiet", "--set", THREE[0]])
    out, err = capsys.readouterr()
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("attnstudy: error: 2 part(s) of the study failed")
    assert "copy/general-luong/seed1 (training: RuntimeError: boom in training)" in last
    assert "copy/additive-bahdanau/seed1 (ablation: RuntimeError: boom in ablation)" in last
    assert "trained copy/none-bahdanau/seed1" in out and "report: " in out

    t = _tracker()
    study_id = out.split("study: runs:/")[1].split()[0]
    study = t.get_run(study_id)
    assert study.status == "FAILED"
    assert study.metrics["study/n_ok"] == 1 and study.metrics["study/n_failed"] == 2
    assert "boom in training" in study.tags["failed"] and "boom in ablation" in study.tags["failed"]
    runs = {r.name: r for r in t.search_runs([study.experiment_id])}
    failed_model = runs["copy/general-luong/seed1"]
    assert failed_model.status == "FAILED"
    assert failed_model.tags["error.class"] == "RuntimeError"
    assert failed_model.tags["mlflow.note.content"] == "Failed: RuntimeError: boom in training"
    failed_abl = runs["ablations of copy/additive-bahdanau/seed1"]
    assert failed_abl.status == "FAILED" and failed_abl.tags["error.message"] == "boom in ablation"
    assert runs["ablations of copy/none-bahdanau/seed1"].status == "FINISHED"
    md = (fresh_root / "reports" / "tiny" / "report.md").read_text()
    assert "Study status: **FAILED**" in md
    assert "copy general-luong: training failed (boom in training)" in md
    assert "copy additive-bahdanau: ablations failed (boom in ablation)" in md
    rows = [  # its rows in the number tables (not the table of links into the UI)
        line
        for line in md.splitlines()
        if line.startswith("| copy additive-bahdanau |") and "](" not in line
    ]
    # trained: its test accuracy is a number; its ablations failed: every ablation cell says so
    assert "| 0" in rows[0] or "| 1" in rows[0]
    # the models table and five ablation tables (the side-by-side table with a statistical
    # aligner only where one ran: none here)
    assert len(rows) == 6 and all("| failed |" in row for row in rows[1:])


def test_an_interrupted_study_resumes(fresh_root, figures_not_drawn, monkeypatch):
    """`run --resume` continues the interrupted study: finished models and their finished ablations are
    reused, the interrupted training resumes from its checkpoint, its ablations run (figures saved
    undrawn)."""
    from attnstudy import api
    from attnstudy.study import driver as study
    from attnstudy.study import model_runs

    cfg = _cfg(THREE[0])
    real_train, real_ablate = model_runs.train, study.ablate_run
    state = {"train": True, "ablate": True}

    def train(spec, *args, on_epoch=None, **kw):
        def hook(epoch, metrics):
            on_epoch(epoch, metrics)
            if state["train"] and spec.model.attention == "general" and epoch == 1:
                state["train"] = False
                raise KeyboardInterrupt

        return real_train(spec, *args, on_epoch=hook, **kw)

    def ablate_run(run_id, loaded, *args, **kw):
        if state["ablate"] and loaded.spec.model.attention == "general":
            state["ablate"] = False
            raise KeyboardInterrupt
        return real_ablate(run_id, loaded, *args, **kw)

    monkeypatch.setattr(model_runs, "train", train)
    monkeypatch.setattr(study, "ablate_run", ablate_run)
    with pytest.raises(KeyboardInterrupt):
        api.run(cfg, progress=False, report=False)
    t = _tracker()
    exp_id = t.experiment_id("tiny")
    (study,) = t.search_runs([exp_id], "tags.kind = 'study'")
    assert study.status == "KILLED"
    killed = t.search_runs([exp_id], "attributes.run_name = 'copy/general-luong/seed1'")[0]
    assert killed.status == "KILLED"

    with pytest.raises(
        KeyboardInterrupt
    ):  # the interrupted training resumes; now an ablation is interrupted
        api.run(cfg, progress=False, report=False, resume=True)
    assert t.get_run(study.run_id).status == "KILLED"
    first_ablations = {
        r.tags["source_run_id"]: r.run_id
        for r in t.search_runs(
            [exp_id], "tags.kind = 'ablation' and attributes.status = 'FINISHED'"
        )
    }
    assert len(first_ablations) == 1  # the additive model's; the general one was interrupted

    out = api.run(cfg, progress=False, report=True, resume=True)
    assert out.resumed and out.study_run_id == study.run_id
    assert t.get_run(study.run_id).status == "FINISHED"
    assert all(m.reused for m in out.models)  # all three trained by now
    general = next(m for m in out.models if m.spec.model.attention == "general")
    resumed_run = t.get_run(general.run_id)
    assert resumed_run.run_id != killed.run_id and resumed_run.metrics["train/epochs"] == 2
    hist = t.client.get_metric_history(general.run_id, "train/loss")
    killed_hist = t.client.get_metric_history(killed.run_id, "train/loss")
    assert [m.step for m in killed_hist] == [1]
    assert sorted(m.step for m in hist) == [1, 2]  # epoch 1 from the checkpoint, epoch 2 trained
    assert next(m.value for m in hist if m.step == 1) == killed_hist[0].value
    for model_run, abl in first_ablations.items():
        assert out.ablations[model_run] == abl  # reused, not rerun
    assert len(out.ablations) == 3
    # the study's members as recorded (one tag per member run, #59; no growing id list)
    from attnstudy.tracking import store

    recorded = store.study_runs(t, out.study_run_id)
    assert sorted(r.run_id for r in recorded.ablations.values()) == sorted(out.ablations.values())


def test_resume_that_finds_no_matching_study_says_so(fresh_root, caplog):
    """`run --resume` with nothing to continue (or an interrupted study of another configuration,
    e.g. its data changed) started a new study without a word."""
    from attnstudy import api
    from attnstudy.tracking import store

    cfg = _cfg('models=[{model={attention="none",flow="bahdanau"}}]', "ablation.n_examples=4")
    t = _tracker()
    exp_id = t.experiment_id("tiny")
    other = store.start_study(t, exp_id, "tiny", "another-study-key", "")
    t.end_run(other, "KILLED")
    out = api.run(cfg, progress=False, report=False, resume=True)
    assert not out.resumed and out.study_run_id != other
    assert (
        f"--resume: no interrupted study of experiment 'tiny' has this configuration (the "
        f"newest, {other}, has another study key: a config, data or ablation setting changed "
        "since); starting a new study (a model's interrupted training still resumes from its "
        "checkpoint)"
    ) in caplog.text


@pytest.mark.parametrize(
    ("overrides", "expect"),
    [
        (
            ['ablation.ablations=["uniform","alignment"]'],
            "Ablations not run in this study: permutation, ",
        ),
        (['models=[{model={attention="none",flow="bahdanau"}}]'], "no attention"),
    ],
)
def test_report_of_a_partial_study_says_why_numbers_are_missing(fresh_root, overrides, expect):
    """With no permutation results (a subset without it, a study of `none` models) the report ended in a
    bare AssertionError, the study FAILED and reports/<experiment>/ half-overwritten."""
    from attnstudy import api

    out = api.run(_cfg(*overrides), progress=False)
    assert _tracker().get_run(out.study_run_id).status == "FINISHED"
    md = out.report.with_name("report.md").read_text()
    assert expect in md
    assert not list(out.report.parent.parent.glob(".tiny.*"))  # no temporary folder left
    assert oct(out.report.parent.stat().st_mode & 0o777) != "0o700"


def test_report_is_built_atomically(tiny_study_root, tiny_study, figures_not_drawn, monkeypatch):
    """A report that fails half-way leaves the report it would replace whole (the tiny study of
    the session, in a copy of its store: its report built here first; its figures, drawn by the
    session's study, saved undrawn)."""
    from attnstudy import api
    from attnstudy.report import build as report_mod  # build_report looks render_markdown up here

    report = api.report(study_id=tiny_study.study_run_id)
    assert report.parent == tiny_study_root / "reports" / "tiny"
    before = {p.name: p.read_bytes() for p in report.parent.glob("*.*")}

    def broken(context):
        raise RuntimeError("disk trouble")

    monkeypatch.setattr(report_mod, "render_markdown", broken)
    with pytest.raises(RuntimeError, match="disk trouble"):
        report_mod.build_report(_tracker(), tiny_study.study_run_id)
    after = {p.name: p.read_bytes() for p in report.parent.glob("*.*")}
    assert after == before  # the old report stays whole
    assert not list(report.parent.parent.glob(".tiny.*"))


def test_a_later_ad_hoc_ablation_never_changes_a_studys_report(
    tiny_study_root, tiny_study, figures_not_drawn
):
    """The tiny study of the session, in a copy of its store: its report before and after an ad
    hoc ablation of one of its models (figures, drawn by the session's study, saved undrawn)."""
    from attnstudy.analysis.catalogue import AblationConfig

    from attnstudy import api

    out = tiny_study
    report = api.report(study_id=out.study_run_id)
    assert report.parent == tiny_study_root / "reports" / "tiny"
    md = report.with_name("report.md").read_text()
    model = out.models[0]
    api.ablate(
        f"runs:/{model.run_id}",
        AblationConfig(ablations=["uniform"], n_examples=1, seed=7),
        progress=False,
    )
    again = api.report(study_id=out.study_run_id)
    assert again.with_name("report.md").read_text() == md


def test_replaced_data_files_are_not_reused_and_old_models_refuse_new_data(fresh_root, tmp_path):
    """Replacing the TSV files at the same paths printed "reused" and reported the old model's test metrics
    beside ablations run on the new file."""
    from attnstudy.analysis.catalogue import AblationConfig

    from attnstudy import api
    from attnstudy.data.types import DataError
    from attnstudy.experiment import parse_experiment

    data = tmp_path / "data"
    data.mkdir()
    lines = "".join(
        f"{a} {b}\t{b} {a}\t0-1 1-0\n" for a, b in [("x", "y"), ("y", "z"), ("z", "x")] * 20
    )
    for split in ("train", "dev", "test"):
        (data / f"{split}.tsv").write_text(lines)
    raw = {
        "experiment": {"name": "tsvexp"},
        "data": {
            "task": "tsv",
            **{f"{s}_path": str(data / f"{s}.tsv") for s in ("train", "dev", "test")},
        },
        "model": {
            "embedding_dim": 8,
            "encoder_hidden": 8,
            "decoder_hidden": 16,
            "attention_dim": 8,
        },
        "training": {"epochs": 1},
    }
    cfg = parse_experiment(raw)
    (first,) = api.train_experiment(cfg, progress=False)
    (again,) = api.train_experiment(cfg, progress=False)
    assert again.reused and again.run_id == first.run_id
    assert f"finished run {first.run_id} has the same model key {first.key}" in again.reason

    stat = (data / "train.tsv").stat()
    swapped = lines.replace("x", "q")  # same size, other content
    assert len(swapped) == len(lines)
    for split in ("train", "dev", "test"):
        path = data / f"{split}.tsv"
        path.write_text(swapped)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (data / "train.tsv").stat().st_mtime_ns == stat.st_mtime_ns
    (third,) = api.train_experiment(cfg, progress=False)
    assert not third.reused and third.key != first.key
    with pytest.raises(DataError, match="changed since this model was trained"):
        api.ablate(f"runs:/{first.run_id}", AblationConfig(n_examples=2), progress=False)
    # the same content at another path is the same model
    moved = tmp_path / "moved"
    moved.mkdir()
    for split in ("train", "dev", "test"):
        (moved / f"{split}.tsv").write_text(swapped)
    raw2 = json.loads(json.dumps(raw))
    raw2["data"].update({f"{s}_path": str(moved / f"{s}.tsv") for s in ("train", "dev", "test")})
    (fourth,) = api.train_experiment(parse_experiment(raw2), progress=False)
    assert fourth.reused and fourth.run_id == third.run_id


def test_unknown_dev_and_test_tokens_are_counted_and_logged(fresh_root, tmp_path, caplog):
    from attnstudy import api
    from attnstudy.experiment import parse_experiment

    (tmp_path / "train.tsv").write_text("a b\tb a\n" * 10)
    (tmp_path / "dev.tsv").write_text("a c\tc a\n" * 3)
    (tmp_path / "test.tsv").write_text("a b\tb a\n" * 3)
    cfg = parse_experiment(
        {
            "experiment": {"name": "unk"},
            "data": {
                "task": "tsv",
                **{f"{s}_path": str(tmp_path / f"{s}.tsv") for s in ("train", "dev", "test")},
            },
            "model": {
                "embedding_dim": 4,
                "encoder_hidden": 4,
                "decoder_hidden": 8,
                "attention_dim": 4,
            },
            "training": {"epochs": 1},
        }
    )
    (m,) = api.train_experiment(cfg, progress=False)
    assert (
        "dev split: 3 of 6 source tokens (50.0 %) are not in the training vocabulary" in caplog.text
    )
    metrics = _tracker().get_run(m.run_id).metrics
    assert metrics["data/dev/source_unknown"] == 3 and metrics["data/dev/target_unknown"] == 3
    assert metrics["data/test/source_unknown"] == 0 and metrics["data/dev/source_tokens"] == 6
