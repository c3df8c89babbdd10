"""Data for attention heatmaps: a few examples' attention beside their best adversarial attention."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import Seq2Seq

from .ablations.adversarial import adversarial_rows, search_adversarial
from .batch import AblationContext, prepare_batches
from .catalogue import AblationConfig


def pick_examples(
    examples: Sequence[Example], n: int = 2, min_len: int = 4, max_len: int = 12
) -> list[Example]:
    """The first ``n`` examples whose source length lies in [min_len, max_len] (else the first ``n``)."""
    fitting = [ex for ex in examples if min_len <= len(ex.src) <= max_len]
    return (fitting or list(examples))[:n]


def heatmap_data(
    model: Seq2Seq,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    cfg: AblationConfig,
    n: int = 2,
) -> list[dict]:
    """JSON-ready heatmap records for :func:`attnstudy.analysis.figures.attention_heatmaps`.

    Uses the reference prefix, so gold links (if the task has them) index the drawn target.

    Returns:
        list of dicts: ``title`` (example id), ``source``, ``target`` (tokens, ``<eos>`` last),
        ``attention`` and ``adversarial`` (T_y × T_x lists; adversarial rows null where no
        candidate within ε_eval was found), ``gold`` (list of [source, target] links).
        Empty for a model without attention.
    """
    if not model.has_attention:
        return []
    chosen = pick_examples(examples, n)
    out = []
    for batch in prepare_batches(
        model, chosen, src_vocab, tgt_vocab, prefix="reference", batch_size=len(chosen)
    ):
        result = search_adversarial(
            model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg)
        )
        for i, ex in enumerate(batch.examples):
            rows = adversarial_rows(batch, result, i)
            n_steps = rows["original"].shape[0]
            target = [tgt_vocab.itos[j] for j in batch.trace.tgt_out[i, :n_steps].tolist()]
            adv = [
                None if np.isnan(r).all() else [round(float(v), 4) for v in r]
                for r in rows["adversarial"]
            ]
            gold = sorted(ex.alignment.possible) if ex.alignment is not None else []
            out.append(
                {
                    "title": ex.id,
                    "source": list(ex.src),
                    "target": target,
                    "attention": [[round(float(v), 4) for v in r] for r in rows["original"]],
                    "adversarial": adv if any(r is not None for r in adv) else None,
                    "gold": [list(link) for link in gold],
                }
            )
    return out
