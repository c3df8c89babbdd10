"""Translation metrics: BLEU (Papineni et al. 2002) and chrF (Popović 2015) of a model's test
translations, scored by sacrebleu 2.6.0 on detokenised text, each with a 95 % percentile bootstrap
interval resampling test examples (verses).

Which tasks get them is the task registry's word (:class:`attnstudy.data.tasks.TaskSpec`): a
task whose ``translation_texts`` is set lists the metrics of :data:`attnstudy.data.tasks.
TRANSLATION_METRICS` it reports among its ``metrics`` and turns hypotheses and examples into
text (for ``nt-greek-english``: subwords joined into words, English punctuation kept, spacing by
the BSB's ``skip_space_after``; :func:`attnstudy.data.nt.translation_texts`). Every other task
gets none.

The bootstrap is the one of every interval (:func:`attnstudy.scoring.estimates.bootstrap_ci`,
scipy's
percentile bootstrap): the per-verse sufficient statistics sacrebleu computes for its own corpus
score (n-gram matches and lengths for BLEU, character n-gram matches for chrF) are summed over
:data:`RESAMPLES` resamples of the verses drawn with replacement (seed :data:`SEED`), each
resample scored by sacrebleu from its summed statistics, and the 2.5th and 97.5th percentiles are
the interval (sacrebleu's own ``n_bootstrap`` reports a symmetric half-width around the
resamples' mean instead, seeded through an environment variable).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnstudy.config import DataConfig
from attnstudy.data.tasks import TRANSLATION_METRICS, get_task
from attnstudy.data.types import DataError, Example
from attnstudy.scoring.estimates import bootstrap_ci

RESAMPLES = 1000
"""Bootstrap resamples of the test verses."""
SEED = 0
"""Seed of the bootstrap's generator (numpy ``default_rng``)."""
INSTALL = "run: make test-deps (or: pip install sacrebleu==2.6.0, the [nt] extra)"


class TranslationMetricError(DataError):
    """sacrebleu is missing; the message says what to install (a data error: the task cannot be
    scored with certainty, exit code 2)."""


def _metric(name: str):
    """A sacrebleu metric object with its defaults: ``bleu`` (13a tokenisation, 4-grams,
    exponential smoothing) or ``chrf`` (character 6-grams, β = 2, no word n-grams)."""
    try:
        from sacrebleu.metrics import BLEU, CHRF
    except ImportError:
        raise TranslationMetricError(
            f"BLEU and chrF need the sacrebleu package; {INSTALL}"
        ) from None
    return BLEU() if name == "bleu" else CHRF()


def check_installed(data: DataConfig) -> None:
    """Before training: a translation task needs sacrebleu for its test metrics.

    Raises:
        TranslationMetricError: the task's registry entry asks for BLEU/chrF and sacrebleu is
            not installed (the message says what to install).
    """
    task = get_task(data.task)
    if task.translation_texts is not None and any(m in TRANSLATION_METRICS for m in task.metrics):
        _metric("chrf")


def corpus_score(
    name: str,
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """Corpus BLEU or chrF of detokenised hypotheses against one reference each, with a 95 %
    percentile bootstrap interval over segments (verses).

    Args:
        name: ``"bleu"`` or ``"chrf"``.
        hypotheses, references: one detokenised text per segment, aligned.
        resamples: bootstrap resamples (0: no interval, NaN bounds).
        seed: the bootstrap generator's seed.

    Returns:
        (score, low, high), on sacrebleu's scale (0–100); the score is sacrebleu's
        ``corpus_score`` itself.

    Raises:
        ValueError: different numbers of hypotheses and references, or none.
        TranslationMetricError: sacrebleu is not installed.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"got {len(hypotheses)} hypotheses for {len(references)} references")
    if not hypotheses:
        raise ValueError("no segments to score")
    metric = _metric(name)
    hyps, refs = list(hypotheses), [list(references)]
    score = float(metric.corpus_score(hyps, refs).score)
    if resamples <= 0:
        return score, float("nan"), float("nan")
    # the per-segment statistics sacrebleu's own corpus score and bootstrap sum
    stats = np.asarray(metric._extract_corpus_statistics(hyps, refs), dtype=np.float64)
    n = len(stats)

    def resampled_scores(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        """Each resample of the segments (indices, last axis) scored from its summed statistics."""
        rows = np.asarray(idx).reshape(-1, n)
        counts = np.stack([np.bincount(row, minlength=n) for row in rows]).astype(np.float64)
        sums = counts @ stats  # (resamples, statistics)
        scores = np.array([metric._compute_score_from_stats(list(s)).score for s in sums])
        return scores.reshape(np.shape(idx)[:-1])

    if n < 2:  # every resample is the one segment
        one = float(resampled_scores(np.zeros(n, dtype=np.int64)))
        return score, one, one
    low, high = bootstrap_ci((np.arange(n),), resampled_scores, resamples=resamples, seed=seed)
    return score, low, high


def translation_scores(
    data: DataConfig,
    examples: Sequence[Example],
    hypotheses: Sequence[Sequence[str]],
    prefix: str,
) -> dict[str, float]:
    """The task's translation metrics of one decoding of ``examples``, as run metrics.

    Args:
        data: the run's data section (its task's registry entry says which metrics apply and how
            tokens become text).
        examples: the test examples.
        hypotheses: decoded tokens (no specials), one sequence per example.
        prefix: ``"test"`` (greedy) or ``"test_beam"``: the metrics of the registry entry whose
            key starts with ``prefix/`` are computed.

    Returns:
        ``{prefix}/bleu``, ``{prefix}/chrf`` … with ``_ci_low`` / ``_ci_high``; empty for a task
        that is not translation.

    Raises:
        TranslationMetricError: sacrebleu is not installed.
    """
    task = get_task(data.task)
    wanted = [
        m for m in task.metrics if m in TRANSLATION_METRICS and m.key.startswith(f"{prefix}/")
    ]
    if task.translation_texts is None or not wanted or not examples:
        return {}
    hyps, refs = task.translation_texts(data, examples, hypotheses)
    out: dict[str, float] = {}
    for m in wanted:
        score, low, high = corpus_score(m.key.split("/", 1)[1], hyps, refs)
        out |= {m.key: score, f"{m.key}_ci_low": low, f"{m.key}_ci_high": high}
    return out
