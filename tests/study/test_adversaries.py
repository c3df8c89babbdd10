"""``[trained_adversary]`` in a study: one tracked run per (model, λ), the study's list, the
report's table, figure and CSV, and reuse of a finished adversary by its key."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from figures import figures_undrawn

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
pytestmark = pytest.mark.slow


def test_a_study_trains_tracks_reports_and_reuses_its_adversaries(fresh_root, monkeypatch):
    from attnstudy import api
    from attnstudy.experiment import load_experiment
    from attnstudy.study import adversaries
    from attnstudy.tracking import Tracker, store

    # CPU and memory and progress on every run (a trained adversary's run had neither)
    monkeypatch.setenv("ATTNSTUDY_SYSTEM_METRICS", "1")
    monkeypatch.setenv("ATTNSTUDY_SYSTEM_METRICS_SECONDS", "0.5")
    cfg = load_experiment(
        TINY, ["trained_adversary.lambdas=[0.0, 0.5]", "trained_adversary.epochs=2"]
    )
    # the ablation pages' figures saved undrawn (matplotlib's drawing; the report below draws
    # the same heatmaps from the same records, and a summary of every model, in full)
    with figures_undrawn():
        result = api.run(cfg, progress=False, report=False)
    # its report, and the committed-results form of the same tables (attnstudy report --results
    # DIR), built once (a study's own report is the same build_report of the same store)
    out = fresh_root / "results"
    html = api.report(result.study_run_id, results_dir=str(out))
    tracker = Tracker()
    exp_id = tracker.experiment_id("tiny")
    runs = tracker.search_runs([exp_id], "tags.kind = 'adversary'")
    # the none-bahdanau variant has no attention: only additive-bahdanau is attacked
    assert sorted(r.name for r in runs) == [
        "copy/additive-bahdanau/seed1/adversary-lam0",
        "copy/additive-bahdanau/seed1/adversary-lam0.5",
    ]
    base = next(m for m in result.models if m.spec.model.attention == "additive")
    for r in runs:
        assert r.status == "FINISHED"
        assert r.tags["source_run_id"] == base.run_id
        assert r.tags["mlflow.parentRunId"] == base.run_id
        assert r.tags["study_id"] == result.study_run_id
        lo, hi = r.metrics["adversary/output_tvd_ci_low"], r.metrics["adversary/output_tvd_ci_high"]
        assert 0 <= lo <= r.metrics["adversary/output_tvd"] <= hi <= 1
        assert 0 <= r.metrics["adversary/attention_jsd"] <= 0.6932
        assert r.metrics["adversary/n_examples"] == cfg.ablation.n_examples
        steps = tracker.load_table(r.run_id, "adversary/steps.parquet")
        assert steps["adversary_output_tvd"].mean() == pytest.approx(
            r.metrics["adversary/output_tvd"]
        )
        assert r.metrics["adversary/n_steps"] == len(steps)
        assert tracker.metric_history(r.run_id, "train/attention_kl")[-1][0] == 2
        assert r.metrics["system/process_memory_rss_megabytes"] > 50  # torch is loaded
        assert [v for _, v in tracker.metric_history(r.run_id, "progress/fraction")][-1] == 1.0
    recorded = store.study_runs(tracker, result.study_run_id)
    assert {r.run_id for r in recorded.adversaries} == {r.run_id for r in runs}

    report = Path(html).parent
    assert report == fresh_root / "reports" / "tiny"
    table = pd.read_csv(report / "adversaries.csv")
    assert sorted(table["λ"]) == [0.0, 0.5]
    by_run = {r.run_id: r for r in runs}
    for _, row in table.iterrows():
        jsd = float(row["attention JSD"].split(" [")[0])
        assert jsd == pytest.approx(
            by_run[row["run"]].metrics["adversary/attention_jsd"], rel=5e-3, abs=1e-12
        )
    md = (report / "report.md").read_text()
    assert "Trained adversaries: can a model attend differently" in md
    assert "figures/trained_adversary.png" in md
    assert (report / "figures" / "trained_adversary.png").stat().st_size > 10_000

    # the committed-results form of the same tables
    from attnstudy.report import results
    from attnstudy.verdict.findings import Estimate

    assert sorted(p.name for p in out.iterdir()) == [
        ".attnstudy-output",  # the marker listing what attnstudy wrote (attnstudy.runtime.outputs)
        "tiny-adversaries.csv",
        "tiny-alignment.csv",  # attention's alignment (and a reference aligner's) side by side
        "tiny-models.csv",
        "tiny-timing.csv",
        "tiny.csv",
    ]
    # where the battery's time went: one row per finished ablation run, from its timing metrics
    timing = results.read_rows(out / "tiny-timing.csv")
    assert [r["model"] for r in timing] == [f"copy {m.spec.label}" for m in result.models]
    for row, m in zip(timing, result.models):
        abl = tracker.get_run(result.ablations[m.run_id]).metrics
        assert int(row["steps"]) == abl["timing/steps"] > 0
        assert float(row["seconds"]) == pytest.approx(abl["ablation/seconds"], abs=0.05)
        assert float(row["steps per second"]) == pytest.approx(
            abl["timing/steps"] / abl["ablation/seconds"], rel=1e-2
        )
        shares = [float(v) for k, v in row.items() if k.endswith(" %") and v]
        assert 0 < sum(shares) <= 100.05  # the ablations' own time is part of the battery's
    for row in results.read_rows(out / "tiny-adversaries.csv"):
        m = by_run[row["run"]].metrics
        assert row["study run"] == result.study_run_id
        want = Estimate(
            m["adversary/output_tvd"],
            m["adversary/output_tvd_ci_low"],
            m["adversary/output_tvd_ci_high"],
        ).fmt(3)
        assert row["output TVD"] == want
    models = {r["run"]: r for r in results.read_rows(out / "tiny-models.csv")}
    assert set(models) == {m.run_id for m in result.models}
    run = tracker.get_run(base.run_id)
    assert models[base.run_id]["test WER %"] == f"{100 * run.metrics['test/wer']:.2f}"
    assert models[base.run_id]["epochs"] == "2"

    # the same experiment again: a new study, the models and the adversaries reused by key (its
    # ablation pages' figures saved undrawn as well)
    with figures_undrawn():
        again = api.run(cfg, progress=False, report=False)
    assert again.study_run_id != result.study_run_id
    assert len(tracker.search_runs([exp_id], "tags.kind = 'adversary'")) == 2
    again_runs = store.study_runs(tracker, again.study_run_id).adversaries
    assert {r.run_id for r in again_runs} == set(by_run)
    # another λ is trained, the known ones are not (the function a study calls; a study of
    # `more` would ablate the same two models a third time)
    more = load_experiment(
        TINY, ["trained_adversary.lambdas=[0.5, 2.0]", "trained_adversary.epochs=2"]
    )
    api.run_trained_adversaries(more, again.models, tracker, again.study_run_id, progress=False)
    names = sorted(r.name for r in tracker.search_runs([exp_id], "tags.kind = 'adversary'"))
    assert names[-1] == "copy/additive-bahdanau/seed1/adversary-lam2" and len(names) == 3

    # two new λ beside a known one: the base model and its data are read once, not once per λ
    loads = []
    real_load = adversaries.load_model
    monkeypatch.setattr(
        adversaries, "load_model", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k)
    )
    three = load_experiment(
        TINY, ["trained_adversary.lambdas=[0.25, 0.5, 0.75]", "trained_adversary.epochs=2"]
    )
    ids = api.run_trained_adversaries(
        three, result.models, tracker, result.study_run_id, progress=False
    )
    assert loads == [f"runs:/{base.run_id}"]
    assert len(set(ids)) == 3 and ids[1] in {r.run_id for r in runs}
    assert len(tracker.search_runs([exp_id], "tags.kind = 'adversary'")) == 5
