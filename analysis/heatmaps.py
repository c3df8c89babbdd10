"""Per-example matrices for heatmaps and the example browser: attention (every layer, every head),
the best adversarial attention, gradient × input and leave-one-out importance on the analysis
prefix, and the attention over the reference with its gold links.

They are recorded *while the suite runs* (:class:`Recorder`, passed to
:func:`attnstudy.analysis.suite.run_suite`): the suite's own batches, and the adversarial search
and importance vectors its ablations computed, so the matrices are exactly those behind the
per-step table's numbers and cost no second search. :data:`CAPTURE` holds, per ablation, a function
that returns the ablation's table *and* what it computed on the way; each is its ablation's ``run``
written out (``table(batch, compute(...))``), and a test checks that its table equals ``run``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import ALL

from .batch import AblationContext, PreparedBatch, prepare_batches, table_index
from .catalogue import AblationConfig

DIGITS = 3
"""Decimals kept in the JSON (attention weights to 0.001; a browser page of 200 examples stays
well under a megabyte or two)."""
MAX_RECORDS = 1000
"""Examples recorded at most (the browser of a larger analysis lists the first ones)."""


def _adversarial(model, batch, params, ctx):
    from .ablations.adversarial import adversarial_table, search_adversarial

    result = search_adversarial(model, batch, params, ctx)
    return adversarial_table(batch, result), result


def _importance(model, batch, params, ctx):
    from .ablations.importance import importance_table, importance_vectors

    vectors = importance_vectors(model, batch, ctx.chunk_rows)
    return importance_table(batch, vectors), vectors


CAPTURE = {"adversarial": _adversarial, "importance": _importance}
"""Ablation → ``fn(model, batch, params, ctx) -> (its per-step table, what it computed)``: the
ablation's ``run`` (``adversarial_table(batch, search_adversarial(…))``,
``importance_table(batch, importance_vectors(…))``) keeping its intermediate result."""


def _r(x) -> float | None:
    v = float(x)
    return round(v, DIGITS) if np.isfinite(v) else None


def _matrix(m: np.ndarray) -> list[list[float | None]]:
    return [[_r(v) for v in row] for row in m]


def gold_cells(ex) -> list[list]:
    """An example's gold links as heatmap cells ``[source token, target token, sure]``: the links
    themselves, or, for subword tokens (``ex.src_words``/``ex.tgt_words``), every (source subword,
    target subword) cell of each linked word pair."""
    links = [
        ((s, j), (s, j) in ex.alignment.sure) for s, j in ex.alignment.possible | ex.alignment.sure
    ]
    if not ex.tgt_words:
        return sorted([s, j, sure] for (s, j), sure in links)
    src_of: dict[int, list[int]] = {}
    tgt_of: dict[int, list[int]] = {}
    for i, w in enumerate(ex.src_words):
        src_of.setdefault(w, []).append(i)
    for j, w in enumerate(ex.tgt_words):
        tgt_of.setdefault(w, []).append(j)
    return sorted(
        [i, j, sure] for (s, t), sure in links for i in src_of.get(s, []) for j in tgt_of.get(t, [])
    )


class Recorder:
    """Collects :func:`example_records`-style records from the suite's batches.

    Args:
        analysis_prefix: the suite's prefix (``greedy`` or ``reference``): its batches give the
            main record, reference batches the reference attention and gold links.
        max_records: examples recorded at most.
    """

    capture = CAPTURE

    def __init__(self, analysis_prefix: str, max_records: int = MAX_RECORDS):
        self.prefix = analysis_prefix
        self.max_records = max_records
        self.records: dict[str, dict] = {}
        self._reference: dict[str, dict] = {}

    def add(self, batch: PreparedBatch, captured: dict) -> None:
        """Record a batch the suite analysed, with what its ablations computed (``captured``:
        ablation name → the second value of its :data:`CAPTURE` function)."""
        if batch.trace.attention is None:
            return
        tr = batch.trace
        for i, ex in enumerate(batch.examples):
            if batch.prefix == self.prefix and (
                ex.id in self.records or len(self.records) < self.max_records
            ):
                self.records[ex.id] = _record(
                    batch, i, ex, captured.get("adversarial"), captured.get("importance")
                )
            if batch.prefix == "reference" and ex.alignment is not None:
                n = int(tr.src_lengths[i])
                steps = tr.step_mask[i].nonzero()[:, 0]
                self._reference[ex.id] = {
                    "reference_rows": [
                        batch.tgt_vocab.itos[j] for j in tr.tgt_out[i, steps].tolist()
                    ],
                    "reference_attention": _matrix(tr.attention[i][:, steps, :n].mean(0).numpy()),
                    "gold": gold_cells(ex),
                }

    def result(self) -> list[dict]:
        """The records, in the order the examples were analysed."""
        return [rec | self._reference.get(eid, {}) for eid, rec in self.records.items()]


def example_records(
    model,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    cfg: AblationConfig,
    batch_size: int = 32,
) -> list[dict]:
    """The records of :class:`Recorder` without running the suite (the same batches, seed and
    parameters; the adversarial search runs if ``adversarial`` is in ``cfg.ablations``, the
    importance vectors if ``importance`` is, the reference attention if ``alignment`` is).

    Args:
        model: the model (see :mod:`attnstudy.analysis.contract`); eval mode during the call.
        examples: the analysed examples, in order.
        src_vocab, tgt_vocab: the model's vocabularies.
        cfg: the suite's config (prefix, seed, ablations and their parameters).
        batch_size: examples per batch.

    Returns:
        One dict per example: ``id``, ``source`` (T_x tokens), ``reference`` (tokens), ``prefix``
        (``greedy``: the model's own output, or ``reference``), ``rows`` (the T prefix tokens
        analysed, ``<eos>`` last) at positions ``steps`` (the table's ``step``), ``p`` (T,: the model's probability of each row's token),
        ``layer`` (the analysed layer), ``attention`` (L × T × T_x head-mean cross-attention of
        every layer), ``heads`` (L × H × T × T_x, only when H > 1), ``adversarial`` (T × T_x, the
        kept candidate with the largest JSD, a null row where none was found within ε_eval;
        absent if not run), ``adversarial_jsd`` (T,), ``gradient`` and ``loo`` (T × T_x,
        |gradient × input| in nats and leave-one-out TVD; absent if not run), and with gold
        links ``reference_rows``/``reference_attention`` (T_ref, T_ref × T_x, analysed layer) and
        ``gold`` (``[source, target, sure]``). Values rounded to :data:`DIGITS` decimals; an empty
        list for a model without attention.
    """
    if not getattr(model, "has_attention", False):
        return []
    from .contract import capabilities

    caps = capabilities(model)
    ctx = AblationContext.of(cfg)
    rec = Recorder(cfg.prefix, max_records=len(examples))
    needs = {"adversarial": "local", "importance": "gradients"}
    for batch in prepare_batches(model, examples, src_vocab, tgt_vocab, cfg.prefix, batch_size):
        captured = {
            name: fn(model, batch, cfg.params_for(name), ctx)[1]
            for name, fn in CAPTURE.items()
            if name in cfg.ablations and needs[name] in caps
        }
        rec.add(batch, captured)
    if "alignment" in cfg.ablations:
        gold = [ex for ex in examples if ex.alignment is not None]
        if gold:
            for batch in prepare_batches(
                model, gold, src_vocab, tgt_vocab, "reference", batch_size
            ):
                rec.add(batch, {})
    return rec.result()


def _record(batch: PreparedBatch, i: int, ex: Example, adv, imp) -> dict:
    tr = batch.trace
    n = int(tr.src_lengths[i])
    steps = tr.step_mask[i].nonzero()[:, 0]  # real steps (a predicted <pad> is not one)
    ids = tr.tgt_out[i, steps]
    probs = torch.softmax(tr.logits[i, steps].double(), -1).gather(-1, ids[:, None])[:, 0]
    layers = tr.cross_attention[i][:, :, steps, :n]  # (L, H, T, n)
    rec: dict = {
        "id": ex.id,
        "source": list(ex.src),
        "reference": list(ex.tgt),
        "prefix": batch.prefix,
        "steps": steps.tolist(),
        "rows": [batch.tgt_vocab.itos[j] for j in ids.tolist()],
        "p": [_r(v) for v in probs.tolist()],
        # the analysed unit as the tables write it (−1: all layers at once / all heads jointly)
        "layer": table_index(getattr(tr, "layer", 0)),
        "head": table_index(getattr(tr, "head", ALL)),
        "attention": [_matrix(layer.mean(0).numpy()) for layer in layers],
    }
    if layers.size(1) > 1:
        rec["heads"] = [[_matrix(h.numpy()) for h in layer] for layer in layers]
    if adv is not None:
        row_of = {t: r for r, t in enumerate(steps.tolist())}
        rows: list = [None] * len(steps)
        jsd: list = [None] * len(steps)
        for r, (b, t) in enumerate(zip(adv.b_idx.tolist(), adv.t_idx.tolist())):
            k = int(adv.best[r])
            if b != i or k < 0 or t not in row_of:
                continue
            # the best kept candidate, head mean (what the table's JSD is measured on)
            rows[row_of[t]] = [_r(v) for v in adv.candidates[r, k, :, :n].mean(0).tolist()]
            jsd[row_of[t]] = _r(adv.jsd[r, k])
        rec["adversarial"], rec["adversarial_jsd"] = rows, jsd
    if imp is not None:
        rec["gradient"] = _matrix(imp.gradient[i, steps, :n].numpy())
        rec["loo"] = _matrix(imp.loo[i, steps, :n].numpy())
    return rec
