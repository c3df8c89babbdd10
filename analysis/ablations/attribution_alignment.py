"""Each attribution method's argmax as a word alignment, scored like attention's: AER, precision
and recall against the gold links, beside attention's own argmax.

For every reference target token (teacher forcing on the reference, as the ``alignment``
ablation) a method's token scores (:mod:`attnstudy.analysis.attribution`: saliency, input ×
gradient, integrated gradients, occlusion) are taken in absolute value and the unique argmax over
the real source positions is the token's hard link (a tie gives no link), exactly as the
attention argmax is in :mod:`~attnstudy.analysis.ablations.alignment`; ``attention`` (the head-mean
row) is scored by the same code, so its row equals the ``alignment`` ablation's ``aer``. With
subword tokens the absolute scores are aggregated to words first as attention is
(:func:`~attnstudy.analysis.ablations.alignment.word_attention`: summed over a source word's
subwords, averaged over a target word's) and each target word counts once, on its first subword.

AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|) (Och & Ney 2003, eq. 7), precision = |A∩P| / |A|, recall =
|A∩S| / |S|, each a ratio of corpus sums with a bootstrap interval over examples; with sure links
only (S = P) AER = 1 − F1. Moradi et al. 2019 and Ding et al. 2019 ("Saliency-driven Word
Alignment Interpretation for NMT") read attribution argmaxes as alignments this way.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.attribution_params import (
    IMPORTANCE_LABELS,
    METHODS,
    AgreementParams,
)
from attnstudy.analysis.catalogue import AblationSpec, Question, Stat
from pydantic import Field, field_validator
from torch import Tensor

from attnstudy.data.vocab import EOS_ID

from .._chunks import step_frame
from ..attribution import cached_attribution, head_mean_attention
from .alignment import _argmax_link, word_attention


class AttributionAlignmentParams(AgreementParams):
    """Which methods are read as alignments (each method's settings as in its own entry).

    Attributes:
        methods: attribution methods of :mod:`attnstudy.analysis.attribution`; attention's own
            argmax is always scored beside them when the model has attention.
    """

    methods: tuple[str, ...] = Field(METHODS, min_length=1, max_length=len(METHODS))

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in value if m not in METHODS]
        if unknown or len(set(value)) != len(value):
            raise ValueError(
                f"methods must be distinct names of {', '.join(METHODS)}; got {list(value)}"
            )
        return value


SPEC = AblationSpec(
    name="attribution_alignment",
    run="attnstudy.analysis.ablations.attribution_alignment:run",
    params=AttributionAlignmentParams,
    prefix="reference",
    requires=("gradients",),
    stats={
        f"{stat}_{m}": Stat(
            num=f"attribution_alignment_{m}_{stat}_num",
            den=f"attribution_alignment_{m}_{stat}_den",
            complement=stat == "aer",
            label=f"{label} {method}",
            unit="0–1, lower is better" if stat == "aer" else "share of links (0–1)",
            question="attribution_alignment",
            direction="lower" if stat == "aer" else "higher",
            # a method's columns where the study's methods include it; attention's always
            optional=m != "attention",
        )
        for m, method in IMPORTANCE_LABELS.items()
        if m != "leave_one_out"  # a TVD per position, not an argmax read as a link
        for stat, label in (("aer", "AER"), ("precision", "precision"), ("recall", "recall"))
    },
    derive="attnstudy.analysis.ablations.attribution_alignment:derive",
    questions={
        "attribution_alignment": Question(
            "Do attribution methods align? Each method's argmax as an alignment",
            "For every reference target word (teacher-forced on the reference) the source word "
            "with the largest absolute score of a method is its link, as the attention argmax is "
            "(the attention columns repeat the alignment table's AER); AER, precision and recall "
            "against the gold links, corpus ratios with 95 % intervals over examples.",
            order=41,
        ),
    },
    figure=None,  # ratios of corpus sums, no per-step distribution: the table shows them
    definitions=(
        (
            "attribution argmax",
            "the source word with the largest absolute attribution score (saliency, input × "
            "gradient, integrated gradients, occlusion) for a reference target word: one hard "
            "link per target word, scored as attention's argmax (AER, precision, recall).",
        ),
    ),
    default=False,
    order=81,
    description="each attribution method's argmax (saliency, input × gradient, integrated "
    "gradients, occlusion) as a hard alignment beside attention's: AER, precision, recall",
    reference="Och & Ney 2003 (AER); Ding et al. 2019; Moradi et al. 2019",
)

COUNTS = ("n_hyp", "n_hyp_sure", "n_hyp_possible")


def argmax_counts(batch, scores: Tensor) -> dict[str, np.ndarray]:
    """The hard-link counts of one importance matrix per reference target token, in the row
    order of :func:`~attnstudy.analysis._chunks.step_frame`.

    Args:
        batch: a :class:`~attnstudy.analysis.batch.PreparedBatch` on the reference prefix.
        scores: (B, T_y, T_x) non-negative importance (attention, |attribution|); NaN where
            undefined (padding) counts as 0.

    Returns:
        ``n_hyp`` (a link exists), ``n_hyp_sure``, ``n_hyp_possible`` (the link is a sure /
        possible gold link) and ``n_sure`` (sure gold links of the token or word), each (n_steps,)
        float: 0 at ``<eos>`` and on a word's later subwords, NaN for an example without gold.
    """
    tr = batch.trace
    _, b_idx, t_idx = step_frame(batch)
    scores = torch.nan_to_num(scores.detach().double().cpu(), nan=0.0)
    valid = (~tr.pad_mask).cpu()
    lengths, tgt_out = tr.src_lengths.tolist(), tr.tgt_out.tolist()
    out = {c: [] for c in (*COUNTS, "n_sure")}
    words: dict[int, tuple[Tensor, dict[int, int]]] = {}
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        ex = batch.examples[b]
        gold = ex.alignment
        if gold is None:
            for v in out.values():
                v.append(np.nan)
            continue
        unit = t
        if ex.tgt_words:
            if b not in words:
                first: dict[int, int] = {}
                for j, w in enumerate(ex.tgt_words):
                    first.setdefault(w, j)
                words[b] = (word_attention(scores[b], ex.src_words, ex.tgt_words), first)
            unit = ex.tgt_words[t] if t < len(ex.tgt_words) else -1
        eos = int(tgt_out[b][t]) == EOS_ID
        if eos or (ex.tgt_words and (unit < 0 or words[b][1].get(unit) != t)):
            for v in out.values():
                v.append(0.0)
            continue
        if ex.tgt_words:
            row = words[b][0][unit]
            row_valid = torch.ones(row.numel(), dtype=torch.bool, device=row.device)
            n_x = row.numel()
        else:
            row, row_valid, n_x = scores[b, t], valid[b], int(lengths[b])
        sure = {i for i, j in gold.sure if j == unit and i < n_x}
        poss = {i for i, j in gold.possible | gold.sure if j == unit and i < n_x}
        link = _argmax_link(row, row_valid)
        out["n_hyp"].append(float(link is not None))
        out["n_hyp_sure"].append(float(link in sure))
        out["n_hyp_possible"].append(float(link in poss))
        out["n_sure"].append(float(len(sure)))
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


def run(model, batch, params: AttributionAlignmentParams, ctx) -> pd.DataFrame:
    """Attention's and each method's argmax as hard alignments, per decoder step.

    Args:
        model: a model with input gradients (the contract's ``embed``).
        batch: prepared with ``prefix="reference"`` (gold links index the reference target).
        params: :class:`AttributionAlignmentParams`. ctx: ``chunk_rows`` (occlusion).

    Returns:
        One row per real step: ``example_id``, ``step``, ``attribution_alignment_skipped`` (no
        gold), ``attribution_alignment_n_sure`` and for each scored method ``m`` (``attention``
        when the model has it, then ``params.methods``) ``attribution_alignment_<m>_n_hyp`` /
        ``_n_hyp_sure`` / ``_n_hyp_possible`` (:func:`argmax_counts`); without attention its
        columns are NaN (its statistics undefined).

    Raises:
        ValueError: a batch not on the reference prefix.
    """
    if batch.prefix != "reference":
        raise ValueError(
            "attribution_alignment needs the reference prefix, got a batch prepared with "
            f"{batch.prefix!r}"
        )
    frame, _, _ = step_frame(batch)
    matrices: dict[str, Tensor] = {}
    att = head_mean_attention(batch)
    if att is not None:
        matrices["attention"] = att
    for m in params.methods:  # saliency and input × gradient share one backward (the run's cache)
        found = cached_attribution(model, batch, m, ctx, getattr(params, m).model_dump())
        matrices[m] = found.scores.abs()
    n_sure = None
    for m, scores in matrices.items():
        counts = argmax_counts(batch, scores)
        n_sure = counts["n_sure"]
        for c in COUNTS:
            frame[f"attribution_alignment_{m}_{c}"] = counts[c]
    if att is None:  # no attention to read: its links are undefined (never counted as missing)
        for c in COUNTS:
            frame[f"attribution_alignment_attention_{c}"] = np.nan
    frame["attribution_alignment_n_sure"] = n_sure
    frame["attribution_alignment_skipped"] = np.isnan(n_sure)
    return frame


def derive(rows: pd.DataFrame) -> pd.DataFrame:
    """Numerators and denominators of each method's AER (Och & Ney 2003, eq. 7), precision
    |A∩P| / |A| and recall |A∩S| / |S| from the per-step counts (corpus sums)."""
    if "attribution_alignment_n_sure" not in rows.columns:
        return rows
    n_sure = rows["attribution_alignment_n_sure"].astype(float)
    ok = n_sure.notna()
    cols = {}
    for m in ("attention", *METHODS):
        pre = f"attribution_alignment_{m}_"
        if f"{pre}n_hyp" not in rows.columns:
            continue
        hyp = rows[f"{pre}n_hyp"].astype(float)
        hs, hp = rows[f"{pre}n_hyp_sure"].astype(float), rows[f"{pre}n_hyp_possible"].astype(float)
        # a step this method has no links for (a model without attention: NaN counts) adds
        # nothing to either sum, so the statistic is undefined there, never 0
        counted = ok & hyp.notna()
        for stat, num, den in (
            ("aer", hs + hp, hyp + n_sure),
            ("precision", hp, hyp),
            ("recall", hs, n_sure),
        ):
            cols[f"{pre}{stat}_num"] = num.where(counted, 0.0)
            cols[f"{pre}{stat}_den"] = den.where(counted, 0.0)
    return rows.assign(**cols)
