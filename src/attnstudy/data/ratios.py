"""Ratios of corpus sums with a bootstrap interval over sentences: the aligners' AER, precision
and recall (:mod:`attnstudy.data.eflomal`) and their breakdowns (:mod:`attnstudy.data.breakdowns`)
in the data layer, by the method of the battery's ``attnstudy.analysis.suite.ratio_ci``."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    """A corpus statistic with its 95 % percentile bootstrap interval (verses resampled)."""

    value: float
    low: float
    high: float


def ratio_estimate(
    num, den, *, complement: bool = False, resamples: int = 1000, seed: int = 0
) -> Estimate:
    """Σ num / Σ den over sentences (or 1 − that, ``complement``) with a 95 % percentile bootstrap
    interval resampling sentences (:func:`scipy.stats.bootstrap`, paired, seeded by ``seed``: the
    method of the battery's ``attnstudy.analysis.suite.ratio_ci``, which this data layer may not
    import). Sentences with ``den`` = 0 are left out.

    Args:
        num, den: per-sentence sums, shape (n_sentences,).
        complement: report 1 − Σ num / Σ den (AER from 2|A∩S| / (|A| + |S|)).
        resamples, seed: of the bootstrap.

    Returns:
        The :class:`Estimate`; all NaN where no sentence has ``den`` > 0, the interval NaN with
        fewer than two.
    """
    import numpy as np
    from scipy import stats

    num, den = np.asarray(num, float), np.asarray(den, float)
    keep = den > 0
    n, d = num[keep], den[keep]
    if not len(n):
        return Estimate(math.nan, math.nan, math.nan)

    def ratio(a, b, axis=-1):
        r = a.sum(axis) / b.sum(axis)
        return 1.0 - r if complement else r

    value = float(ratio(n, d))
    if len(n) < 2:
        return Estimate(value, math.nan, math.nan)
    res = stats.bootstrap(
        (n, d),
        ratio,
        paired=True,
        vectorized=True,
        n_resamples=resamples,
        method="percentile",
        confidence_level=0.95,
        rng=np.random.default_rng(seed),
    )
    ci = res.confidence_interval
    return Estimate(value, float(ci.low), float(ci.high))


def cell(e: Estimate) -> str:
    """An estimate as a result table's cell: ``value [low, high]`` to three significant digits
    (:meth:`attnstudy.findings.Estimate.fmt`, as the report writes it), the value alone without
    an interval, ``undefined`` for NaN."""
    from attnstudy.findings import Estimate as Shown

    return Shown(e.value, e.low, e.high).fmt(3) if math.isfinite(e.value) else "undefined"
