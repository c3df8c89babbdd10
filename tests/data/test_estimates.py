"""One bootstrap behind every interval (attnstudy.scoring.estimates): scipy's percentile bootstrap
itself,
the ratio estimate the battery, the layer mean and the reference aligner share, and the
translation metrics' interval on the same resamples."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from attnstudy.scoring import estimates


def _scipy_ci(samples, statistic, resamples, seed):
    res = stats.bootstrap(
        samples,
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=resamples,
        method="percentile",
        confidence_level=0.95,
        rng=np.random.default_rng(seed),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


@pytest.mark.parametrize("n, resamples, seed", [(2, 50, 0), (37, 999, 3), (500, 1000, 11)])
def test_bootstrap_ci_is_scipys_percentile_bootstrap(n, resamples, seed):
    rng = np.random.default_rng(n)
    num, den = rng.random(n), rng.integers(1, 5, n).astype(float)

    def ratio(a, b, axis=-1):
        return a.sum(axis) / b.sum(axis)

    got = estimates.bootstrap_ci((num, den), ratio, resamples=resamples, seed=seed)
    assert got == _scipy_ci((num, den), ratio, resamples, seed)
    # in bounded batches: the same numbers
    assert estimates.bootstrap_ci((num, den), ratio, resamples=resamples, seed=seed, batch=7) == got


def test_ratio_ci_leaves_out_empty_examples_and_says_when_undefined():
    num, den = np.array([1.0, 2.0, 5.0, 3.0]), np.array([2.0, 0.0, 5.0, 4.0])
    value, low, high = estimates.ratio_ci(num, den, resamples=200, seed=1)
    assert value == pytest.approx(9 / 11)
    keep = den > 0
    assert (low, high) == _scipy_ci(
        (num[keep], den[keep]), lambda a, b, axis: a.sum(axis) / b.sum(axis), 200, 1
    )
    aer = estimates.ratio_ci(num, den, resamples=200, seed=1, transform=lambda r: 1.0 - r)
    assert aer[0] == pytest.approx(2 / 11) and aer[1] == pytest.approx(1 - high)
    assert estimates.ratio_ci(num, np.zeros(4), resamples=200, seed=1) is None
    one = estimates.ratio_ci(np.array([1.0, 7.0]), np.array([2.0, 0.0]), resamples=200, seed=1)
    assert one[0] == 0.5 and math.isnan(one[1]) and math.isnan(one[2])


def test_the_battery_the_layer_mean_and_the_aligner_use_it():
    from attnstudy.analysis import layers, suite
    from attnstudy.analysis.catalogue import AblationConfig

    from attnstudy.data import eflomal

    rng = np.random.default_rng(5)
    cfg = AblationConfig(bootstrap_resamples=300, seed=4)
    num, den = rng.random(40), rng.integers(0, 3, 40).astype(float)
    assert suite.ratio_ci(num, den, cfg) == estimates.ratio_ci(num, den, resamples=300, seed=4)
    arrays = [num, den, rng.random(40), rng.integers(1, 3, 40).astype(float)]
    value, low, high = layers.mean_of_ratios_ci(arrays, cfg)
    keep = (arrays[1] > 0) | (arrays[3] > 0)

    def mean(a, b, c, d, axis=-1):
        return (a.sum(axis) / b.sum(axis) + c.sum(axis) / d.sum(axis)) / 2

    with np.errstate(invalid="ignore", divide="ignore"):
        assert (low, high) == _scipy_ci(tuple(a[keep] for a in arrays), mean, 300, 4)
    hyps = [{(0, 0), (1, 1)}, {(0, 1)}, set(), {(2, 2), (0, 0)}]
    gold = [{(0, 0)}, {(0, 1), (1, 1)}, {(0, 0)}, {(2, 2)}]
    got = eflomal.score(hyps, gold, resamples=300, seed=2)
    hit = np.array([2 - 1, 1, 0, 1], float)  # |A∩S| per sentence
    n_hyp, n_sure = np.array([2, 1, 0, 2], float), np.array([1, 2, 1, 1], float)
    assert got["precision"] == eflomal.Estimate(
        *estimates.ratio_ci(hit, n_hyp, resamples=300, seed=2)
    )
    assert got["aer"] == eflomal.Estimate(
        *estimates.ratio_ci(
            2 * hit, n_hyp + n_sure, resamples=300, seed=2, transform=lambda r: 1.0 - r
        )
    )


def test_translation_intervals_are_scipys_on_the_same_resamples():
    """BLEU's interval is scipy's percentile bootstrap of the resamples' scores; the hand-written
    bootstrap it replaced (numpy draws, np.percentile at 2.5/97.5) differs from it only in the
    last bits (scipy's lower percentile is at 2.5000000000000022)."""
    sacrebleu = pytest.importorskip("sacrebleu")
    from attnstudy.scoring import translation

    hyps = ["the light shines", "in him was life", "he was with god", "all things were made"]
    refs = ["the light shines in the dark", "in him was life", "he was with god", "all things"]
    _, low, high = translation.corpus_score("bleu", hyps, refs, resamples=200, seed=9)
    draws = np.random.default_rng(9).integers(0, len(hyps), size=(200, len(hyps)))
    direct = [
        sacrebleu.corpus_bleu([hyps[i] for i in d], [[refs[i] for i in d]]).score for d in draws
    ]
    by_hand = np.percentile(direct, [2.5, 97.5])
    assert (low, high) == pytest.approx(tuple(by_hand), abs=1e-9)

    def rescored(idx, axis=-1):  # sacrebleu rescoring each resample's texts
        return np.apply_along_axis(
            lambda d: sacrebleu.corpus_bleu([hyps[i] for i in d], [[refs[i] for i in d]]).score,
            -1,
            idx,
        )

    scipys = _scipy_ci((np.arange(len(hyps)),), rescored, 200, 9)
    assert (low, high) == pytest.approx(scipys, abs=1e-9)
