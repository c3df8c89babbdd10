"""The main job end to end on the tiny experiment: study → model runs → ablation runs → report."""

import math

import pytest

pytestmark = pytest.mark.slow


def test_study_hierarchy_tags_and_metrics(tiny_study):
    from attnstudy.tracking import Tracker

    tracker = Tracker()
    study = tracker.get_run(tiny_study["study_run_id"])
    assert study.status == "FINISHED" and study.tags["kind"] == "study"
    assert study.name == "tiny/study"
    for m in tiny_study["models"]:
        assert m.reused  # trained by the tiny_models fixture, reused here by config hash
        model_run = tracker.get_run(m.run_id)
        # a member of the study (its own tag: no list that grows with every study)
        assert model_run.membership(tiny_study["study_run_id"])[0] == "model"
        abl = tracker.get_run(tiny_study["ablations"][m.run_id])
        assert abl.status == "FINISHED"
        assert abl.tags["source_run_id"] == m.run_id
        assert abl.tags["mlflow.parentRunId"] == m.run_id
        assert abl.tags["study_id"] == tiny_study["study_run_id"]
        assert abl.name == f"ablations of {model_run.name}"  # the kind first: the UI cuts the end
        assert all(math.isfinite(v) for v in abl.metrics.values())
        # the results, and how far it got (progress/fraction) and its resources (system/*, off
        # in the suite) while it ran
        kinds = ("ablation/", "seed_variance/", "timing/", "progress/", "system/")
        assert all(k.startswith(kinds) for k in abl.metrics), sorted(abl.metrics)
        assert abl.metrics["progress/fraction"] == 1.0
        # where the time went: seconds per ablation that ran, and steps per second
        assert abl.metrics["timing/steps_per_second"] > 0
        timed = {k.removeprefix("timing/").removesuffix("_seconds") for k in abl.metrics}
        ran = {k.split("/")[1] for k in abl.metrics if k.endswith(("/n_steps", "/n_examples"))}
        assert ran - {"n_examples"} <= timed
        table = tracker.load_table(abl.run_id, "ablations/steps.parquet")
        assert {"example_id", "step", "is_eos", "max_attention", "attention_entropy"} <= set(
            table.columns
        )
        if m.spec.model.attention == "none":
            assert "skipped.permutation" in abl.tags
            assert "ablation/importance/tau_grad_loo" in abl.metrics
        else:
            for key in (
                "ablation/permutation/flip_rate",
                "ablation/permutation/median_tvd",
                "ablation/uniform/flip_rate",
                "ablation/erase_max/flip_rate",
                "ablation/adversarial/max_jsd",
                "ablation/alignment/aer",
                "ablation/alignment/gold_mass",
            ):
                assert key in abl.metrics, key
            assert 0 <= abl.metrics["ablation/alignment/aer"] <= 1


def test_report_has_every_figure_table_and_links(tiny_study):
    report = tiny_study["report"]
    html = report.read_text(encoding="utf-8")
    for name in (
        "accuracy_by_length",
        "permutation",
        "adversarial",
        "kendall_tau",
        "erasure",
        "alignment_vs_ablation",
        "summary",
    ):
        png = report.parent / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    heatmaps = sorted((report.parent / "figures").glob("heatmaps_*.png"))
    assert heatmaps  # one per model with attention
    # the images are embedded (data: URIs), so the page renders inside MLflow's artifact frame
    assert html.count('src="data:image/png;base64,') >= 7 + len(heatmaps)
    assert 'src="figures/' not in html
    assert "<table" in html and "copy additive-bahdanau" in html
    assert tiny_study["study_run_id"] in html
    assert "task = &#34;copy&#34;" in html  # the experiment config, HTML-escaped (Jinja2)
    md = (report.parent / "report.md").read_text(encoding="utf-8")
    assert "| copy additive-bahdanau |" in md and "![" in md


def test_report_rebuilds_from_the_store_alone(tiny_study, tmp_path):
    from attnstudy import api
    from attnstudy.tracking import Tracker

    path = api.report(experiment="tiny", out_dir=str(tmp_path / "again"))
    assert path.read_text(encoding="utf-8").count("<img") == tiny_study["report"].read_text(
        encoding="utf-8"
    ).count("<img")
    arts = {a.path for a in Tracker().client.list_artifacts(tiny_study["study_run_id"], "report")}
    assert "report/report.html" in arts and "report/report.md" in arts
    with pytest.raises(LookupError, match="no experiment named 'nope'"):
        api.report(experiment="nope")
