"""Example records (heatmaps, the example browser): recorded from the suite's own batches, they hold
the matrices behind the per-step table's numbers; the capture functions (each catalogue entry's
``captures``) are their ablation's run, and record the maps the entry declares."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from analysis_testkit import VOCAB, make_examples, one_batch, sharpen, tiny_model
from attnstudy.analysis.batch import AblationContext
from attnstudy.analysis.catalogue import AblationConfig, capture_functions, captures, get_ablation
from attnstudy.analysis.heatmaps import Recorder, example_records
from attnstudy.analysis.suite import run_suite

CFG = dict(
    ablations=["permutation", "adversarial", "importance", "alignment"],
    bootstrap_resamples=20,
    seed=3,
    permutation={"n": 5},
    adversarial={"steps": 15, "k": 2},
)


@pytest.mark.parametrize("name", sorted(captures()))
def test_capture_functions_return_exactly_their_ablations_table(name):
    model = sharpen(tiny_model("additive", seed=2))
    batch = one_batch(model, make_examples(6), prefix="greedy")
    cfg = AblationConfig(**CFG)
    ctx = AblationContext.of(cfg)
    run, record = capture_functions(name)
    mine, computed = run(model, batch, cfg.params_for(name), ctx)
    theirs = get_ablation(name).function()(model, batch, cfg.params_for(name), ctx)
    pd.testing.assert_frame_equal(mine, theirs)
    # the record holds every map the entry declares, one row per real decoder step
    steps = batch.trace.step_mask[0].nonzero()[:, 0]
    maps = record(batch, 0, steps, int(batch.trace.src_lengths[0]), computed)
    for m in get_ablation(name).captures.maps:
        assert len(maps[m.key]) == len(steps)


@pytest.fixture(scope="module")
def recorded():
    model = sharpen(tiny_model("multihead", flow="luong", seed=1, heads=2))
    examples = make_examples(9)
    cfg = AblationConfig(**CFG)
    rec = Recorder(cfg.prefix)
    result = run_suite(
        model, examples, VOCAB, VOCAB, cfg, progress=False, batch_size=4, recorder=rec
    )
    return model, examples, cfg, result, rec.result()


def test_records_hold_the_matrices_behind_the_per_step_numbers(recorded):
    _, examples, _, result, records = recorded
    table = result.table
    assert [r["id"] for r in records] == [ex.id for ex in examples]
    greedy = table[table["prefix"] == "greedy"]
    for rec in records:
        rows = greedy[greedy["example_id"] == rec["id"]].sort_values("step")
        t, n = len(rows), len(rec["source"])
        assert len(rec["rows"]) == t and list(rows["target_token"]) == rec["rows"]
        att = np.array(rec["attention"][0], dtype=float)  # layer 0, head mean
        assert att.shape == (t, n)
        assert np.allclose(att.max(1), rows["max_attention"], atol=1e-3)
        assert np.allclose(att.sum(1), 1, atol=5e-3)
        assert np.array(rec["heads"], dtype=float).shape == (1, 2, t, n)
        jsd = np.array([np.nan if v is None else v for v in rec["adversarial_jsd"]])
        assert np.allclose(jsd, rows["adversarial_max_jsd"], atol=1e-3, equal_nan=True)
        for r, found in zip(rec["adversarial"], rows["adversarial_found"].fillna(False)):
            assert (r is not None) == bool(found)
        assert np.array(rec["gradient"], dtype=float).shape == (t, n)
        assert np.array(rec["loo"], dtype=float).shape == (t, n)
        assert 0 <= min(rec["p"]) and max(rec["p"]) <= 1


def test_reference_attention_and_gold_links_for_examples_with_gold(recorded):
    _, examples, _, _, records = recorded
    by_id = {r["id"]: r for r in records}
    for ex in examples:
        rec = by_id[ex.id]
        if ex.alignment is None:
            assert "gold" not in rec
            continue
        assert rec["reference_rows"] == [*ex.tgt, "<eos>"]
        assert np.array(rec["reference_attention"]).shape == (len(ex.tgt) + 1, len(ex.src))
        assert {(s, t) for s, t, _ in rec["gold"]} == set(ex.alignment.possible)
        assert {(s, t) for s, t, sure in rec["gold"] if sure} == set(ex.alignment.sure)


def test_standalone_records_equal_the_recorded_ones(recorded):
    """Batch composition changes nothing (per-step generators): 3-example batches here."""
    model, examples, cfg, _, records = recorded
    again = example_records(model, examples, VOCAB, VOCAB, cfg, batch_size=3)
    assert again == records


def test_a_model_without_attention_has_no_records():
    model = tiny_model("none")
    assert example_records(model, make_examples(3), VOCAB, VOCAB, AblationConfig(**CFG)) == []
