"""Comprehensiveness and sufficiency of token rankings at every decoder step (DeYoung et al. 2020,
"ERASER", §4; AOPC after Samek et al. 2017), for seq2seq: one number per generated token.

At decoder step t (teacher-forced over the analysis prefix, ŷ_t the prefix token) a ranking orders
the n valid source positions, most important first. For k source tokens:

* comprehensiveness_t(k) = p_t(ŷ_t) − p_t(ŷ_t | source without the top-k tokens);
* sufficiency_t(k) = p_t(ŷ_t) − p_t(ŷ_t | source with only the top-k tokens);

probabilities of the emitted token (0–1). AOPC is their mean over k ∈ ⌈f · n⌉ for the fractions f
(default 1, 5, 10, 20, 50 % of the source length), at least one token and at most n − 1 (one
token is always left, one always removed). A faithful ranking has high comprehensiveness and low
sufficiency; random orders are the yardstick.

**Removal is deletion** for every ranking: the tokens are taken out of the source and the rest
shifts left, as leave-one-out deletes (Jain & Wallace 2019, §3), so no replacement token the model
never saw in that place is fed in. Its caveat: shorter sources are off the training distribution
too (a model trained on lengths 10–30 sees a source of 5), so part of a large drop can be the
length, not the tokens; the random orders delete as many tokens and measure that part.

Rankings (:attr:`FaithfulnessParams.RANKINGS`, named and labelled by the importance measures'
registry :data:`attnstudy.analysis.attribution_params.IMPORTANCE_LABELS`): ``attention`` (head-mean
row α_t), the attribution methods of :mod:`attnstudy.analysis.attribution` (by absolute value),
``leave_one_out`` (the importance ablation's deletion TVD) and ``random`` (``n_random`` seeded
orders per step, their mean). Every ranking has its statistics in the catalogue; a study has
columns for the rankings it configured (``rankings``), and a model that lacks one (the ``none``
baseline's attention) has them NaN with the reason in ``faithfulness_<ranking>_reason``.
Batched: every (step, ranking, k, removal) source of a batch is traced at once, in chunks;
:func:`reference_drops` traces one step's one source at a time.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import torch
from attnstudy.analysis.attribution_params import GRADIENT_METHODS, IMPORTANCE_LABELS
from attnstudy.analysis.catalogue import (
    AblationSpec,
    Figure,
    Params,
    Question,
    Stat,
    VerdictRole,
)
from pydantic import Field, field_validator, model_serializer
from torch import Tensor

from attnstudy.models import eval_mode

from .._chunks import step_frame
from ..batch import AblationContext, PreparedBatch, step_generator
from ..contract import capabilities
from ..interventions import valid_first
from ..random_streams import LEGACY, CounterStreams, permutations, words


class FaithfulnessParams(Params):
    """Settings of ``[ablation.faithfulness]``.

    Attributes:
        rankings: which rankings are tested (of :attr:`RANKINGS`; each attribution method runs
            with its default settings); one not available for a model (attention of the
            ``none`` model, a gradient method without the ``gradients`` capability) is undefined
            for it, with the reason.
        n_random: seeded random orders per step (the ``random`` ranking is their mean).
        fractions: the k of the AOPC as shares of the source length (k = ⌈f · n⌉, 1 ≤ k ≤ n − 1).
        soft_draws: Bernoulli masks per step, ranking and criterion for soft comprehensiveness
            and sufficiency (Zhao & Aletras 2023; their mean); 1 (the default): one mask per
            step, as the authors' code draws one per instance (measured: +0.2–0.3× the hard
            entry's time, docs/attribution.md). 0: not computed, and then left out of the
            resolved settings, so a study stored before soft erasure existed keeps its key.
            Each draw costs two traces of the prefix per step and ranking.
    """

    RANKINGS: ClassVar[dict[str, str]] = {**IMPORTANCE_LABELS, "random": "random"}
    """Every ranking: name → label (the report's columns, the figure, the verdict); the
    importance measures of the registry, then random orders."""
    rankings: tuple[str, ...] = Field(
        ("attention", "input_x_gradient", "leave_one_out", "random"), min_length=1
    )
    n_random: int = Field(3, ge=1, le=100)
    fractions: tuple[float, ...] = Field((0.01, 0.05, 0.1, 0.2, 0.5), min_length=1, max_length=20)
    soft_draws: int = Field(1, ge=0, le=100)

    @field_validator("rankings")
    @classmethod
    def _known(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [r for r in value if r not in cls.RANKINGS]
        if unknown or len(set(value)) != len(value):
            raise ValueError(
                f"rankings must be distinct names of {', '.join(cls.RANKINGS)}; got {list(value)}"
            )
        return value

    @field_validator("fractions")
    @classmethod
    def _shares(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < f <= 1 for f in value):
            raise ValueError(f"fractions must lie in (0, 1], got {list(value)}")
        return value

    @model_serializer(mode="wrap")
    def _omit_no_soft(self, handler):
        data = handler(self)
        if not self.soft_draws:
            data.pop("soft_draws", None)
        return data


SPEC = AblationSpec(
    name="faithfulness",
    run="attnstudy.analysis.ablations.faithfulness:run",
    params=FaithfulnessParams,
    requires=(),  # attention and gradient rankings are left out where the model lacks them
    stats={
        **{
            f"{mode}_{r}": Stat(
                f"faithfulness_{mode}_{r}",
                label=f"{mode}, {label}",
                unit="AOPC, drop of p(y_t)",
                question="faithful",
                direction=direction,
                optional=True,  # a column where the study's rankings include it
                # result tables written before the labels came from the registry
                former_labels=(f"{mode}, {r.replace('_', ' ')}",),
                # the verdict's faithfulness sentence: the comprehensiveness AOPCs compete; the
                # sufficiency AOPCs are the order soft sufficiency is compared with
                verdict=VerdictRole(
                    "faithful",
                    "ranking",
                    measure=label,
                    phrase="{fmt} for random orders" if r == "random" else "",
                    criterion="deletion",
                )
                if mode == "comprehensiveness"
                else VerdictRole(
                    "faithful", "ranking", measure=label, criterion="deletion (sufficiency)"
                ),
            )
            for mode, direction in (("comprehensiveness", "higher"), ("sufficiency", "lower"))
            for r, label in FaithfulnessParams.RANKINGS.items()
        },
        **{
            # soft erasure (Zhao & Aletras 2023), where soft_draws > 0: both higher is faithful
            f"soft_{mode}_{r}": Stat(
                f"faithfulness_soft_{mode}_{r}",
                label=f"soft {mode}, {label}",
                unit=f"Soft-N{mode[0].upper()} (0–1)",
                question="faithful",
                direction="higher",
                optional=True,
                # the verdict says where soft erasure orders the rankings otherwise than deletion,
                # comprehensiveness against comprehensiveness, sufficiency against sufficiency
                verdict=VerdictRole("faithful", "ranking", measure=label, criterion="soft erasure")
                if mode == "comprehensiveness"
                else VerdictRole(
                    "faithful",
                    "ranking",
                    measure=label,
                    criterion="soft erasure (sufficiency)",
                    versus="deletion (sufficiency)",
                ),
            )
            for mode in ("comprehensiveness", "sufficiency")
            for r, label in FaithfulnessParams.RANKINGS.items()
        },
        **{
            # optional as the AOPC columns: where the study's rankings include it
            f"comprehensiveness_top1_{r}": Stat(
                f"faithfulness_comprehensiveness_top1_{r}", optional=True
            )
            for r in FaithfulnessParams.RANKINGS
        },
    },
    questions={
        "faithful": Question(
            "Is the ranking faithful? Comprehensiveness and sufficiency per decoder step",
            "For each decoder step the source tokens a ranking puts first are deleted "
            "(comprehensiveness: the drop of p(y_t) without them) or kept alone (sufficiency: the "
            "drop with only them), averaged over k = 1, 5, 10, 20, 50 % of the source length "
            "(AOPC; DeYoung et al. 2020). Removal is deletion for every ranking (no mask token), "
            "but shorter sources are off the training distribution too: compare with random "
            "orders, which delete as many tokens. Soft comprehensiveness and sufficiency (unless "
            "soft_draws = 0; Zhao & Aletras 2023) instead zero each element of a source "
            "token's embedding at random, the more likely the higher (comprehensiveness) or the "
            "lower (sufficiency) the ranking's normalised score, and normalise by the drop with "
            "every embedding zeroed: higher is more faithful for both.",
            order=35,
        )
    },
    figure=Figure(
        "faithfulness",
        "Comprehensiveness and sufficiency of each ranking",
        "AOPC of the drop of p(y_t) when the top-ranked source tokens are deleted "
        "(comprehensiveness, higher is more faithful) or are all that is kept (sufficiency, "
        "lower is more faithful), per ranking and model; 95 % bootstrap intervals over examples. "
        "Random: the mean of seeded random orders. Below, where soft erasure ran (soft_draws "
        "> 0, the default 1): soft comprehensiveness and sufficiency (Zhao & Aletras 2023) of the "
        "same rankings, higher more faithful in both.",
    ),
    definitions=(
        (
            "comprehensiveness / sufficiency",
            "p_t(y_t) minus p_t(y_t) with the top-k source tokens of a ranking deleted / with only "
            "them kept, averaged over k (AOPC) = ⌈f·n⌉ for f = 1, 5, 10, 20, 50 % of the n source "
            "tokens, 1 ≤ k ≤ n − 1 (DeYoung et al. 2020). Deletion, as leave-one-out: shorter "
            "sources are themselves off-distribution.",
        ),
        (
            "soft comprehensiveness / sufficiency (Soft-NC / Soft-NS)",
            "each element of source token j's embedding kept with probability 1 − q_j "
            "(comprehensiveness) or q_j (sufficiency), q the ranking's scores min–max normalised "
            "over the source; Soft-NC = max(0, p_t(y_t) − p'_t(y_t)) / (1 − S_0), Soft-NS = "
            "max(0, Soft-S − S_0) / (1 − S_0) with Soft-S = 1 − max(0, p_t(y_t) − p'_t(y_t)) and "
            "S_0 that sufficiency with every embedding zeroed, each the mean over the draws of its "
            "value under one mask (Zhao & Aletras 2023, §3); higher is more faithful for both.",
        ),
    ),
    terms=("95 % interval",),
    default=False,
    order=76,
    description="comprehensiveness and sufficiency (AOPC) per decoder step of attention, "
    "attribution and random rankings; removal by deletion (shorter sources are off-distribution "
    "too); cost per decoder step: at most 12 traces of the prefix per ranking and per random order "
    "(k = 1 and the 5 fractions' k, deleted and kept alone; a repeated k once), plus each "
    "attribution method's own; soft comprehensiveness and sufficiency with soft_draws = D: 2·D "
    "traces of the prefix per step and ranking",
    reference="DeYoung et al. 2020 (ERASER), §4; Zhao & Aletras 2023 (ACL), §3 (soft)",
)

PAD_ID = 0
MODES = ("comprehensiveness", "sufficiency")


def k_values(n: int, fractions) -> list[int]:
    """The k of each fraction for a source of n tokens: ⌈f · n⌉ within [1, n − 1] (n ≥ 2)."""
    return [min(max(1, math.ceil(f * n - 1e-9)), n - 1) for f in fractions]


def unavailable(model, batch: PreparedBatch, params: FaithfulnessParams) -> dict[str, str]:
    """The configured rankings this model lacks, with the reason: ``attention`` without traced
    attention ("no attention"), a gradient method without the ``gradients`` capability ("no
    input gradients")."""
    caps = capabilities(model)
    out = {}
    for r in params.rankings:
        if r == "attention" and batch.trace.attention is None:
            out[r] = "no attention"
        elif r in GRADIENT_METHODS and "gradients" not in caps:
            out[r] = "no input gradients"
    return out


def ranking_scores(
    model, batch: PreparedBatch, params: FaithfulnessParams, ctx: AblationContext
) -> dict[str, Tensor]:
    """The scores of every non-random ranking this model has: name → (B, T_y, T_x), higher first
    (absolute values of signed attributions), NaN at padding."""
    from ..attribution import attribute
    from .importance import loo_importance

    tr = batch.trace
    lacking = unavailable(model, batch, params)
    out: dict[str, Tensor] = {}
    for r in params.rankings:
        if r in lacking or r == "random":
            continue
        if r == "attention":
            out[r] = tr.attention.mean(1)
        elif r == "leave_one_out":
            out[r] = loo_importance(model, batch, ctx.chunk_rows)
        else:  # an attribution method
            out[r] = attribute(model, batch, r, chunk_rows=ctx.chunk_rows).abs()
    return out


def order_of(scores: Tensor, pad_mask: Tensor) -> Tensor:
    """Positions by descending score (ties: the earlier position first), padding last.

    Args:
        scores: (B, T_y, T_x); pad_mask: bool (B, T_x).

    Returns:
        long (B, T_y, T_x): ``order[b, t, r]`` is the position ranked r-th.
    """
    key = scores.double().nan_to_num(nan=-math.inf).masked_fill(pad_mask[:, None, :], -math.inf)
    return torch.sort(-key, dim=-1, stable=True).indices


def random_orders(
    tr, n_random: int, seed: int, example_ids, rng: str = "counter-1"
) -> list[Tensor]:
    """``n_random`` seeded random orders of the valid positions of every step (padding last),
    which do not depend on the batch: step t of an example draws from its stream (seed, example
    id, t, "faithfulness") — counter-based (``rng = "counter-1"``: order i is row i of the
    stream's :func:`~attnstudy.analysis.random_streams.permutations`, every step in one call;
    steps that are not real keep the valid positions in order) or, in the legacy scheme,
    ``step_generator``'s uniforms sorted descending.

    Returns:
        ``n_random`` long (B, T_y, T_x) orders.
    """
    b, t_y, t_x = tr.tgt_in.size(0), tr.tgt_in.size(1), tr.src.size(1)
    if rng != LEGACY:
        valid = ~tr.pad_mask.cpu()
        slots = valid_first(valid)  # (B, T_x): valid positions, then padding
        bs, ts = tr.step_mask.cpu().nonzero(as_tuple=True)
        keys = CounterStreams(seed, example_ids, SPEC.name).keys(bs.tolist(), ts.tolist())
        index = permutations(keys, n_random, valid.sum(-1)[bs].numpy(), t_x)  # (S, n, T_x)
        index = torch.from_numpy(index).to(slots.device)
        rows = slots[bs][:, None, :].expand(-1, n_random, -1).gather(-1, index)
        orders = slots[None, :, None, :].expand(n_random, b, t_y, t_x).clone()
        orders[:, bs, ts] = rows.transpose(0, 1)
        return list(orders.to(tr.src.device))
    # drawn on the CPU (the step generators are CPU generators), moved to the model's device below
    keys = torch.zeros(n_random, b, t_y, t_x, dtype=torch.float64, device="cpu")
    lengths = tr.src_lengths.tolist()
    for i in range(b):
        n = int(lengths[i])
        for t in range(int(tr.step_mask[i].sum())):
            g = step_generator(seed, example_ids[i], t, SPEC.name)
            keys[:, i, t, :n] = torch.rand(
                n_random, n, generator=g, dtype=torch.float64, device=g.device
            )
    return [order_of(k.to(tr.src.device), tr.pad_mask) for k in keys]


def _kept_sources(src: Tensor, keep: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's kept tokens in source order, PAD-padded: (R, T_x), lengths (R,)."""
    idx = torch.sort((~keep).long(), dim=1, stable=True).indices
    lengths = keep.sum(1)
    out = src.gather(1, idx)
    pos = torch.arange(src.size(1), device=src.device)[None, :]
    return out.masked_fill(pos >= lengths[:, None], PAD_ID), lengths


def drops(
    model, batch: PreparedBatch, orders: Tensor, ks: Tensor, chunk_rows: int = 4096
) -> Tensor:
    """Comprehensiveness and sufficiency of every step under several orders and k, batched.

    Args:
        model: the model (eval mode during the call, mode restored).
        batch: prepared batch (B, T_y, T_x), trace over the prefix.
        orders: long (O, B, T_y, T_x), positions most important first (:func:`order_of`).
        ks: long (B, K), the k of each example (1 ≤ k ≤ n − 1; rows of sources shorter than 2
            are not computed).
        chunk_rows: decoder rows (sources × T_y steps) per trace call.

    Returns:
        (2, O, B, T_y, K) float64: [0] comprehensiveness, [1] sufficiency, p_t(ŷ_t) minus the
        modified p_t(ŷ_t); NaN at padding steps and sources shorter than 2.
    """
    tr = batch.trace
    o, b, t_y, t_x = orders.shape
    k = ks.size(1)
    dev = tr.src.device
    out = torch.full((2, o, b, t_y, k), math.nan, dtype=torch.float64, device=dev)
    ok = tr.step_mask & (tr.src_lengths >= 2)[:, None]
    bb, tt = ok.nonzero(as_tuple=True)
    if bb.numel() == 0:
        return out
    # every row: (mode, order, step row, k)
    m_i, o_i, s_i, k_i = (
        g.reshape(-1)
        for g in torch.meshgrid(
            torch.arange(2, device=dev),
            torch.arange(o, device=dev),
            torch.arange(bb.numel(), device=dev),
            torch.arange(k, device=dev),
            indexing="ij",
        )
    )
    # a k that an earlier column of the same example has already (short sources: several
    # fractions give k = 1) is traced once and copied
    same = ks[:, :, None] == ks[:, None, :]  # (B, K, K)
    first = (same & torch.ones(k, k, dtype=torch.bool, device=dev).tril()).int().argmax(-1)
    fresh = (first == torch.arange(k, device=dev))[bb[s_i], k_i]
    m_i, o_i, s_i, k_i = m_i[fresh], o_i[fresh], s_i[fresh], k_i[fresh]
    rb, rt = bb[s_i], tt[s_i]
    kk = ks[rb, k_i]
    # sources of one length are traced together, unpadded: the numbers then do not depend on
    # which other sources share the batch (padding changes a Transformer's sums in the last bits)
    new_len = torch.where(m_i == 0, tr.src_lengths[rb] - kk, kk)
    by_len = torch.sort(new_len, stable=True).indices
    per_chunk = max(1, chunk_rows // t_y)
    with eval_mode(model), torch.no_grad():
        base = _emitted_probs(
            model, tr, torch.arange(b, device=dev), tr.src, tr.src_lengths, per_chunk
        )
        for length in torch.unique(new_len).tolist():
            group = by_len[new_len[by_len] == length]
            for start in range(0, group.numel(), per_chunk):
                rows = group[start : start + per_chunk]
                cb, ct, cm, co = rb[rows], rt[rows], m_i[rows], o_i[rows]
                order = orders[co, cb, ct]  # (R, T_x)
                rank = torch.empty_like(order).scatter_(
                    1, order, torch.arange(t_x, device=dev).expand_as(order).contiguous()
                )
                top = rank < kk[rows][:, None]
                keep = torch.where(cm[:, None] == 0, ~top, top) & ~tr.pad_mask[cb]
                src, lengths = _kept_sources(tr.src[cb], keep)
                p_t = _emitted_probs(model, tr, cb, src[:, :length], lengths, len(rows))
                out[cm, co, cb, ct, k_i[rows]] = (
                    base[cb, ct] - p_t[torch.arange(len(rows), device=p_t.device), ct]
                )
    # duplicates take their first column's values
    return out.gather(-1, first[None, None, :, None, :].expand_as(out))


def _emitted_probs(
    model,
    tr,
    rows: Tensor,
    src: Tensor,
    lengths: Tensor,
    per_chunk: int,
    embedded: Tensor | None = None,
) -> Tensor:
    """p_t(ŷ_t) at every step of the prefixes of batch ``rows`` over the sources ``src`` (or
    through the source embeddings ``embedded``, (R, T_x, E)), each length traced alone (no
    padding), float64: (R, T_y)."""
    out = torch.empty(rows.numel(), tr.tgt_in.size(1), dtype=torch.float64, device=src.device)
    for length in torch.unique(lengths).tolist():
        idx = (lengths == length).nonzero()[:, 0]
        for start in range(0, idx.numel(), per_chunk):
            i = idx[start : start + per_chunk]
            r = rows[i]
            emb = None if embedded is None else embedded[i, :length]
            trace = model.trace(src[i, :length], lengths[i], tr.tgt_in[r], tr.tgt_out[r], emb)
            p = torch.softmax(trace.logits.double(), -1)
            out[i] = p.gather(-1, tr.tgt_out[r][..., None])[..., 0]
    return out


def reference_drops(model, batch: PreparedBatch, order: Tensor, k: int, mode: str) -> Tensor:
    """Plain-loop reference of :func:`drops`: one step, one order, one k, one source at a time.

    Args:
        order: long (B, T_y, T_x) (one ranking); k: tokens (capped at n − 1); mode:
            ``"comprehensiveness"`` or ``"sufficiency"``.

    Returns:
        (B, T_y) float64, NaN where :func:`drops` is.
    """
    tr = batch.trace
    b, t_y = tr.tgt_in.shape
    out = torch.full((b, t_y), math.nan, dtype=torch.float64, device=tr.src.device)
    with eval_mode(model), torch.no_grad():
        for i in range(b):
            n = int(tr.src_lengths[i])
            if n < 2:
                continue
            kk = min(k, n - 1)
            for t in range(int(tr.step_mask[i].sum())):
                top = set(order[i, t, :kk].tolist())
                kept = [j for j in range(n) if (j in top) == (mode == "sufficiency")]
                src = tr.src[i, kept][None]
                lengths = torch.tensor([len(kept)], device=src.device)
                full = model.trace(src, lengths, tr.tgt_in[i : i + 1], tr.tgt_out[i : i + 1])
                base = model.trace(
                    tr.src[i : i + 1, :n],
                    torch.tensor([n], device=src.device),
                    tr.tgt_in[i : i + 1],
                    tr.tgt_out[i : i + 1],
                )
                y = tr.tgt_out[i, t]
                p = torch.softmax(full.logits[0, t].double(), -1)[y]
                p0 = torch.softmax(base.logits[0, t].double(), -1)[y]
                out[i, t] = float(p0 - p)
    return out


SOFT_PURPOSE = "faithfulness_soft"
"""The streams of the soft masks: (seed, example id, step, ``"faithfulness_soft"``)."""
SOFT_MIN_DROP = 0.01
"""The least p_t(ŷ_t) − p_t(ŷ_t | every embedding zeroed), 1 − S_0, that soft comprehensiveness
and sufficiency are normalised by: below it the source hardly matters to the step, and the
normalised numbers would mostly be float noise (float32 probabilities differ by ~1e-7 between
batchings; divided by 0.01 that stays below 1e-5); both are undefined there."""
SOFT_MIN_SPAN = 1e-4
"""A step's scores that span less than this (in the ranking's own unit: attention weight, TVD,
nats) rank nothing for the soft criteria (q = 0 everywhere): min–max normalising them would turn
float noise into keep probabilities."""


def normalised_scores(scores: Tensor, pad_mask: Tensor) -> Tensor:
    """A ranking's scores min–max normalised over each step's valid positions (Zhao & Aletras
    2023, §3: the Bernoulli probabilities q come from the importance normalised to [0, 1]); a
    step whose scores span less than :data:`SOFT_MIN_SPAN` (nothing ranked, e.g. all zero) has
    q = 0 everywhere.

    Args:
        scores: (..., B, T_y, T_x), higher first (NaN read as 0); pad_mask: bool (B, T_x).

    Returns:
        float64, same shape, in [0, 1]; 0 at padding.
    """
    valid = ~pad_mask[:, None, :]
    x = scores.double().nan_to_num(nan=0.0)
    low = x.masked_fill(~valid, math.inf).amin(-1, keepdim=True)
    high = x.masked_fill(~valid, -math.inf).amax(-1, keepdim=True)
    span = high - low
    q = (x - low) / torch.where(span > 0, span, torch.ones_like(span))
    return q.masked_fill((span < SOFT_MIN_SPAN) | ~valid, 0.0).clamp(0.0, 1.0)


def random_scores(tr, n_random: int, seed: int, example_ids) -> Tensor:
    """Scores whose orders are :func:`random_orders`' counter-based ones: score i of position j
    at a step is 1 − w/2³², w the word of the step's ``"faithfulness"`` stream that random order
    i sorts position j by (so order i ranks the positions as these scores do).

    Returns:
        float64 (n_random, B, T_y, T_x); 0 at padding and padding steps.
    """
    b, t_y, t_x = tr.tgt_in.size(0), tr.tgt_in.size(1), tr.src.size(1)
    out = np.zeros((n_random, b, t_y, t_x), dtype=np.float64)  # filled on the host, moved once
    bs, ts = tr.step_mask.cpu().nonzero(as_tuple=True)
    if bs.numel() > 0:
        n = tr.src_lengths.cpu()[bs].numpy()
        keys = CounterStreams(seed, example_ids, SPEC.name).keys(bs.tolist(), ts.tolist())
        flat = words(keys, n_random * n)  # each step's words, concatenated
        start = 0
        for bb, tt, k in zip(bs.tolist(), ts.tolist(), n.tolist()):
            w = flat[start : start + n_random * k].reshape(n_random, k).astype(np.float64)
            out[:, bb, tt, :k] = 1.0 - w * 2.0**-32
            start += n_random * k
    return torch.from_numpy(out).to(tr.src.device)


def soft_words(
    seed: int,
    example_ids,
    rows,
    step: int,
    n: int,
    dim: int,
    draws: int,
    *,
    device: torch.device | str = "cpu",
) -> Tensor:
    """The 32-bit words behind the soft masks of one step of some batch rows: word
    ((d · 2 + m) · n + j) · dim + e of the step's ``"faithfulness_soft"`` stream decides element e
    of source token j's embedding in draw d, criterion m (0 comprehensiveness, 1 sufficiency):
    kept where it is below q · 2³² (q the keep probability). Every ranking uses the same words
    (common random numbers), and the first draws do not depend on ``draws``.

    Returns:
        int64 (len(rows), draws, 2, n, dim) on ``device`` (the same words on every device).
    """
    keys = CounterStreams(seed, example_ids, SOFT_PURPOSE).keys(list(rows), [step] * len(rows))
    w = words(keys, draws * 2 * n * dim).reshape(len(rows), draws, 2, n, dim)
    return torch.from_numpy(w.astype(np.int64)).to(device)


def soft_drops(
    model,
    batch: PreparedBatch,
    q: Tensor,
    draws: int,
    seed: int,
    chunk_rows: int = 4096,
) -> Tensor:
    """Soft normalised comprehensiveness and sufficiency (Zhao & Aletras 2023, §3) of every step
    under several score vectors.

    Step t's source embeddings x (the contract's ``embed``, what the gradient methods
    differentiate) are multiplied element-wise by a Bernoulli mask: element e of token j is kept
    with probability 1 − q_tj (comprehensiveness: the more important, the more erased) or q_tj
    (sufficiency), decided by :func:`soft_words`; the prefix up to step t is traced through the
    masked embeddings (unpadded, rows of one source length and step together). With p = p_t(ŷ_t),
    p' the masked one and p_0 the one with every embedding zeroed, S_0 = 1 − max(0, p − p_0):

        Soft-NC = max(0, p − p') / (1 − S_0),
        Soft-NS = max(0, Soft-S − S_0) / (1 − S_0),  Soft-S = 1 − max(0, p − p'),

    each the mean over the draws of its value under one mask (the paper's form, one mask per
    instance, for every number of draws: Soft-NS clipped per draw, so its expectation does not
    depend on ``draws``, only its noise). Both are higher where the scores are more faithful.

    Args:
        model: a model with ``embed`` and ``trace(embedded=…)`` (eval mode during the call).
        batch: prepared batch (B, T_y, T_x), trace over the prefix.
        q: (O, B, T_y, T_x) keep scores in [0, 1] (:func:`normalised_scores`).
        draws: masks per step, score vector and criterion. seed: the ablation seed.
        chunk_rows: decoder rows (masked sources × steps traced) per trace call.

    Returns:
        (2, O, B, T_y) float64: [0] Soft-NC, [1] Soft-NS; NaN at padding steps and where
        1 − S_0 < :data:`SOFT_MIN_DROP`.
    """
    tr = batch.trace
    o, b, t_y, _ = q.shape
    dev = tr.src.device
    ids = batch.example_ids
    mean = torch.zeros(2, o, b, t_y, dtype=torch.float64, device=dev)
    with eval_mode(model), torch.no_grad():
        emb = model.embed(tr.src)  # (B, T_x, E)
        dim = emb.size(-1)
        rows_all = torch.arange(b, device=dev)
        per_chunk = max(1, chunk_rows // t_y)
        base = _emitted_probs(model, tr, rows_all, tr.src, tr.src_lengths, per_chunk)
        zero = _emitted_probs(
            model, tr, rows_all, tr.src, tr.src_lengths, per_chunk, torch.zeros_like(emb)
        )
        denom = (base - zero).clamp_min(0.0)  # 1 − S_0
        bs, ts = tr.step_mask.nonzero(as_tuple=True)
        groups: dict[tuple[int, int], list[int]] = {}
        for bb, tt in zip(bs.tolist(), ts.tolist()):
            groups.setdefault((int(tr.src_lengths[bb]), tt), []).append(bb)
        for (n, t), members in groups.items():
            rows = torch.tensor(members, device=dev)
            w = soft_words(seed, ids, members, t, n, dim, draws, device=dev)  # (G, D, 2, n, E)
            keep = q[:, rows, t, :n]  # (O, G, n)
            # thresholds q · 2³² (q = 1: every word is below; q = 0: none)
            thresh = torch.stack([1.0 - keep, keep], 2) * 2.0**32  # (O, G, 2, n)
            total = o * len(members) * draws * 2
            per = max(1, chunk_rows // (t + 1))
            for start in range(0, total, per):
                r = torch.arange(start, min(total, start + per), device=dev)
                oi, gi, di, mi = torch.unravel_index(r, (o, len(members), draws, 2))
                mask = w[gi, di, mi].double() < thresh[oi, gi, mi][..., None]  # (R, n, E)
                x = emb[rows[gi], :n] * mask.to(emb.dtype)
                src, lengths = tr.src[rows[gi], :n], tr.src_lengths[rows[gi]]
                out = model.trace(
                    src, lengths, tr.tgt_in[rows[gi], : t + 1], tr.tgt_out[rows[gi], : t + 1], x
                )
                p = torch.softmax(out.logits[:, t].double(), -1)
                p = p.gather(-1, tr.tgt_out[rows[gi], t][:, None])[:, 0]
                drop = (base[rows[gi], t] - p).clamp_min(0.0)  # max(0, p − p')
                # comprehensiveness: max(0, p − p'); sufficiency: max(0, Soft-S − S_0) with
                # Soft-S − S_0 = (1 − max(0, p − p')) − (1 − (1 − S_0)) = (1 − S_0) − drop
                kept = (denom[rows[gi], t] - drop).clamp_min(0.0)
                value = torch.where(mi == 0, drop, kept) / draws
                mean.index_put_((mi, oi, rows[gi], torch.full_like(r, t)), value, accumulate=True)
    ok = tr.step_mask & (denom >= SOFT_MIN_DROP)
    return (mean / denom).masked_fill(~ok, math.nan)


def reference_soft_drops(model, batch: PreparedBatch, q: Tensor, draws: int, seed: int) -> Tensor:
    """Plain-loop reference of :func:`soft_drops`: one (example, step, score vector, draw,
    criterion) at a time, each mask built element by element from :func:`soft_words`'s words and
    the whole prefix traced.

    Returns:
        (2, O, B, T_y) float64, NaN where :func:`soft_drops` is.
    """
    tr = batch.trace
    o, b, t_y, _ = q.shape
    out = torch.full((2, o, b, t_y), math.nan, dtype=torch.float64, device=tr.src.device)
    with eval_mode(model), torch.no_grad():
        for i in range(b):
            n = int(tr.src_lengths[i])
            src, lengths = tr.src[i : i + 1, :n], tr.src_lengths[i : i + 1]
            tgt_in, tgt_out = tr.tgt_in[i : i + 1], tr.tgt_out[i : i + 1]
            emb = model.embed(src)
            full = torch.softmax(model.trace(src, lengths, tgt_in, tgt_out).logits.double(), -1)
            zero = model.trace(src, lengths, tgt_in, tgt_out, torch.zeros_like(emb)).logits
            zero = torch.softmax(zero.double(), -1)
            for t in tr.step_mask[i].nonzero()[:, 0].tolist():
                y = int(tr.tgt_out[i, t])
                p, p0 = float(full[0, t, y]), float(zero[0, t, y])
                s0 = 1.0 - max(0.0, p - p0)
                if 1.0 - s0 < SOFT_MIN_DROP:
                    continue
                w = soft_words(
                    seed, batch.example_ids, [i], t, n, emb.size(-1), draws, device=emb.device
                )[0]
                for k in range(o):
                    soft_c, soft_ns = 0.0, 0.0
                    for d in range(draws):
                        for m in range(2):
                            keep = q[k, i, t, :n].double()
                            keep = 1.0 - keep if m == 0 else keep
                            mask = torch.empty(n, emb.size(-1), device=emb.device)
                            for j in range(n):
                                for e in range(emb.size(-1)):
                                    mask[j, e] = float(w[d, m, j, e] < keep[j] * 2.0**32)
                            x = emb * mask[None].to(emb.dtype)
                            lp = model.trace(src, lengths, tgt_in, tgt_out, x).logits[0, t]
                            p1 = float(torch.softmax(lp.double(), -1)[y])
                            if m == 0:
                                soft_c += max(0.0, p - p1) / draws
                            else:  # this draw's Soft-S, then max(0, Soft-S − S_0)
                                soft_s = 1.0 - max(0.0, p - p1)
                                soft_ns += max(0.0, soft_s - s0) / draws
                    out[0, k, i, t] = soft_c / (1.0 - s0)
                    out[1, k, i, t] = soft_ns / (1.0 - s0)
    return out


def run(model, batch: PreparedBatch, params: FaithfulnessParams, ctx: AblationContext):
    """Comprehensiveness and sufficiency (AOPC) per decoder step for each ranking.

    Returns:
        One row per real step: ``example_id``, ``step``, ``faithfulness_skipped`` (fewer than
        two source tokens), and per configured ranking r ``faithfulness_comprehensiveness_<r>``,
        ``faithfulness_sufficiency_<r>`` (AOPC over ``fractions``) and
        ``faithfulness_comprehensiveness_top1_<r>`` (k = 1), probabilities' drops (NaN when
        skipped); a ranking the model lacks (:func:`unavailable`) is NaN at every step and
        ``faithfulness_<r>_reason`` says why.
    """
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    scores = ranking_scores(model, batch, params, ctx)
    names = list(scores)
    orders = [order_of(s, tr.pad_mask) for s in scores.values()]
    n_rand = params.n_random if "random" in params.rankings else 0
    orders += random_orders(tr, n_rand, ctx.seed, batch.example_ids, ctx.rng)
    lengths = tr.src_lengths.tolist()
    # k = 1 first, then the fractions' k
    ks = torch.tensor(
        [[1, *k_values(max(n, 2), params.fractions)] for n in lengths],
        dtype=torch.long,
        device=tr.src.device,
    )
    if orders:
        d = drops(model, batch, torch.stack(orders), ks, ctx.chunk_rows)  # (2, O, B, T_y, K)
    else:  # every configured ranking is one the model lacks
        d = torch.empty(
            2, 0, *tr.step_mask.shape, ks.size(1), dtype=torch.float64, device=tr.src.device
        )
    named = {r: d[:, i] for i, r in enumerate(names)}
    if n_rand:
        named["random"] = d[:, len(names) :].mean(1)
    nan = torch.full(
        (2, *tr.step_mask.shape, ks.size(1)), math.nan, dtype=torch.float64, device=tr.src.device
    )
    lacking = unavailable(model, batch, params)
    for r in params.rankings:
        # a ranking the model lacks is undefined at every step
        comp, suff = named.get(r, nan)  # (B, T_y, K) each
        for col, v in (
            (f"faithfulness_comprehensiveness_{r}", comp[..., 1:].mean(-1)),
            (f"faithfulness_sufficiency_{r}", suff[..., 1:].mean(-1)),
            (f"faithfulness_comprehensiveness_top1_{r}", comp[..., 0]),
        ):
            frame[col] = v[b_idx, t_idx].cpu().numpy()
    for r, why in lacking.items():
        frame[f"faithfulness_{r}_reason"] = why
    if params.soft_draws:
        _soft_columns(frame, model, batch, params, ctx, scores, b_idx, t_idx)
    frame["faithfulness_skipped"] = np.asarray([lengths[i] < 2 for i in b_idx.tolist()], bool)
    return frame


REASON_NO_EMBEDDINGS = "no source embeddings to mask (the gradients capability)"


def _soft_columns(frame, model, batch, params, ctx, scores, b_idx, t_idx) -> None:
    """``faithfulness_soft_comprehensiveness_<r>`` and ``faithfulness_soft_sufficiency_<r>``
    (:func:`soft_drops`) of every configured ranking into ``frame``: the rankings' own scores,
    random's :func:`random_scores` (their mean); NaN for a ranking the model lacks, for sources
    shorter than 2 (the step is skipped) and at every step of a model without ``embed``
    (``faithfulness_soft_reason``)."""
    tr = batch.trace
    vectors = list(scores.values())
    n_rand = params.n_random if "random" in params.rankings else 0
    named: dict[str, Tensor] = {}
    if "gradients" not in capabilities(model):
        frame["faithfulness_soft_reason"] = REASON_NO_EMBEDDINGS
    elif vectors or n_rand:
        parts = [torch.stack(vectors).double()] if vectors else []
        if n_rand:
            parts.append(random_scores(tr, n_rand, ctx.seed, batch.example_ids))
        q = normalised_scores(torch.cat(parts), tr.pad_mask)
        d = soft_drops(model, batch, q, params.soft_draws, ctx.seed, ctx.chunk_rows)
        named = {r: d[:, i] for i, r in enumerate(scores)}
        if n_rand:
            named["random"] = d[:, len(scores) :].mean(1)
    short = (tr.src_lengths < 2)[b_idx].cpu().numpy()
    for r in params.rankings:
        for m, mode in enumerate(MODES):
            v = named[r][m][b_idx, t_idx].cpu().numpy() if r in named else math.nan
            frame[f"faithfulness_soft_{mode}_{r}"] = np.where(short, math.nan, v)


__all__ = [
    "drops",
    "normalised_scores",
    "random_scores",
    "reference_soft_drops",
    "soft_drops",
    "soft_words",
    "k_values",
    "order_of",
    "random_orders",
    "ranking_scores",
    "reference_drops",
    "run",
    "unavailable",
]
