"""What an ablation worker holds does not grow with the number of examples beyond its caps: the
example recorder (maps of the analysed prefix and of the reference), the browser's per-step
values, the per-example sums. benchmarks/bench_memory.py measures the whole worker."""

from __future__ import annotations

import pandas as pd
import pytest
from analysis_testkit import VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.heatmaps import Recorder
from attnstudy.analysis.suite import run_suite


def test_the_recorder_keeps_at_most_its_cap_whatever_the_count():
    """The reference maps (attention over the reference, gold links) were kept for every analysed
    example with gold links, uncapped: 8 of 9 here, beside 3 records."""
    model = sharpen(tiny_model("additive", "bahdanau", seed=2))
    examples = make_examples(9, seed=4)
    cfg = AblationConfig(ablations=["uniform", "alignment"], n_examples=9, bootstrap_resamples=20)
    for cap, n in ((3, 9), (3, 5), (20, 9)):
        rec = Recorder(cfg.prefix, max_records=cap)
        run_suite(
            model, examples[:n], VOCAB, VOCAB, cfg, progress=False, batch_size=2, recorder=rec
        )
        kept = min(cap, n)
        assert list(rec.records) == [ex.id for ex in examples[:kept]]
        assert set(rec._reference) <= set(rec.records)
        with_gold = [ex.id for ex in examples[:kept] if ex.alignment is not None]
        assert sorted(rec._reference) == sorted(with_gold)
        result = rec.result()
        assert len(result) == kept
        assert [r["id"] for r in result if "reference_attention" in r] == with_gold


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    """A streamed step table of a two-layer Transformer, every layer and head (several units per
    example, in the suite's order), both prefixes, 11 examples in batches of 3; 4 recorded."""
    model = sharpen(tiny_model("multihead", "transformer", seed=5))
    examples = make_examples(11, seed=6)
    cfg = AblationConfig(
        ablations=["uniform", "permutation_global", "alignment"],
        n_examples=11,
        bootstrap_resamples=20,
        layers="each",
        heads="each",
    )
    path = tmp_path_factory.mktemp("streamed") / "steps.parquet"
    rec = Recorder(cfg.prefix, max_records=4)
    res = run_suite(
        model,
        examples,
        VOCAB,
        VOCAB,
        cfg,
        progress=False,
        batch_size=3,
        table_path=path,
        recorder=rec,
    )
    return path, res, rec.result()


@pytest.mark.parametrize("chunk", [1, 2, 5, 100])
def test_the_list_read_a_chunk_at_a_time_is_the_whole_tables(streamed, chunk, monkeypatch):
    import attnstudy.analysis.per_example as pe

    path, res, _ = streamed
    whole = pe.per_example_summary(pd.read_parquet(path), res.examples, "greedy")
    read = []
    real = pe.steps_of_examples
    monkeypatch.setattr(
        pe, "steps_of_examples", lambda p, ids, *a: read.append(len(ids)) or real(p, ids, *a)
    )
    got = pe.per_example_summary_file(path, res.examples, "greedy", chunk_examples=chunk)
    pd.testing.assert_frame_equal(got, whole)  # rows, order, columns, dtypes
    assert len(whole) == 11 * 5  # 11 examples × (2 layers × (2 heads + both jointly) … ) units
    assert max(read) == min(chunk, 11) and sum(read) == 11


def test_the_steps_csv_written_a_part_at_a_time_is_the_whole_tables(streamed, tmp_path):
    from attnstudy.pages.run_pages import write_steps_csv

    path, _, _ = streamed
    want = pd.read_parquet(path).round(4).to_csv(index=False)
    for rows in (7, 1000):
        write_steps_csv(path, tmp_path / "steps.csv", rows=rows)
        assert (tmp_path / "steps.csv").read_text(encoding="utf-8") == want


def test_the_browser_reads_only_the_recorded_examples_rows(streamed):
    from attnstudy.analysis.per_example import per_example_summary_file, steps_of_examples

    from attnstudy.pages.browser import browser_data

    path, res, records = streamed
    steps = pd.read_parquet(path)
    meta = {"prefix": "greedy"}
    whole = browser_data(records, steps, examples=res.examples, meta=meta)
    ids = [r["id"] for r in records]
    mine = steps_of_examples(path, ids)
    assert set(mine["example_id"]) == set(ids) and len(mine) < len(steps)
    summary = per_example_summary_file(path, res.examples, "greedy")
    got = browser_data(records, mine, examples=res.examples, meta=meta, summary=summary)
    assert got == whole
    assert len(got["examples"]) == len(summary) and len(got["records"]) == 4


def test_an_ablation_runs_pages_never_read_the_whole_step_table(
    tiny_study_root, tiny_models, tiny_config, figures_not_drawn, monkeypatch
):
    """log_ablation_pages read the whole steps.parquet (and kept three copies: the table, its
    rounded copy for the CSV, the browser's per-example frames); now only chunks are read."""
    import pyarrow.parquet as pq

    from attnstudy.study.ablation_runs import ablate_run
    from attnstudy.study.model_runs import load_model
    from attnstudy.tracking import Tracker

    real_pd, real_pq = pd.read_parquet, pq.read_table

    def whole(path, *a, **k):
        assert not str(path).endswith("steps.parquet"), "the whole step table was read"
        return real_pd(path, *a, **k)

    def whole_pq(path, *a, **k):
        assert not str(path).endswith("steps.parquet"), "the whole step table was read"
        return real_pq(path, *a, **k)

    monkeypatch.setattr(pd, "read_parquet", whole)
    monkeypatch.setattr(pq, "read_table", whole_pq)
    tracker = Tracker(create=False)
    run = tiny_models[0].run_id
    _, loaded = load_model(f"runs:/{run}", tracker)
    run_id, _ = ablate_run(run, loaded, tiny_config.ablation, tracker, progress=False)
    assert tracker.get_run(run_id).status == "FINISHED"
    assert tracker.has_artifact(run_id, "ablations/steps.csv")
    assert tracker.has_artifact(run_id, "ablations/browser.html")
