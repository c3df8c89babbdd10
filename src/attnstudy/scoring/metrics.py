"""Task metrics: exact match / WER, PER and token accuracy with multiple references.

G2P convention (e.g. Yao & Zweig 2015, "Sequence-to-Sequence Neural Net Models for
Grapheme-to-Phoneme Conversion"): a word is correct if the hypothesis equals ANY reference
pronunciation (WER = 1 − exact match); PER is the Levenshtein distance to the closest
reference, summed over words and divided by the summed length of those references.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import editdistance

from attnstudy.data.types import Example

DEFAULT_LENGTH_BUCKETS = (5, 10, 15, 20, 30, 50, 80)


def edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
    """Levenshtein distance between two token sequences (insert/delete/substitute = 1)."""
    return int(editdistance.eval(list(a), list(b)))


def closest_reference(
    hypothesis: Sequence[str], references: Sequence[Sequence[str]]
) -> tuple[tuple[str, ...], int]:
    """The reference at the smallest edit distance (ties → shorter, then earlier) and that distance.

    Raises:
        ValueError: if there is no reference.
    """
    if not references:
        raise ValueError("an example needs at least one reference")
    scored = [(edit_distance(hypothesis, r), len(r), k) for k, r in enumerate(references)]
    dist, _, k = min(scored)
    return tuple(references[k]), dist


def _check(hypotheses: Sequence[Sequence[str]], examples: Sequence[Example]) -> None:
    if len(hypotheses) != len(examples):
        raise ValueError(f"got {len(hypotheses)} hypotheses for {len(examples)} examples")


def evaluate(
    hypotheses: Sequence[Sequence[str]],
    examples: Sequence[Example],
    length_buckets: Sequence[int] = DEFAULT_LENGTH_BUCKETS,
    error_rate: str = "per",
) -> dict[str, float]:
    """Corpus-level task metrics.

    Args:
        hypotheses: decoded token sequences (no specials), one per example.
        examples: the examples, whose ``references`` are the acceptable outputs.
        length_buckets: ascending source-length boundaries b_0 < b_1 < …; buckets are
            ``[0, b_0)``, ``[b_0, b_1)``, …, ``[b_last, inf)``.
        error_rate: the name of the token error rate in the result, the task's
            (:attr:`attnstudy.data.tasks.TaskSpec.error_rate`: ``per`` for G2P,
            ``token_error_rate`` otherwise).

    Returns:
        ``exact_match`` (hypothesis equals any reference), ``wer`` (= 1 − exact_match),
        ``per`` or the ``error_rate`` name given (Σ distance to the closest reference / Σ its
        length), ``token_accuracy``
        (Σ position-wise matches with the closest reference / Σ its length), ``n`` (number
        of examples) and ``exact_match_len_{lo}_{hi}`` for every non-empty source-length
        bucket (``hi`` = ``inf`` for the last). All values are finite floats.

    Raises:
        ValueError: if the counts differ or there are no examples.
    """
    _check(hypotheses, examples)
    if not examples:
        raise ValueError("cannot evaluate zero examples")
    edges = sorted({0, *length_buckets})
    bucket_hits: dict[tuple[int, float], list[int]] = {}
    correct = errors = ref_tokens = matches = 0
    for hyp, ex in zip(hypotheses, examples):
        hyp = tuple(hyp)
        refs = [tuple(r) for r in ex.references]
        ok = hyp in refs
        ref, dist = closest_reference(hyp, refs)
        correct += ok
        errors += dist
        ref_tokens += len(ref)
        matches += sum(h == r for h, r in zip(hyp, ref))
        n_src = len(ex.src)
        lo = max(e for e in edges if e <= n_src)
        higher = [e for e in edges if e > lo]
        key = (lo, higher[0] if higher else float("inf"))
        bucket_hits.setdefault(key, []).append(int(ok))
    n = len(examples)
    out = {
        "exact_match": correct / n,
        "wer": 1.0 - correct / n,
        error_rate: errors / max(ref_tokens, 1),
        "token_accuracy": matches / max(ref_tokens, 1),
        "n": float(n),
    }
    for (lo, hi), hits in sorted(bucket_hits.items()):
        hi_name = "inf" if hi == float("inf") else str(int(hi))
        out[f"exact_match_len_{lo}_{hi_name}"] = sum(hits) / len(hits)
    return out


def per_example(
    hypotheses: Sequence[Sequence[str]], examples: Sequence[Example]
) -> list[dict[str, Any]]:
    """One row per example for the predictions table.

    Returns:
        Dicts with ``id``, ``source``, ``reference`` (the closest), ``hypothesis`` (tokens
        joined by spaces), ``correct`` (matches any reference), ``edit_distance`` (to
        the closest reference) and ``reference_length`` (its tokens: Σ edit_distance /
        Σ reference_length is the corpus PER).

    Raises:
        ValueError: if the counts differ.
    """
    _check(hypotheses, examples)
    rows = []
    for hyp, ex in zip(hypotheses, examples):
        hyp = tuple(hyp)
        refs = [tuple(r) for r in ex.references]
        ref, dist = closest_reference(hyp, refs)
        rows.append(
            {
                "id": ex.id,
                "source": " ".join(ex.src),
                "reference": " ".join(ref),
                "hypothesis": " ".join(hyp),
                "correct": hyp in refs,
                "edit_distance": dist,
                "reference_length": len(ref),
            }
        )
    return rows


def heldout_metrics(
    hyps: list[list[str]], test: list, is_heldout, error_rate: str = "per"
) -> dict[str, float]:
    """``test_heldin/*`` and ``test_heldout/*`` metrics when the test split mixes both (the dates task
    holds out locales/patterns; ``is_heldout`` is its registry entry's test, None for tasks without
    a held-out part); empty otherwise. Reuses the decoded ``hyps``; ``error_rate`` names the token
    error rate as in :func:`evaluate`."""
    if is_heldout is None:
        return {}
    held = [is_heldout(ex.id) for ex in test]
    if not any(held) or all(held):
        return {}
    out: dict[str, float] = {}
    for name, want in (("heldin", False), ("heldout", True)):
        idx = [i for i, h in enumerate(held) if h == want]
        metrics = evaluate([hyps[i] for i in idx], [test[i] for i in idx], error_rate=error_rate)
        out.update({f"test_{name}/{k}": v for k, v in metrics.items()})
    return out
