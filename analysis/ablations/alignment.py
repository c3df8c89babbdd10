"""Attention as word alignment: hard links, AER and attention mass on gold links.

* Hard alignment: one link per target token, the argmax of α_t over the valid source positions
  (head mean); a tie gives no link (fairseq ``extract_hard_alignment`` takes the argmax of
  the attention the same way).
* AER (Och & Ney 2003, "A Systematic Comparison of Various Statistical Alignment Models",
  Computational Linguistics 29(1), eq. 7): AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|) with sure
  links S ⊆ possible links P; the corpus value uses sums of the four counts over all sentences.
  Where the gold has sure links only (S = P: ``Alignment.sure_only``, and a task's
  ``TaskSpec.gold_sure_only``, e.g. ``nt-greek-english``), AER = 1 − 2|A∩S| / (|A| + |S|) = 1 − F1.
* Standard AER (``aer``) counts every predicted link, also those of target tokens that have no
  gold link (a weekday, an unaligned word): Och & Ney's A is the whole predicted alignment, so
  the number is comparable with the alignment literature. ``aer_linked`` leaves out the target
  tokens without any gold link (the links the gold annotation cannot judge); it is never lower
  than the standard AER's complement would suggest and is reported under its own name. The
  ``<eos>`` step is not a target token and takes part in neither. Gold mass and argmax-on-gold
  are defined only for tokens with gold links. Alignment always runs on the reference prefix.
* Subword tokens (a pretrained model's tokenizer; the example carries ``src_words`` /
  ``tgt_words``, and its gold links are word-level): the attention is aggregated to words first —
  summed over a source word's subwords and averaged over a target word's subwords (Clark et al.
  2019, "What Does BERT Look At?", §4.1; the convention Zenkel et al. 2019 and Garg et al. 2019
  use for alignment from subword attention) — and every statistic is taken per target word, on
  the row of the word's first subword (``alignment_word``; the other subwords' rows count nothing).
* Shifted AER (``aer_shift``): the hard link of target token t taken from the attention row of
  step t + 1, the step whose decoder input is the token emitted at t (Chen et al. 2020,
  "Accurate Word Alignment Induction from Neural Machine Translation", §3: attention often
  aligns the word just fed to the decoder better than the word it predicts). Every target token
  has a next step (the last token's is the ``<eos>`` step); the same counts and sums as ``aer``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import (
    AblationSpec,
    ExampleColumn,
    Figure,
    Stat,
    Thresholds,
    VerdictRole,
)
from torch import Tensor

from attnstudy.data.alignment import Alignment, format_pharaoh
from attnstudy.data.vocab import EOS_ID
from attnstudy.models import Seq2Seq

from .._chunks import require_attention, step_frame
from ..batch import AblationContext, PreparedBatch
from ..errors import NoAttentionError

COUNTS = ("n_hyp", "n_hyp_sure", "n_hyp_possible", "n_sure")
SHIFT_COUNTS = ("shift_n_hyp", "shift_n_hyp_sure", "shift_n_hyp_possible")
"""The hypothesis counts of ``aer_shift`` (the link from step t + 1's attention); its sure count is
``n_sure``, the token's own."""

SPEC = AblationSpec(
    name="alignment",
    run="attnstudy.analysis.ablations.alignment:run",
    prefix="reference",
    requires=("attention",),
    stats={
        "aer": Stat(
            num="alignment_aer_num",
            den="alignment_aer_den",
            complement=True,
            label="AER",
            unit="0–1, lower is better",
            question="aligns",
            direction="lower",
            verdict=VerdictRole(
                "aligns",
                rule=Thresholds("align_aer", "no_align_aer", at_most=True),
                phrase="its argmax has AER {fmt}",
            ),
        ),
        "aer_linked": Stat(
            num="alignment_aer_linked_num",
            den="alignment_aer_linked_den",
            complement=True,
            label="AER, linked targets",
            unit="0–1, lower is better",
            question="aligns",
            direction="lower",
        ),
        "aer_shift": Stat(
            num="alignment_aer_shift_num",
            den="alignment_aer_shift_den",
            complement=True,
            label="AER, next step",
            unit="0–1, lower is better",
            question="aligns",
            direction="lower",
        ),
        "precision": Stat(
            num="alignment_precision_num",
            den="alignment_precision_den",
            label="precision",
            unit="share of predicted links (0–1)",
            question="aligns",
            direction="higher",
        ),
        "recall": Stat(
            num="alignment_recall_num",
            den="alignment_recall_den",
            label="recall",
            unit="share of sure gold links (0–1)",
            question="aligns",
            direction="higher",
        ),
        "gold_mass": Stat(
            "alignment_gold_mass",
            label="gold mass",
            unit="share of attention (0–1)",
            question="aligns",
            direction="higher",
            verdict=VerdictRole("aligns", "beside", phrase="puts {pct} of its mass on gold links"),
        ),
        "argmax_on_gold": Stat(
            "alignment_argmax_on_gold",
            label="argmax on gold",
            unit="share of tokens (0–1)",
            question="aligns",
            direction="higher",
        ),
    },
    derive="attnstudy.analysis.ablations.alignment:derive",
    more_stats="attnstudy.analysis.ablations.alignment:head_stats",
    figure=Figure(
        "alignment_vs_ablation",
        "Alignment against ablation, per sentence",
        "Each point is one test sentence: x is its mean attention mass on gold links (teacher-"
        "forced on the reference), y its mean permutation TVD or adversarial JSD (on the analysis "
        "prefix). If attention that follows the alignment were also the one the output depends "
        "on, sentences with more gold mass would have larger permutation TVD (positive τ) and "
        "smaller adversarial JSD (negative τ).",
    ),
    definitions=(
        (
            "AER",
            "alignment error rate, 1 − (|A∩S| + |A∩P|) / (|A| + |S|) (Och & Ney 2003, eq. 7), with "
            "A the predicted links (one argmax link per reference target token), S ⊆ P the sure "
            "and possible gold links, summed over the corpus; 0 = perfect. 'Linked targets' leaves "
            "out target tokens without any gold link. 'Next step' takes target token t's link from "
            "the attention of step t + 1, whose decoder input is token t (Chen et al. 2020). With "
            "sure links only (S = P, as in human alignments without a possible class) AER = 1 − F1.",
        ),
        (
            "precision / recall",
            "of the predicted links A against the gold (Och & Ney 2003, §5): precision = |A∩P| / "
            "|A|, recall = |A∩S| / |S|, corpus sums over every predicted link.",
        ),
        (
            "sure / possible links",
            "gold links marked certain (S) or acceptable (P ⊇ S), Pharaoh 'i-j' and 'ipj'.",
        ),
        (
            "gold mass",
            "the attention mass a target token puts on its gold-linked source tokens, averaged "
            "over tokens with gold links.",
        ),
    ),
    examples=(
        ExampleColumn(
            "gold_mass",
            "gold mass",
            "alignment_gold_mass",
            unit="share of attention (0–1), mean over linked target tokens",
            undefined="no gold link on any target token of this example",
            step_label="gold mass",
        ),
        ExampleColumn(  # the example's own AER (Och & Ney 2003, eq. 7) from its summed counts
            "aer",
            "AER",
            num=("alignment_n_hyp_sure", "alignment_n_hyp_possible"),
            den=("alignment_n_hyp", "alignment_n_sure"),
            complement=True,
            unit="0–1, lower is better",
            undefined="no gold link on any target token of this example",
        ),
        ExampleColumn(
            "argmax_on_gold",
            "argmax on gold",
            "alignment_argmax_on_gold",
            step_label="argmax on gold",
            listed=False,
        ),
    ),
    order=80,
    description="the attention argmax as a hard alignment: AER (standard, over linked target tokens, "
    "and from the next step's attention), attention mass on gold links",
    reference="Och & Ney 2003 (AER); fairseq extract_hard_alignment; Chen et al. 2020 (next step)",
)


def _argmax_link(row: Tensor, valid: Tensor) -> int | None:
    """The unique argmax of ``row`` (T_x,) over ``valid`` positions, None on a tie."""
    masked = row.masked_fill(~valid, float("-inf"))
    best = (masked == masked.max()).nonzero()[:, 0]
    return int(best[0]) if best.numel() == 1 else None


def word_attention(weights: Tensor, src_words: Sequence[int], tgt_words: Sequence[int]) -> Tensor:
    """Subword attention aggregated to words (Clark et al. 2019, §4.1): for target word J and
    source word I, the mean over J's subword rows of the summed attention on I's subwords.

    Args:
        weights: (…, T_y, T_x) attention over subword tokens (rows past ``len(tgt_words)``, e.g.
            the ``<eos>`` step, and columns past ``len(src_words)`` are ignored).
        src_words, tgt_words: word index per source / target subword (−1: no word).

    Returns:
        (…, n_target_words, n_source_words); each row sums to the share of attention the target
        word's subwords gave to words (less than 1 where some went to a special token).

    Raises:
        ValueError: a word index out of order (words must be numbered 0, 1, … in text order).
    """
    n_x, n_y = len(src_words), len(tgt_words)
    n_src = max(src_words, default=-1) + 1
    n_tgt = max(tgt_words, default=-1) + 1
    for words in (src_words, tgt_words):
        seen = [w for w in words if w >= 0]
        if seen != sorted(seen) or (seen and set(seen) != set(range(seen[-1] + 1))):
            raise ValueError(f"word indices must run 0, 1, … in token order, got {list(words)}")
    src_map = weights.new_zeros(n_x, n_src)
    for i, w in enumerate(src_words):
        if w >= 0:
            src_map[i, w] = 1.0
    tgt_map = weights.new_zeros(n_tgt, n_y)
    for j, w in enumerate(tgt_words):
        if w >= 0:
            tgt_map[w, j] = 1.0
    tgt_map = tgt_map / tgt_map.sum(1, keepdim=True).clamp(min=1.0)
    return tgt_map @ weights[..., :n_y, :n_x] @ src_map


def hard_alignment(weights: Tensor, valid: Tensor) -> set[tuple[int, int]]:
    """Hard links from an attention matrix: the argmax source position of every target row.

    Args:
        weights: (T_y, T_x), e.g. the head mean of one example's attention; row j is target
            token j.
        valid: bool (T_x,), True at real source positions.

    Returns:
        ``{(source_index, target_index)}``; a row whose maximum is tied gives no link.

    Raises:
        ValueError: for mismatched shapes.
    """
    if weights.dim() != 2 or valid.shape != weights.shape[1:]:
        raise ValueError(
            f"weights must be (T_y, T_x) with valid (T_x,), got {tuple(weights.shape)} "
            f"and {tuple(valid.shape)}"
        )
    links = set()
    for j in range(weights.size(0)):
        i = _argmax_link(weights[j], valid)
        if i is not None:
            links.add((i, j))
    return links


def aer_from_counts(n_hyp: float, n_hyp_sure: float, n_hyp_possible: float, n_sure: float) -> float:
    """AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|) from (corpus) counts; NaN if |A| + |S| = 0."""
    denom = n_hyp + n_sure
    return math.nan if denom <= 0 else 1.0 - (n_hyp_sure + n_hyp_possible) / denom


def aer(
    hyp_links: Iterable[tuple[int, int]],
    sure: Iterable[tuple[int, int]],
    possible: Iterable[tuple[int, int]],
) -> float:
    """Alignment error rate of one link set (Och & Ney 2003, eq. 7).

    Args:
        hyp_links: hypothesis links A, ``(source_index, target_index)``.
        sure: sure gold links S.
        possible: possible gold links P (S is added: S ⊆ P).

    Returns:
        AER in [0, 1]; NaN when A and S are both empty (undefined). With ``possible`` equal to
        ``sure`` (gold with sure links only) it is 1 − F1 of A against S.
    """
    a, s = set(hyp_links), set(sure)
    p = set(possible) | s
    return aer_from_counts(len(a), len(a & s), len(a & p), len(s))


def run(model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Agreement of the attention with gold alignments, per decoder step.

    Args:
        model: the model (only its traced attention is used).
        batch: prepared with ``prefix="reference"`` (gold links index the reference target).
        params, ctx: unused (the ablation convention).

    Returns:
        One row per real step: ``example_id``, ``step``, ``alignment_linked`` (the target token
        has at least one gold link), the counts ``alignment_n_hyp`` (0/1: a hard link exists for
        this token, whether or not it has gold links), ``alignment_n_hyp_sure``,
        ``alignment_n_hyp_possible``, ``alignment_n_sure`` (number of sure gold links of this
        token) — all 0 at the ``<eos>`` step, so corpus sums give the corpus AER —,
        ``alignment_gold_mass`` (head-mean attention mass on the token's possible links,
        P ⊇ S) and ``alignment_argmax_on_gold`` (1.0 if the hard link is a possible link; 0.0
        also on a tie), both NaN for a token without gold link and at ``<eos>``;
        ``alignment_skipped`` (the example has no gold alignment: every value NaN);
        ``alignment_shift_n_hyp`` / ``_n_hyp_sure`` / ``_n_hyp_possible``, the counts of the
        link taken from the next step's head-mean row (``aer_shift``; no link where step t + 1
        is not a real step). Multi-head
        models add ``alignment_head<h>_n_hyp`` / ``_n_hyp_sure`` / ``_n_hyp_possible`` per head.
        With subword tokens (``Example.tgt_words``), every value is the target *word*'s, from
        :func:`word_attention`, on the row of its first subword (the others count 0, their
        gold mass is NaN), and ``alignment_word`` gives each row's target word (−1: ``<eos>``;
        NaN on the rows of an example without word maps, so a row's value never depends on its
        batch-mates; an integer column when every example of the batch has word maps).

    Raises:
        NoAttentionError: for the ``none`` model.
        ValueError: if the batch does not follow the reference prefix.
    """
    att = require_attention(model, batch, "alignment")
    if batch.prefix != "reference":
        raise ValueError(
            f"alignment needs the reference prefix, got a batch prepared with {batch.prefix!r}"
        )
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    h = att.size(1)
    # per-token bookkeeping on host copies (one transfer, not one per step on a GPU)
    att = att.cpu()
    mean = att.mean(1)
    valid = (~tr.pad_mask).cpu()
    shift_mean, next_real, shift_link = _next_step_links(att, tr.step_mask, valid)
    lengths, tgt_out = tr.src_lengths.tolist(), tr.tgt_out.tolist()
    cols = _empty_columns(h)
    skipped = []
    subword = any(ex.tgt_words for ex in batch.examples)
    # each row's target word; NaN on the rows of an example without word maps (one without gold
    # links, whose tokens subword_examples does not map), whatever its batch-mates
    word_col: list[float] = []
    words: dict[int, tuple[Tensor, Tensor, dict[int, int], Tensor]] = {}  # per example, subwords
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        ex = batch.examples[b]
        gold = ex.alignment
        skipped.append(gold is None)
        unit = t  # the target unit of this row: the token, or the word of a subword
        if ex.tgt_words:
            if b not in words:
                words[b] = _word_maps(att[b], shift_mean[b], ex)
            unit = ex.tgt_words[t] if t < len(ex.tgt_words) else -1
        word_col.append(float(unit) if ex.tgt_words else np.nan)
        if gold is None:
            for v in cols.values():
                v.append(np.nan)
            continue
        eos = int(tgt_out[b][t]) == EOS_ID
        if eos or (ex.tgt_words and (unit < 0 or words[b][2].get(unit) != t)):
            _append_nothing(cols, eos)  # <eos>, or a subword after its word's first
            continue
        if ex.tgt_words:
            row_mean, row_heads = words[b][0][unit], words[b][1][:, unit]
            row_valid = torch.ones(row_mean.numel(), dtype=torch.bool, device=row_mean.device)
            n_x = row_mean.numel()
            # the word's next step: the one after its last subword
            last = max(j for j, w in enumerate(ex.tgt_words) if w == unit)
            row_shift = words[b][3][unit] if next_real[b][last] else None
        else:
            row_mean, row_heads, row_valid = mean[b, t], att[b, :, t], valid[b]
            n_x = int(lengths[b])
            row_shift = None
        sure_t = {i for i, j in gold.sure if j == unit and i < n_x}
        poss_t = {i for i, j in gold.possible | gold.sure if j == unit and i < n_x}
        if ex.tgt_words:
            shift = None if row_shift is None else _argmax_link(row_shift, row_valid)
        else:
            shift = shift_link[b][t] if next_real[b][t] and shift_link[b][t] >= 0 else None
        _append_row(cols, (row_mean, row_heads, row_valid), gold=(sure_t, poss_t), shift=shift)
    for name, values in cols.items():
        frame[name] = np.asarray(values, dtype=float)
    frame["alignment_linked"] = (
        frame["alignment_linked"].map({1.0: True, 0.0: False}).astype("boolean")
    )
    frame["alignment_skipped"] = np.asarray(skipped, dtype=bool)
    if subword:
        word = np.asarray(word_col, dtype=float)
        frame["alignment_word"] = word if np.isnan(word).any() else word.astype(np.int64)
    return frame


def _next_step_links(att: Tensor, step_mask: Tensor, valid: Tensor):
    """The next step's head-mean attention per row (row t is step t + 1's: the step fed the token
    emitted at t), whether that step is real, and its unique argmax per row (−1 on a tie),
    computed once (a per-row call doubled the run time)."""
    shifted = torch.cat([att[:, :, 1:], torch.zeros_like(att[:, :, :1])], 2)
    shift_mean = shifted.mean(1)
    next_real = torch.cat([step_mask[:, 1:], torch.zeros_like(step_mask[:, :1])], 1).tolist()
    masked = shift_mean.masked_fill(~valid[:, None, :], float("-inf"))
    is_max = masked == masked.max(-1, keepdim=True).values
    shift_link = torch.where(is_max.sum(-1) == 1, is_max.int().argmax(-1), -1).tolist()
    return shift_mean, next_real, shift_link


def _empty_columns(h: int) -> dict[str, list[float]]:
    """The ablation's columns, empty, in their order (per-head counts for ``h`` > 1 heads)."""
    cols: dict[str, list[float]] = {"alignment_linked": []}
    cols.update({f"alignment_{c}": [] for c in COUNTS})
    cols.update({f"alignment_{c}": [] for c in SHIFT_COUNTS})
    cols.update({"alignment_gold_mass": [], "alignment_argmax_on_gold": []})
    head_cols = [f"alignment_head{k}_{c}" for k in range(h) for c in COUNTS[:3]] if h > 1 else []
    cols.update({c: [] for c in head_cols})
    return cols


