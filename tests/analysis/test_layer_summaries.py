"""Per-layer summaries and the layer mean, recomputed from a per-step table: the same numbers as
the suite's own per-unit metrics, never mixing one head's rows into a layer's."""

import math

import numpy as np
import pytest
from analysis_testkit import FAST_ABLATIONS, VOCAB, make_examples, tiny_model
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.layers import layer_summaries, layers_of, mean_of_ratios_ci
from attnstudy.analysis.suite import run_suite


def _suite(heads: str):
    cfg = AblationConfig(
        n_permutations=8,
        n_random_orders=2,
        bootstrap_resamples=60,
        seed=5,
        ablations=FAST_ABLATIONS,
        layers="each",
        heads=heads,
    )
    model = tiny_model("multihead", "transformer")
    return cfg, run_suite(model, make_examples(), VOCAB, VOCAB, cfg, progress=False, batch_size=4)


@pytest.fixture(scope="module")
def transformer_suite():
    return _suite("all")


def test_rows_of_single_heads_are_never_summed_into_a_layer():
    cfg, res = _suite("each")
    assert set(res.table["head"]) == {-1, 0, 1}
    # only the top layer is analysed with all heads jointly too (the plain keys' unit)
    assert layers_of(res.table) == [1]
    names = [n for n in cfg.ablations if n not in res.skipped]
    per = layer_summaries(res.table, names, cfg, cfg.prefix)
    assert set(per) == {1}
    flip = "ablation/permutation/flip_rate"
    assert per[1][flip] == pytest.approx(res.summary[flip], abs=1e-12)
    assert res.summary[flip] == res.summary["ablation/layer1/permutation/flip_rate"]


def test_layer_summaries_equal_the_suites_per_unit_metrics(transformer_suite):
    cfg, res = transformer_suite
    assert set(res.table["head"]) == {-1}
    assert layers_of(res.table) == [0, 1]
    names = [n for n in cfg.ablations if n not in res.skipped]
    per = layer_summaries(res.table, names, cfg, cfg.prefix)
    assert set(per) == {0, 1, "mean"}
    checked = 0
    for layer in (0, 1):
        for key, value in per[layer].items():
            suite_key = key.replace("ablation/", f"ablation/layer{layer}/", 1)
            if suite_key in res.summary:
                assert value == pytest.approx(res.summary[suite_key], abs=1e-12), key
                checked += 1
    assert checked > 20
    flip = "ablation/permutation/flip_rate"
    assert per["mean"][flip] == pytest.approx((per[0][flip] + per[1][flip]) / 2)
    assert per["mean"][f"{flip}_ci_low"] <= per["mean"][flip] <= per["mean"][f"{flip}_ci_high"]


def test_mean_of_ratios_ci_against_a_plain_loop():
    rng = np.random.default_rng(0)
    n = 30
    arrays = []
    for _ in range(2):
        den = rng.integers(1, 6, n).astype(float)
        arrays += [rng.uniform(0, 1, n) * den, den]
    cfg = AblationConfig(bootstrap_resamples=2000, seed=1)
    value, low, high = mean_of_ratios_ci(arrays, cfg)
    plain = np.mean([arrays[i].sum() / arrays[i + 1].sum() for i in (0, 2)])
    assert value == pytest.approx(plain)
    # a plain resampling loop over examples, paired across layers: the same interval to ±0.01
    boot = []
    loop_rng = np.random.default_rng(7)
    for _ in range(2000):
        idx = loop_rng.integers(0, n, n)
        boot.append(np.mean([arrays[i][idx].sum() / arrays[i + 1][idx].sum() for i in (0, 2)]))
    assert low == pytest.approx(np.percentile(boot, 2.5), abs=0.01)
    assert high == pytest.approx(np.percentile(boot, 97.5), abs=0.01)
    one = mean_of_ratios_ci([a[:1] for a in arrays], cfg)
    assert math.isnan(one[1]) and math.isnan(one[2])


def test_examples_undefined_in_every_layer_are_left_out_like_the_suite():
    cfg = AblationConfig(bootstrap_resamples=500, seed=2)
    num, den = np.array([1.0, 2.0, 0.0, 3.0]), np.array([2.0, 4.0, 0.0, 4.0])
    with_empty = mean_of_ratios_ci([num, den, num, den], cfg)
    without = mean_of_ratios_ci([num[[0, 1, 3]], den[[0, 1, 3]]] * 2, cfg)
    assert with_empty == pytest.approx(without)
    assert all(math.isfinite(v) for v in with_empty)
