"""Ratios of corpus sums with a bootstrap interval over sentences: the aligners' AER, precision
and recall (:mod:`attnstudy.data.eflomal`) and their breakdowns (:mod:`attnstudy.data.breakdowns`)
in the data layer, through the one bootstrap of :mod:`attnstudy.scoring.estimates`."""

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
    interval resampling sentences (:func:`attnstudy.scoring.estimates.ratio_ci`, the one bootstrap
    behind
    every interval). Sentences with ``den`` = 0 are left out.

    Args:
        num, den: per-sentence sums, shape (n_sentences,).
        complement: report 1 − Σ num / Σ den (AER from 2|A∩S| / (|A| + |S|)).
        resamples, seed: of the bootstrap.

    Returns:
        The :class:`Estimate`; all NaN where no sentence has ``den`` > 0, the interval NaN with
        fewer than two.
    """
    from attnstudy.scoring.estimates import ratio_ci

    r = ratio_ci(
        num,
        den,
        resamples=resamples,
        seed=seed,
        transform=(lambda x: 1.0 - x) if complement else None,
    )
    return Estimate(math.nan, math.nan, math.nan) if r is None else Estimate(*r)


def cell(e: Estimate) -> str:
    """An estimate as a result table's cell: ``value [low, high]`` to three significant digits
    (:meth:`attnstudy.verdict.findings.Estimate.fmt`, as the report writes it), the value alone
    without
    an interval, ``undefined`` for NaN."""
    from attnstudy.verdict.findings import Estimate as Shown

    return Shown(e.value, e.low, e.high).fmt(3) if math.isfinite(e.value) else "undefined"