def _word_maps(att_b: Tensor, shift_mean_b: Tensor, ex):
    """A subword example's word grids: (head-mean, per head, each word's first subword, the next
    step's head-mean)."""
    heads_w = word_attention(att_b, ex.src_words, ex.tgt_words)  # (H, J, I)
    first = {}
    for j, w in enumerate(ex.tgt_words):
        first.setdefault(w, j)
    shift_w = word_attention(shift_mean_b, ex.src_words, ex.tgt_words)  # (J, I)
    return heads_w.mean(0), heads_w, first, shift_w


def _append_nothing(cols: dict[str, list[float]], eos: bool) -> None:
    """A row that counts nothing: ``<eos>`` (linked: False) or a subword after its word's first
    (the word is counted once, on its first; linked: NaN)."""
    for name, v in cols.items():
        if name == "alignment_linked":
            v.append(0.0 if eos else np.nan)
        elif name in ("alignment_gold_mass", "alignment_argmax_on_gold"):
            v.append(np.nan)
        else:
            v.append(0.0)


def _append_row(cols: dict[str, list[float]], rows, *, gold, shift: int | None) -> None:
    """One target unit's values: the hard link of its head-mean attention row and of each head's
    (``rows``: head-mean row, per-head rows, valid source positions) against its gold links
    (``gold``: sure, possible), the next step's link ``shift``, the attention mass on gold."""
    row_mean, row_heads, row_valid = rows
    sure_t, poss_t = gold
    link = _argmax_link(row_mean, row_valid)
    cols["alignment_linked"].append(float(bool(poss_t)))
    cols["alignment_n_hyp"].append(float(link is not None))
    cols["alignment_n_hyp_sure"].append(float(link in sure_t))
    cols["alignment_n_hyp_possible"].append(float(link in poss_t))
    cols["alignment_n_sure"].append(float(len(sure_t)))
    cols["alignment_shift_n_hyp"].append(float(shift is not None))
    cols["alignment_shift_n_hyp_sure"].append(float(shift in sure_t))
    cols["alignment_shift_n_hyp_possible"].append(float(shift in poss_t))
    cols["alignment_gold_mass"].append(
        float(row_mean[sorted(poss_t)].double().sum()) if poss_t else np.nan
    )
    cols["alignment_argmax_on_gold"].append(float(link in poss_t) if poss_t else np.nan)
    h = row_heads.shape[0]
    for k in range(h if h > 1 else 0):
        lk = _argmax_link(row_heads[k], row_valid)
        cols[f"alignment_head{k}_n_hyp"].append(float(lk is not None))
        cols[f"alignment_head{k}_n_hyp_sure"].append(float(lk in sure_t))
        cols[f"alignment_head{k}_n_hyp_possible"].append(float(lk in poss_t))


