"""The suite: columns, finite summary, batch-size invariance, skips, mode restore."""

from __future__ import annotations

import math

import attnstudy.analysis.suite as suite
import numpy as np
import pandas as pd
import pytest
from analysis_testkit import FAST_ABLATIONS, VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.suite import METRIC_NAME, SuiteResult, run_suite, summarize


def _cfg(**kw) -> AblationConfig:
    base = dict(
        n_permutations=8,
        n_random_orders=2,
        bootstrap_resamples=50,
        seed=5,
        ablations=FAST_ABLATIONS,
    )
    return AblationConfig(**{**base, **kw})


EXPECTED_KEYS = [
    "ablation/permutation/flip_rate",
    "ablation/permutation/median_tvd",
    "ablation/permutation/n_steps",
    "ablation/permutation/flip_rate_n_undefined",
    "ablation/permutation/n_skipped",
    "ablation/uniform/flip_rate",
    "ablation/uniform/tvd",
    "ablation/erase_max/flip_rate",
    "ablation/erase_max/tvd",
    "ablation/erase_until_flip/attn_desc_never_flipped",
    "ablation/erase_until_flip/random_never_flipped",
    "ablation/alignment/aer",
    "ablation/alignment/gold_mass",
    "ablation/alignment/argmax_on_gold",
    "ablation/alignment/aer_head0",
    "ablation/alignment/aer_head1",
    "ablation/permutation_global/changed_rate",
    "ablation/permutation_global/exact_match_drop",
    "ablation/permutation/median_tvd_ci_low",
    "ablation/permutation/median_tvd_ci_high",
]


def test_suite_on_a_tiny_untrained_model():
    model = sharpen(tiny_model("multihead", "luong"))
    res = run_suite(model, make_examples(), VOCAB, VOCAB, _cfg(), progress=False, batch_size=4)
    assert isinstance(res, SuiteResult) and res.skipped == {}
    base_cols = [
        "example_id",
        "prefix",
        "step",
        "layer",
        "head",
        "src_len",
        "target_token",
        "predicted_token",
        "is_eos",
        "max_attention",
        "attention_entropy",
    ]
    assert list(res.table.columns[: len(base_cols)]) == base_cols
    for col in [
        "permutation_median_tvd",
        "permutation_flip_rate",
        "uniform_tvd",
        "erase_max_flip",
        "erase_grad_attn_desc_frac_mass",
        "alignment_gold_mass",
        "alignment_head1_n_hyp",
    ]:
        assert col in res.table.columns
    assert set(res.table["prefix"]) == {"greedy", "reference"}  # alignment runs on the reference
    assert not res.table.duplicated(["example_id", "prefix", "step"]).any()
    assert res.table.loc[res.table["prefix"] == "reference", "permutation_median_tvd"].isna().all()
    assert res.table.loc[res.table["prefix"] == "greedy", "alignment_n_hyp"].isna().all()
    assert list(res.examples["example_id"]) == [ex.id for ex in make_examples()]
    for key in EXPECTED_KEYS:
        assert key in res.summary, key
    for key, value in res.summary.items():
        assert METRIC_NAME.match(key) and math.isfinite(value), key
    for key in res.summary:
        if key.endswith("_ci_low"):
            stat = key[: -len("_ci_low")]
            assert (
                res.summary[key] - 1e-12
                <= res.summary[stat]
                <= res.summary[stat + "_ci_high"] + 1e-12
            )
    steps = res.table[res.table["prefix"] == "greedy"]
    assert res.summary["ablation/permutation/n_steps"] == len(steps)
    assert res.summary["ablation/permutation/n_skipped"] == steps["permutation_skipped"].sum() > 0
    assert res.summary["ablation/permutation/median_tvd"] == pytest.approx(
        steps["permutation_median_tvd"].mean()
    )
    # where the time went: every ablation timed, the analysed steps of each prefix counted
    assert set(res.seconds) == set(FAST_ABLATIONS) and all(v > 0 for v in res.seconds.values())
    assert res.steps == {
        "greedy": len(steps),
        "reference": int((res.table["prefix"] == "reference").sum()),
    }


def test_batch_size_changes_nothing():
    model = sharpen(tiny_model("additive"))
    cfg = _cfg(prefix="reference")
    a = run_suite(model, make_examples(), VOCAB, VOCAB, cfg, progress=False, batch_size=1)
    b = run_suite(model, make_examples(), VOCAB, VOCAB, cfg, progress=False, batch_size=7)
    pd.testing.assert_frame_equal(a.table, b.table, atol=1e-6, rtol=0)
    pd.testing.assert_frame_equal(a.examples, b.examples)
    assert a.summary.keys() == b.summary.keys()
    for k in a.summary:
        assert a.summary[k] == pytest.approx(b.summary[k], abs=1e-6), k


