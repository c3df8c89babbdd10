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
from pydantic import Field, field_validator
from torch import Tensor

from attnstudy.models import eval_mode

from .._chunks import step_frame
from ..batch import AblationContext, PreparedBatch, step_generator
from ..contract import capabilities
from ..interventions import valid_first
from ..random_streams import LEGACY, CounterStreams, permutations


class FaithfulnessParams(Params):
    """Settings of ``[ablation.faithfulness]``.

    Attributes:
        rankings: which rankings are tested (of :attr:`RANKINGS`; each attribution method runs
            with its default settings); one not available for a model (attention of the
            ``none`` model, a gradient method without the ``gradients`` capability) is undefined
            for it, with the reason.
        n_random: seeded random orders per step (the ``random`` ranking is their mean).
        fractions: the k of the AOPC as shares of the source length (k = ⌈f · n⌉, 1 ≤ k ≤ n − 1).
    """

    RANKINGS: ClassVar[dict[str, str]] = {**IMPORTANCE_LABELS, "random": "random"}
    """Every ranking: name → label (the report's columns, the figure, the verdict); the
    importance measures of the registry, then random orders."""
    rankings: tuple[str, ...] = Field(
        ("attention", "input_x_gradient", "leave_one_out", "random"), min_length=1
    )
    n_random: int = Field(3, ge=1, le=100)
    fractions: tuple[float, ...] = Field((0.01, 0.05, 0.1, 0.2, 0.5), min_length=1, max_length=20)

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
                # the verdict's faithfulness sentence: the comprehensiveness AOPCs compete
                verdict=VerdictRole(
                    "faithful",
                    "ranking",
                    measure=label,
                    phrase="{fmt} for random orders" if r == "random" else "",
                )
                if mode == "comprehensiveness"
                else None,
            )
            for mode, direction in (("comprehensiveness", "higher"), ("sufficiency", "lower"))
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
            "orders, which delete as many tokens.",
            order=35,
        )
    },
    figure=Figure(
        "faithfulness",
        "Comprehensiveness and sufficiency of each ranking",
        "AOPC of the drop of p(y_t) when the top-ranked source tokens are deleted "
        "(comprehensiveness, higher is more faithful) or are all that is kept (sufficiency, "
        "lower is more faithful), per ranking and model; 95 % bootstrap intervals over examples. "
        "Random: the mean of seeded random orders.",
    ),
    definitions=(
        (
            "comprehensiveness / sufficiency",
            "p_t(y_t) minus p_t(y_t) with the top-k source tokens of a ranking deleted / with only "
            "them kept, averaged over k (AOPC) = ⌈f·n⌉ for f = 1, 5, 10, 20, 50 % of the n source "
            "tokens, 1 ≤ k ≤ n − 1 (DeYoung et al. 2020). Deletion, as leave-one-out: shorter "
            "sources are themselves off-distribution.",
        ),
    ),
    terms=("95 % interval",),
    default=False,
    order=76,
    description="comprehensiveness and sufficiency (AOPC) per decoder step of attention, "
    "attribution and random rankings; removal by deletion (shorter sources are off-distribution "
    "too); cost per decoder step: at most 12 traces of the prefix per ranking and per random order "
    "(k = 1 and the 5 fractions' k, deleted and kept alone; a repeated k once), plus each "
    "attribution method's own",
    reference="DeYoung et al. 2020 (ERASER), §4",
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


def _emitted_probs(model, tr, rows: Tensor, src: Tensor, lengths: Tensor, per_chunk: int) -> Tensor:
    """p_t(ŷ_t) at every step of the prefixes of batch ``rows`` over the sources ``src``, each
    length traced alone (no padding), float64: (R, T_y)."""
    out = torch.empty(rows.numel(), tr.tgt_in.size(1), dtype=torch.float64, device=src.device)
    for length in torch.unique(lengths).tolist():
        idx = (lengths == length).nonzero()[:, 0]
        for start in range(0, idx.numel(), per_chunk):
            i = idx[start : start + per_chunk]
            r = rows[i]
            trace = model.trace(src[i, :length], lengths[i], tr.tgt_in[r], tr.tgt_out[r])
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
    frame["faithfulness_skipped"] = np.asarray([lengths[i] < 2 for i in b_idx.tolist()], bool)
    return frame


__all__ = [
    "drops",
    "k_values",
    "order_of",
    "random_orders",
    "ranking_scores",
    "reference_drops",
    "run",
    "unavailable",
]