def _heads(columns) -> list[int]:
    return sorted(
        {int(m.group(1)) for c in columns if (m := re.match(r"alignment_head(\d+)_n_hyp$", c))}
    )


def derive(rows: pd.DataFrame) -> pd.DataFrame:
    """The numerator and denominator columns of the corpus AER (Och & Ney 2003, eq. 7):
    1 − (|A∩S| + |A∩P|) / (|A| + |S|) from summed counts, standard (every predicted link) and over
    linked target tokens only, for the head mean and per head; ``aer_shift``'s, from the next
    step's links (every predicted link, head mean); precision |A∩P| / |A| and recall |A∩S| / |S|
    (Och & Ney 2003, §5; head mean, every predicted link)."""
    if "alignment_n_sure" not in rows.columns:
        return rows
    ok = rows["alignment_n_sure"].notna()
    linked = (
        ok & rows["alignment_linked"].astype("boolean").fillna(False).astype(bool)
        if "alignment_linked" in rows.columns
        else ok
    )
    cols = {}
    for label, pre in [("", "alignment_")] + [
        (f"_head{h}", f"alignment_head{h}_") for h in _heads(rows.columns)
    ]:
        num = rows[f"{pre}n_hyp_sure"].astype(float) + rows[f"{pre}n_hyp_possible"].astype(float)
        den = rows[f"{pre}n_hyp"].astype(float) + rows["alignment_n_sure"].astype(float)
        for stat, keep in ((f"aer{label}", ok), (f"aer_linked{label}", linked)):
            cols[f"alignment_{stat}_num"] = num.where(keep, 0.0)
            cols[f"alignment_{stat}_den"] = den.where(keep, 0.0)
    hyp = rows["alignment_n_hyp"].astype(float).where(ok, 0.0)
    cols["alignment_precision_num"] = rows["alignment_n_hyp_possible"].astype(float).where(ok, 0.0)
    cols["alignment_precision_den"] = hyp
    cols["alignment_recall_num"] = rows["alignment_n_hyp_sure"].astype(float).where(ok, 0.0)
    cols["alignment_recall_den"] = rows["alignment_n_sure"].astype(float).where(ok, 0.0)
    if "alignment_shift_n_hyp" in rows.columns:  # tables stored before aer_shift have none
        num = rows["alignment_shift_n_hyp_sure"].astype(float) + rows[
            "alignment_shift_n_hyp_possible"
        ].astype(float)
        den = rows["alignment_shift_n_hyp"].astype(float) + rows["alignment_n_sure"].astype(float)
        cols["alignment_aer_shift_num"] = num.where(ok, 0.0)
        cols["alignment_aer_shift_den"] = den.where(ok, 0.0)
    return rows.assign(**cols)