def test_same_seed_same_summary():
    model = sharpen(tiny_model("additive"))
    a = run_suite(model, make_examples(), VOCAB, VOCAB, _cfg(), progress=False)
    b = run_suite(model, make_examples(), VOCAB, VOCAB, _cfg(), progress=False)
    assert a.summary == b.summary
    pd.testing.assert_frame_equal(a.table, b.table)


def test_none_model_skips_attention_ablations_with_a_reason():
    model = tiny_model("none")
    res = run_suite(model, make_examples(4), VOCAB, VOCAB, _cfg(), progress=False)
    assert set(res.skipped) == set(FAST_ABLATIONS)
    assert all("no attention" in reason for reason in res.skipped.values())
    assert len(res.table) > 0 and res.table["max_attention"].isna().all()
    assert not any(k.startswith("ablation/") and "/permutation/" in k for k in res.summary)


def test_an_ablation_whose_function_cannot_be_loaded_fails_loudly():
    """A typo in a spec's function name used to turn the ablation into "skipped" silently; "skipped"
    now only means the model lacks a capability."""
    from attnstudy.analysis.catalogue import (
        AblationSpec,
        AblationSpecError,
        register_ablation,
        unregister_ablation,
    )

    register_ablation(
        AblationSpec(
            "typo_ablation",
            run="attnstudy.analysis.ablations.permutation:run_permutatoin",
            requires=(),
        )
    )
    try:
        with pytest.raises(AblationSpecError, match="run_permutatoin.*cannot be loaded"):
            run_suite(
                tiny_model("additive"),
                make_examples(3),
                VOCAB,
                VOCAB,
                _cfg(ablations=["typo_ablation"]),
                progress=False,
            )
    finally:
        unregister_ablation("typo_ablation")


def test_train_mode_restored_and_eval_used():
    model = sharpen(tiny_model("additive", dropout=0.5))
    examples = make_examples(5)
    cfg = _cfg(ablations=["permutation", "uniform", "alignment"])
    expected = run_suite(model, examples, VOCAB, VOCAB, cfg, progress=False)  # eval mode
    model.train()
    got = run_suite(model, examples, VOCAB, VOCAB, cfg, progress=False)
    assert model.training
    pd.testing.assert_frame_equal(expected.table, got.table)


def test_summary_leaves_undefined_out_and_counts_it():
    table = pd.DataFrame(
        {
            "example_id": ["a", "a", "b"],
            "prefix": "greedy",
            "step": [0, 1, 0],
            "uniform_tvd": [float("nan")] * 3,
            "uniform_flip": [float("nan")] * 3,
            "uniform_skipped": [True, False, False],
        }
    )
    s = summarize(
        table, pd.DataFrame({"example_id": ["a", "b"]}), ["uniform"], {"uniform": "greedy"}, _cfg()
    )
    assert s == {
        "ablation/uniform/n_steps": 3.0,
        "ablation/uniform/n_skipped": 1.0,
        "ablation/uniform/flip_rate_n_undefined": 2.0,
        "ablation/uniform/tvd_n_undefined": 2.0,
    }


def test_summary_micro_average_and_example_bootstrap():
    # example a: 3 steps of 1.0; example b: 1 step of 0.0 → micro-average 0.75 (not 0.5)
    table = pd.DataFrame(
        {
            "example_id": ["a", "a", "a", "b"],
            "prefix": "greedy",
            "step": [0, 1, 2, 0],
            "uniform_tvd": [1.0, 1.0, 1.0, 0.0],
            "uniform_flip": [1.0, 1.0, 1.0, 0.0],
            "uniform_skipped": False,
        }
    )
    s = summarize(
        table,
        pd.DataFrame({"example_id": ["a", "b"]}),
        ["uniform"],
        {"uniform": "greedy"},
        _cfg(bootstrap_resamples=200),
    )
    assert s["ablation/uniform/tvd"] == pytest.approx(0.75)
    # resampling examples: {a,a} → 1, {b,b} → 0, {a,b} → 0.75
    assert s["ablation/uniform/tvd_ci_low"] == pytest.approx(0.0)
    assert s["ablation/uniform/tvd_ci_high"] == pytest.approx(1.0)


def test_progress_bars_do_not_break(capsys):
    model = sharpen(tiny_model("additive"))
    res = run_suite(
        model, make_examples(3), VOCAB, VOCAB, _cfg(ablations=["uniform"]), progress=True
    )
    assert "ablation/uniform/tvd" in res.summary
    err = capsys.readouterr().err  # not a terminal: plain lines, no cursor escapes
    assert "\x1b" not in err
    # the last line counts what was done and names no ablation as still running (the note naming
    # the running ablation is tested in tests/cli/test_progress.py)
    assert err.strip().splitlines()[-1].startswith("ablations: 3/3 examples, ")
    assert "[" not in err.strip().splitlines()[-1]


def test_empty_examples_raise():
    with pytest.raises(ValueError, match="at least one example"):
        run_suite(tiny_model("additive"), [], VOCAB, VOCAB, _cfg(), progress=False)


