"""Attention variance across training seeds (Wiegreffe & Pinter 2019, "Attention is not not
Explanation", §3.2 / Fig. 3): models trained with the same configuration and different seeds
give similar outputs; do they give similar attention? Per step and pair of seeds: JSD between
the two attention rows (head mean) against TVD between the two output distributions. Always on
the reference prefix, so both models are scored on the same steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import pandas as pd
from torch import nn

from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import Seq2Seq

from ._chunks import step_frame
from .batch import prepare_batches
from .divergences import jsd, tvd
from .errors import NoAttentionError


def pair_divergences(
    models: Sequence[nn.Module],
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    labels: Sequence | None = None,
    batch_size: int = 32,
    layer: int | str = -1,
) -> pd.DataFrame:
    """Attention JSD and output TVD between every pair of models, per decoder step of the
    reference prefix (the computation behind the seed variance and the model-consistent
    adversary).

    Args:
        models: ≥ 2 models with attention, sharing the vocabularies; each runs in eval mode and
            gets its previous mode back.
        examples: the examples (reference prefix).
        src_vocab, tgt_vocab: the shared vocabularies.
        labels: one label per model (default 0 … n−1).
        batch_size: examples per batch (memory stays flat: one batch per model at a time).
        layer: the cross-attention layer compared (default the last).

    Returns:
        One row per real step × pair: ``example_id``, ``step``, ``a``, ``b`` (labels),
        ``attention_jsd`` (JSD of the head-mean rows, nats, ≤ ln 2), ``output_tvd`` (TVD over
        the full vocabulary), ``argmax_differs`` (bool).

    Raises:
        ValueError: fewer than two models or a label per model missing.
        NoAttentionError: a model without attention.
    """
    if len(models) < 2:
        raise ValueError(f"a comparison needs at least two models, got {len(models)}")
    labels = list(range(len(models))) if labels is None else list(labels)
    if len(labels) != len(models):
        raise ValueError(f"got {len(labels)} labels for {len(models)} models")
    for s, m in zip(labels, models):
        if not m.has_attention:
            raise NoAttentionError(f"the comparison needs attention; the model {s} has none")
    parts = []
    examples = list(examples)
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        batches = [
            next(
                prepare_batches(
                    m, chunk, src_vocab, tgt_vocab, "reference", len(chunk), layer=layer
                )
            )
            for m in models
        ]
        frame, b_idx, t_idx = step_frame(batches[0])
        att = [b.trace.attention.mean(1)[b_idx, t_idx] for b in batches]
        probs = [b.probs[b_idx, t_idx] for b in batches]
        for i, j in combinations(range(len(models)), 2):
            part = frame.copy()
            part["a"], part["b"] = labels[i], labels[j]
            part["attention_jsd"] = jsd(att[i], att[j]).double().cpu().numpy()
            part["output_tvd"] = tvd(probs[i], probs[j]).double().cpu().numpy()
            part["argmax_differs"] = (probs[i].argmax(-1) != probs[j].argmax(-1)).cpu().numpy()
            parts.append(part)
    return pd.concat(parts, ignore_index=True)


def seed_variance(
    models: Sequence[Seq2Seq],
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    seeds: Sequence[int] | None = None,
    batch_size: int = 32,
) -> pd.DataFrame:
    """Attention JSD vs output TVD between every pair of seeds, per decoder step.

    Args:
        models: ≥ 2 models of the same configuration (and vocabularies), different seeds;
            each runs in eval mode and gets its previous mode back.
        examples: the examples (reference prefix).
        src_vocab, tgt_vocab: the shared vocabularies.
        seeds: labels of the models (default 0 … n−1).
        batch_size: examples per batch (memory stays flat: one batch per model at a time).

    Returns:
        One row per real step × seed pair: ``example_id``, ``step``, ``seed_a``, ``seed_b``,
        ``seed_variance_attention_jsd`` (JSD of the head-mean rows, nats, ≤ ln 2),
        ``seed_variance_output_tvd`` (TVD over the full vocabulary),
        ``seed_variance_argmax_differs`` (bool).

    Raises:
        ValueError: fewer than two models or a seed label per model missing.
        NoAttentionError: a model without attention.
    """
    table = pair_divergences(models, examples, src_vocab, tgt_vocab, seeds, batch_size)
    return table.rename(
        columns={
            "a": "seed_a",
            "b": "seed_b",
            "attention_jsd": "seed_variance_attention_jsd",
            "output_tvd": "seed_variance_output_tvd",
            "argmax_differs": "seed_variance_argmax_differs",
        }
    )
