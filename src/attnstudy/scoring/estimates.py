"""The one bootstrap behind every interval attnstudy reports: a 95 % percentile bootstrap
(:func:`scipy.stats.bootstrap`, ``method="percentile"``, seeded by a
:func:`numpy.random.default_rng`), resampling examples (or segments, or sentences) and never
steps.

* :func:`bootstrap_ci`: the interval of any vectorised statistic of paired samples.
* :func:`ratio_ci`: Σ num / Σ den over examples with its interval (the battery's statistics,
  the layer mean's parts, the reference aligner's AER, precision and recall); examples with
  den = 0 are left out.

Resamples are drawn :func:`batch_size` at a time, so memory stays bounded by
:data:`BOOTSTRAP_ELEMENTS` whatever the number of examples; the batch does not change the numbers
(scipy draws each batch's indices from the same generator in turn).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

BOOTSTRAP_ELEMENTS = 1_000_000
"""Resample indices drawn per call of the statistic: a bound on the bootstrap's memory (8 MB of
indices, and each resampled array as large)."""

CONFIDENCE = 0.95


def batch_size(resamples: int, n: int, arrays: int = 1) -> int:
    """Resamples per batch: at most :data:`BOOTSTRAP_ELEMENTS` resampled elements of ``arrays``
    arrays of ``n`` examples (at least one resample, at most all)."""
    return max(1, min(resamples, BOOTSTRAP_ELEMENTS // max(1, n * arrays)))


def bootstrap_ci(
    samples: Sequence[np.ndarray],
    statistic: Callable[..., np.ndarray],
    *,
    resamples: int,
    seed: int,
    batch: int | None = None,
) -> tuple[float, float]:
    """The 95 % percentile bootstrap interval of ``statistic`` over paired ``samples``.

    Args:
        samples: arrays of one length n ≥ 2, resampled together (the same indices for each).
        statistic: ``statistic(*resampled, axis=-1)``, vectorised over the leading axes.
        resamples: bootstrap resamples.
        seed: the generator's seed.
        batch: resamples per call of ``statistic`` (default: :func:`batch_size`); the numbers
            do not depend on it.

    Returns:
        (low, high).
    """
    from scipy import stats

    n = len(samples[0])
    res = stats.bootstrap(
        tuple(samples),
        statistic,
        paired=True,
        vectorized=True,
        n_resamples=resamples,
        method="percentile",
        confidence_level=CONFIDENCE,
        rng=np.random.default_rng(seed),
        batch=batch or batch_size(resamples, n, len(samples)),
    )
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def ratio_ci(
    num: np.ndarray,
    den: np.ndarray,
    *,
    resamples: int,
    seed: int,
    transform: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[float, float, float] | None:
    """Σ num / Σ den over examples with its 95 % percentile bootstrap interval, resampling
    examples (:func:`bootstrap_ci`).

    Args:
        num, den: per-example sums, shape (n_examples,); examples with den = 0 are left out.
        resamples, seed: the bootstrap's.
        transform: a map applied to the ratio (e.g. ``1 − r`` for AER).

    Returns:
        (value, low, high); the interval is (nan, nan) with fewer than two contributing examples;
        None where Σ den = 0 (undefined).
    """
    num, den = np.asarray(num, float), np.asarray(den, float)
    keep = den > 0
    n, d = num[keep], den[keep]
    if len(n) == 0:
        return None
    f = transform or (lambda r: r)
    value = float(f(np.asarray(n.sum() / d.sum())))
    if len(n) < 2:
        return value, math.nan, math.nan
    low, high = bootstrap_ci(
        (n, d),
        lambda a, b, axis: f(a.sum(axis) / b.sum(axis)),
        resamples=resamples,
        seed=seed,
        batch=batch_size(resamples, len(n)),
    )
    return value, low, high