def head_stats(columns) -> dict[str, Stat]:
    """Per-head AER statistics of a multi-head model (``aer_head<h>``, ``aer_linked_head<h>``)."""
    out = {}
    for h in _heads(columns):
        for stat in (f"aer_head{h}", f"aer_linked_head{h}"):
            out[stat] = Stat(
                num=f"alignment_{stat}_num", den=f"alignment_{stat}_den", complement=True
            )
    return out


def to_pharaoh(weights: Tensor, valid: Tensor, n_target: int | None = None) -> str:
    """Attention-derived hard alignment of one example in Pharaoh format (``0-0 1-2 …``).

    Args:
        weights: (T_y, T_x) head-mean attention over the reference prefix, or (H, T_y, T_x)
            (averaged over heads).
        valid: bool (T_x,).
        n_target: number of target tokens (rows beyond it, e.g. the ``<eos>`` step, are dropped).

    Returns:
        Sure links, sorted by (target, source), as :func:`attnstudy.data.format_pharaoh` writes.
    """
    if weights.dim() == 3:
        weights = weights.mean(0)
    if n_target is not None:
        weights = weights[:n_target]
    return format_pharaoh(Alignment.from_links(hard_alignment(weights, valid)))


def batch_to_pharaoh(batch: PreparedBatch) -> dict[str, str]:
    """:func:`to_pharaoh` for every example of a batch: example id → Pharaoh line (word links
    for subword examples, from :func:`word_attention`).

    Raises:
        NoAttentionError: for a trace without attention.
    """
    tr = batch.trace
    if tr.attention is None:
        raise NoAttentionError(
            "alignment export needs attention weights; the 'none' model has none"
        )
    out = {}
    for b, ex in enumerate(batch.examples):
        if ex.tgt_words:  # subword tokens: links between words (word_attention)
            words = word_attention(tr.attention[b].mean(0).cpu(), ex.src_words, ex.tgt_words)
            valid = torch.ones(words.size(1), dtype=torch.bool, device=words.device)
            out[ex.id] = to_pharaoh(words, valid)
            continue
        n_target = int((tr.step_mask[b] & (tr.tgt_out[b] != EOS_ID)).sum())
        out[ex.id] = to_pharaoh(tr.attention[b], ~tr.pad_mask[b], n_target)
    return out


__all__ = [
    "aer",
    "aer_from_counts",
    "batch_to_pharaoh",
    "hard_alignment",
    "word_attention",
    "run",
    "to_pharaoh",
]
