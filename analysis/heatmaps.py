"""Per-example matrices for heatmaps and the example browser: attention (every layer, every head),
the best adversarial attention, gradient × input and leave-one-out importance on the analysis
prefix, and the attention over the reference with its gold links. An example of subword tokens
(``Example.src_words`` / ``tgt_words``: the ``nt-greek-english`` task, a pretrained model's
tokenizer) also gets the attention maps over *words* (:func:`word_view`, :func:`reference_word_view`):
a source word's subword attention summed, a target word's subword rows averaged
(:func:`attnstudy.analysis.ablations.alignment.word_attention`, the alignment metric's rule), with
the gold links between words.

They are recorded *while the suite runs* (:class:`Recorder`, passed to
:func:`attnstudy.analysis.suite.run_suite`): the suite's own batches, and the adversarial search
and importance vectors its ablations computed, so the matrices are exactly those behind the
per-step table's numbers and cost no second search. An ablation that records maps declares them in
its catalogue entry (``captures=Capture(run, record, maps)``,
:class:`attnstudy.analysis.example_spec.Capture`): ``run`` returns the ablation's table *and* what
it computed on the way (its ``run`` written out, ``table(batch, compute(...))``; a test checks that
its table equals ``run``'s), ``record`` an example's maps from it. The adversarial search's and the
importance vectors' are here (:func:`capture_adversarial`, :func:`capture_importance`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from attnstudy.data.subwords import WORD_START, merge_subwords, subword_word_index
from attnstudy.data.types import Example
from attnstudy.data.vocab import BOS, EOS, PAD, Vocab
from attnstudy.models import ALL

from . import catalogue
from .batch import AblationContext, PreparedBatch, prepare_batches, table_index
from .catalogue import AblationConfig

DIGITS = 3
"""Decimals kept in the records (attention weights to 0.001); the example browser carries them
exactly, as integers in thousandths (:func:`attnstudy.pages.browser.encode_map`)."""
MAX_RECORDS = 1000
"""Examples recorded at most (the browser of a larger analysis lists the first ones)."""


def capture_adversarial(model, batch, params, ctx):
    """The adversarial ablation's ``run`` (``adversarial_table(batch, search_adversarial(…))``)
    keeping its search result: ``(table, result)``."""
    from .ablations.adversarial import adversarial_table, search_adversarial

    result = search_adversarial(model, batch, params, ctx)
    return adversarial_table(batch, result), result


def adversarial_maps(batch: PreparedBatch, i: int, steps: torch.Tensor, n: int, adv) -> dict:
    """Example ``i``'s ``adversarial`` map (T × n: the kept candidate with the largest JSD, head
    mean, what the table's JSD is measured on; a None row where none was found within ε_eval)
    and ``adversarial_jsd`` (T,)."""
    row_of = {t: r for r, t in enumerate(steps.tolist())}
    rows: list = [None] * len(steps)
    jsd: list = [None] * len(steps)
    for r, (b, t) in enumerate(zip(adv.b_idx.tolist(), adv.t_idx.tolist())):
        k = int(adv.best[r])
        if b != i or k < 0 or t not in row_of:
            continue
        rows[row_of[t]] = [_r(v) for v in adv.candidates[r, k, :, :n].mean(0).tolist()]
        jsd[row_of[t]] = _r(adv.jsd[r, k])
    return {"adversarial": rows, "adversarial_jsd": jsd}


def capture_importance(model, batch, params, ctx):
    """The importance ablation's ``run`` (``importance_table(batch, importance_vectors(…))``)
    keeping its vectors: ``(table, vectors)``."""
    from .ablations.importance import importance_table, importance_vectors

    vectors = importance_vectors(model, batch, ctx.chunk_rows, params.scores)
    return importance_table(batch, vectors), vectors


def importance_maps(batch: PreparedBatch, i: int, steps: torch.Tensor, n: int, imp) -> dict:
    """Example ``i``'s ``gradient`` (|gradient × input|, nats) and ``loo`` (leave-one-out TVD)
    maps, T × n."""
    return {
        "gradient": _matrix(imp.gradient[i, steps, :n].numpy()),
        "loo": _matrix(imp.loo[i, steps, :n].numpy()),
    }


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


NOT_WORDS = (PAD, BOS, EOS)
"""Tokens of a decoded sequence that belong to no word (``<unk>`` is part of the word it is in)."""


def output_word_index(tokens: Sequence[str]) -> list[int]:
    """The word of every token of a decoded sequence that has no word map (a model's own output,
    or text shown whole), −1 for :data:`NOT_WORDS`: grouped as
    :func:`attnstudy.data.subwords.merge_subwords` groups them where the tokens mark word starts
    with :data:`~attnstudy.data.subwords.WORD_START` (BPE of the ``nt-greek-english`` task, a
    SentencePiece tokenizer), one word per token where none does (words as tokens)."""
    kept = [t for t in tokens if t not in NOT_WORDS]
    marked = any(t.startswith(WORD_START) for t in kept)
    index = iter(subword_word_index(kept) if marked else range(len(kept)))
    return [-1 if t in NOT_WORDS else next(index) for t in tokens]


def word_labels(tokens: Sequence[str], words: Sequence[int]) -> list[str]:
    """The text of each word 0, 1, … of ``tokens`` (word index per token, −1: none): its tokens
    joined by :func:`attnstudy.data.subwords.merge_subwords` (``["▁ἀρ", "χῇ"]`` → ``ἀρχῇ``)."""
    groups: dict[int, list[str]] = {}
    for t, w in zip(tokens, words):
        if w >= 0:
            groups.setdefault(w, []).append(t)
    return ["".join(merge_subwords(groups[w])) for w in sorted(groups)]


def word_text(tokens: Sequence[str]) -> str:
    """A decoded token sequence as words separated by spaces (:func:`output_word_index`)."""
    return " ".join(word_labels(tokens, output_word_index(tokens)))


def word_view(ex: Example, rows: Sequence[str], attention: torch.Tensor, prefix: str) -> dict:
    """The analysed prefix's attention over words, for an example of subword tokens.

    Args:
        ex: the example (``src_words`` / ``tgt_words`` set).
        rows: the T analysed prefix tokens (``<eos>`` last).
        attention: (L, H, T, T_x) cross-attention of every layer and head on those rows.
        prefix: ``"reference"`` (rows are ``ex.tgt``: grouped by ``ex.tgt_words``, the alignment
            metric's words, punctuation of no word) or ``"greedy"`` (the model's own output:
            grouped by :func:`output_word_index`).

    Returns:
        ``source`` (I source word labels), ``rows`` (J output word labels), ``row_words`` (the
        word of each of the T rows, −1: none), ``attention`` (L × J × I head mean) and, with
        H > 1, ``heads`` (L × H × J × I): :func:`~attnstudy.analysis.ablations.alignment.
        word_attention` (summed over a source word's subwords, averaged over an output word's
        rows), rounded to :data:`DIGITS` decimals.
    """
    from .ablations.alignment import word_attention

    row_words = list(ex.tgt_words) if prefix == "reference" else output_word_index(rows)
    row_words += [-1] * (len(rows) - len(row_words))  # the <eos> row of the reference prefix
    words = word_attention(attention, ex.src_words, row_words)  # (L, H, J, I)
    view = {
        "source": word_labels(ex.src, ex.src_words),
        "rows": word_labels(rows, row_words),
        "row_words": row_words,
        "attention": [_matrix(layer.mean(0).numpy()) for layer in words],
    }
    if words.size(1) > 1:
        view["heads"] = [[_matrix(h.numpy()) for h in layer] for layer in words]
    return view


def reference_word_view(ex: Example, attention: torch.Tensor) -> dict:
    """The attention over the reference between words, with the gold word links, for an example
    of subword tokens: what the alignment ablation scores (its ``word_attention`` of the head
    mean, one row per target word, punctuation of no word left out).

    Args:
        ex: the example (``src_words`` / ``tgt_words`` and ``alignment`` set; its links are
            between words).
        attention: (H, T, T_x) attention of the analysed layer over the reference prefix (rows
            past ``len(ex.tgt)``, the ``<eos>`` step, are ignored), aggregated per head and then
            averaged, as the ablation does.

    Returns:
        ``source`` (I source word labels), ``rows`` (J target word labels), ``attention``
        (J × I), ``gold`` (``[source word, target word, sure]``, sorted) and ``links`` (``[source
        word, target word]``: the argmax of each row, the ablation's hard links; none on a tie).
    """
    from .ablations.alignment import hard_alignment, word_attention

    words = word_attention(attention, ex.src_words, ex.tgt_words).mean(0)  # (J, I)
    valid = torch.ones(words.size(1), dtype=torch.bool, device=words.device)
    gold = ex.alignment
    return {
        "source": word_labels(ex.src, ex.src_words),
        "rows": word_labels(ex.tgt, ex.tgt_words),
        "attention": _matrix(words.numpy()),
        "gold": sorted([s, t, (s, t) in gold.sure] for s, t in gold.possible | gold.sure),
        "links": sorted([s, t] for s, t in hard_alignment(words, valid)),
    }


class Recorder:
    """Collects :func:`example_records`-style records from the suite's batches.

    Args:
        analysis_prefix: the suite's prefix (``greedy`` or ``reference``): its batches give the
            main record, reference batches the reference attention and gold links.
        max_records: examples recorded at most.
    """

    def __init__(self, analysis_prefix: str, max_records: int = MAX_RECORDS):
        # ablation → its capture's run (the catalogue's captures); record functions by name
        self.capture = {n: catalogue.capture_functions(n)[0] for n in catalogue.captures()}
        self.prefix = analysis_prefix
        self.max_records = max_records
        self.records: dict[str, dict] = {}
        self._reference: dict[str, dict] = {}

    def add(self, batch: PreparedBatch, captured: dict) -> None:
        """Record a batch the suite analysed, with what its ablations computed (``captured``:
        ablation name → the second value of its capture's ``run``)."""
        if batch.trace.attention is None:
            return
        tr = batch.trace
        for i, ex in enumerate(batch.examples):
            if batch.prefix == self.prefix and (
                ex.id in self.records or len(self.records) < self.max_records
            ):
                self.records[ex.id] = _record(batch, i, ex, captured)
            # only for a recorded example: one map per example analysed would grow with them
            if batch.prefix == "reference" and ex.alignment is not None and ex.id in self.records:
                n = int(tr.src_lengths[i])
                steps = tr.step_mask[i].nonzero()[:, 0]
                att = tr.attention[i][:, steps, :n]  # (H, T, n)
                self._reference[ex.id] = {
                    "reference_rows": [
                        batch.tgt_vocab.itos[j] for j in tr.tgt_out[i, steps].tolist()
                    ],
                    "reference_attention": _matrix(att.mean(0).numpy()),
                    "gold": gold_cells(ex),
                }
                if ex.tgt_words:
                    self._reference[ex.id]["reference_words"] = reference_word_view(ex, att)

    def result(self) -> list[dict]:
        """The records, in the order the examples were analysed."""
        return [rec | self._reference.get(eid, {}) for eid, rec in self.records.items()]

    def part(self, example_ids: Sequence[str]) -> dict:
        """What the recorder holds of these examples (JSON values), for a batch's saved state
        (:mod:`attnstudy.analysis.suite_state`); :meth:`restore` puts it back."""
        return {
            "records": {i: self.records[i] for i in example_ids if i in self.records},
            "reference": {i: self._reference[i] for i in example_ids if i in self._reference},
        }

    def restore(self, part: dict) -> None:
        """Put back what :meth:`part` took (a batch of an interrupted run), in its order."""
        self.records.update(part.get("records", {}))
        self._reference.update(part.get("reference", {}))


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
        ``gold`` (``[source, target, sure]``). An example of subword tokens adds ``words``
        (:func:`word_view`) and, with gold links, ``reference_words`` (:func:`reference_word_view`).
        Values rounded to :data:`DIGITS` decimals; an empty list for a model without attention.
    """
    if not getattr(model, "has_attention", False):
        return []
    from .contract import capabilities

    caps = capabilities(model)
    ctx = AblationContext.of(cfg)
    rec = Recorder(cfg.prefix, max_records=len(examples))
    runs = {
        name: catalogue.capture_functions(name)[0]
        for name in catalogue.captures(cfg.ablations)
        if set(catalogue.get_ablation(name).requires) <= caps
    }
    for batch in prepare_batches(model, examples, src_vocab, tgt_vocab, cfg.prefix, batch_size):
        captured = {
            name: fn(model, batch, cfg.params_for(name), ctx)[1] for name, fn in runs.items()
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


def _record(batch: PreparedBatch, i: int, ex: Example, captured: dict) -> dict:
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
    if ex.tgt_words:
        rec["words"] = word_view(ex, rec["rows"], layers, batch.prefix)
    for name, computed in captured.items():  # the maps each capturing ablation records
        rec.update(catalogue.capture_functions(name)[1](batch, i, steps, n, computed))
    return rec