def test_batch_size_changes_nothing_under_the_greedy_prefix():
    model = sharpen(tiny_model("multihead", "luong"))
    cfg = _cfg(prefix="greedy", ablations=["uniform"])
    a = run_suite(model, make_examples(), VOCAB, VOCAB, cfg, progress=False, batch_size=1)
    b = run_suite(model, make_examples(), VOCAB, VOCAB, cfg, progress=False, batch_size=7)
    pd.testing.assert_frame_equal(a.table, b.table, atol=1e-6, rtol=0)


def test_streamed_table_equals_the_in_memory_table(tmp_path):
    model = sharpen(tiny_model("multihead", "luong"))
    cfg = _cfg()  # alignment on the reference, the rest on greedy: two column sets to join
    in_memory = run_suite(model, make_examples(), VOCAB, VOCAB, cfg, progress=False, batch_size=4)
    path = tmp_path / "ablations" / "steps.parquet"
    streamed = run_suite(
        model, make_examples(), VOCAB, VOCAB, cfg, progress=False, batch_size=4, table_path=path
    )
    assert streamed.table is None and streamed.summary == in_memory.summary
    assert [p.name for p in path.parent.iterdir()] == ["steps.parquet"]  # part files cleaned up
    got = pd.read_parquet(path)
    want = in_memory.table
    assert list(got.columns) == list(want.columns) and len(got) == len(want) > 0
    pd.testing.assert_frame_equal(
        got.astype(object).where(got.notna(), None),
        want.astype(object).where(want.notna(), None),
        check_dtype=False,
    )


def test_streaming_leaves_no_file_when_an_ablation_fails(tmp_path, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("ablation failed")

    import attnstudy.analysis.ablations.uniform as uniform_module

    monkeypatch.setattr(uniform_module, "run", boom)
    path = tmp_path / "steps.parquet"
    with pytest.raises(RuntimeError, match="ablation failed"):
        run_suite(
            sharpen(tiny_model("additive")),
            make_examples(3),
            VOCAB,
            VOCAB,
            _cfg(ablations=["uniform"]),
            progress=False,
            table_path=path,
        )
    assert list(tmp_path.iterdir()) == []


def test_bootstrap_in_bounded_batches_gives_the_same_interval(monkeypatch):
    from attnstudy.scoring import estimates

    rng = np.random.default_rng(0)
    num, den = rng.random(500), rng.integers(1, 5, 500).astype(float)
    cfg = _cfg(bootstrap_resamples=300)
    whole = suite.ratio_ci(num, den, cfg)  # 300 × 500 < BOOTSTRAP_ELEMENTS: one call
    monkeypatch.setattr(estimates, "BOOTSTRAP_ELEMENTS", 7 * 500)  # 7 resamples per call
    chunked = suite.ratio_ci(num, den, cfg)
    assert whole[0] == chunked[0] == pytest.approx(num.sum() / den.sum())
    assert whole == chunked  # scipy draws each batch's indices from one generator in turn


def test_step_mean_ci_is_the_step_micro_average_with_an_example_bootstrap():
    """Σ value / number of steps (a NaN step counts, adding nothing), and the interval of the
    same per-example sums and counts given to ratio_ci; None on an empty table."""
    table = pd.DataFrame(
        {
            "example_id": ["a", "a", "b", "c", "c", "c"],
            "x": [1.0, 0.0, np.nan, 0.5, 0.5, 1.0],
        }
    )
    cfg = _cfg(bootstrap_resamples=200)
    value, low, high = suite.step_mean_ci(table, "x", cfg)
    assert value == pytest.approx(3.0 / 6)
    ref = suite.ratio_ci(np.array([1.0, 0.0, 2.0]), np.array([2.0, 1.0, 3.0]), cfg)
    assert (value, low, high) == pytest.approx(ref, abs=1e-12)
    assert 0.0 <= low <= value <= high <= 2 / 3
    assert suite.step_mean_ci(table.iloc[:0], "x", cfg) is None


def test_undefined_values_are_counted_per_statistic():
    """The uniform model's attention is constant, so τ(attention, ·) is undefined on every step, but
    its τ gradient–LOO is defined: it used to be counted as 8 undefined steps of the whole ablation."""
    model = sharpen(tiny_model("uniform"))
    examples = [ex for ex in make_examples(9) if len(ex.src) >= 3]
    res = run_suite(model, examples, VOCAB, VOCAB, _cfg(ablations=["importance"]), progress=False)
    n = res.summary["ablation/importance/n_steps"]
    assert res.summary["ablation/importance/n_skipped"] == 0
    assert res.summary["ablation/importance/tau_attn_grad_n_undefined"] == n
    assert res.summary["ablation/importance/tau_grad_loo_n_undefined"] == 0
    assert (
        "ablation/importance/tau_grad_loo" in res.summary
        and "ablation/importance/tau_attn_grad" not in res.summary
    )
