"""Erase until the decision flips (Serrano & Smith 2019, "Is Attention Interpretable?", ACL, §4).

Zero items one at a time in a ranking order until the argmax changes; rankings: attention ↓,
  attention ↑, random (``n_random_orders`` of them),
  gradient of the predicted token's log-probability w.r.t. the attention ↓, gradient ×
  attention ↓. All k-prefixes of all steps, of every ranking's orders, form the P axis of one
  ``logits_given_attention`` call per example chunk.

Erasing every valid position is not allowed (no distribution would be left): erasure stops after
n_valid − 1 items; a step that never flipped by then reports NaN fractions and
``never_flipped``. Multi-head models: a position is erased in every head; rankings use the head
mean of the attention, the head sum of the gradient (the gradient w.r.t. erasing a position in
all heads) and Σ_h g_h α_h for gradient × attention.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import AblationSpec, Figure, Params, Stat
from pydantic import Field
from torch import Tensor

from attnstudy.models import Seq2Seq, Trace, eval_mode, gradients_in_eval

from .._chunks import base_probs, n_valid, require_attention, step_frame, sub_trace, trace_chunks
from ..batch import AblationContext, PreparedBatch, step_generator, step_seed
from ..interventions import erase_ranked, valid_first
from ..random_streams import LEGACY, CounterStreams, permutations, permutations_loop

RANKINGS = ("attn_desc", "attn_asc", "random", "grad_desc", "grad_attn_desc")
"""Ranking names as they appear in the columns ``erase_<ranking>_…``."""

ERASE_PURPOSE = "erase_random"
"""The counter-based streams' purpose of the random orders (order i is row i of a step's
stream); the legacy scheme has one generator per order, ``"erase_random/i"``."""


class EraseUntilFlipParams(Params):
    """``[ablation.erase_until_flip]``."""

    n_random_orders: int = Field(5, ge=1, le=1000, description="random erasure orders per step")


SPEC = AblationSpec(
    name="erase_until_flip",
    run="attnstudy.analysis.ablations.erase_until_flip:run",
    params=EraseUntilFlipParams,
    requires=("attention", "local", "gradients"),
    stats={  # in battery order; the report's columns follow each Stat's order
        "attn_desc_frac_positions": Stat(
            "erase_attn_desc_frac_positions",
            label="positions erased to flip, attention ↓",
            unit="fraction of positions",
            question="erasure",
            order=51,
        ),
        "attn_desc_frac_mass": Stat("erase_attn_desc_frac_mass"),
        "attn_desc_never_flipped": Stat(
            "erase_attn_desc_never_flipped",
            label="never flipped, attention ↓",
            question="erasure",
            order=50,
        ),
        "attn_asc_frac_positions": Stat("erase_attn_asc_frac_positions"),
        "attn_asc_frac_mass": Stat("erase_attn_asc_frac_mass"),
        "attn_asc_never_flipped": Stat(
            "erase_attn_asc_never_flipped",
            label="never flipped, attention ↑",
            question="erasure",
            order=50,
        ),
        "random_frac_positions": Stat(
            "erase_random_frac_positions",
            label="positions erased to flip, random",
            unit="fraction of positions",
            question="erasure",
            order=51,
        ),
        "random_frac_mass": Stat("erase_random_frac_mass"),
        "random_never_flipped": Stat(
            "erase_random_never_flipped",
            label="never flipped, random",
            question="erasure",
            order=50,
        ),
        "grad_desc_frac_positions": Stat("erase_grad_desc_frac_positions"),
        "grad_desc_frac_mass": Stat("erase_grad_desc_frac_mass"),
        "grad_desc_never_flipped": Stat("erase_grad_desc_never_flipped"),
        "grad_attn_desc_frac_positions": Stat("erase_grad_attn_desc_frac_positions"),
        "grad_attn_desc_frac_mass": Stat("erase_grad_attn_desc_frac_mass"),
        "grad_attn_desc_never_flipped": Stat("erase_grad_attn_desc_never_flipped"),
    },
    skip_column="erase_until_flip_skipped",
    figure=Figure(
        "erasure",
        "Erasure: how much must be removed before the decision flips?",
        "Serrano & Smith (2019) §4: positions are erased one at a time in each order until the "
        "predicted token changes. Left: the share of steps that never flipped (all but one "
        "position erased); middle and right: over the steps that did flip, the fraction of "
        "positions and of attention mass erased first. If attention ranks importance well, "
        "'attention ↓' flips soonest and 'attention ↑' almost never. Numbers: steps per bar.",
        order=75,  # after the importance figure, before alignment's
    ),
    definitions=(
        (
            "erase-until-flip",
            "positions erased one at a time in a ranking order until the prediction flips "
            "(Serrano & Smith 2019, §4); orders: attention ↓/↑, random, gradient of log p_t "
            "w.r.t. the attention ↓, gradient × attention ↓.",
        ),
    ),
    examples=(),  # its rankings' numbers per step only: the per-step table and the report
    order=50,
    description="items erased one by one in five rankings until the argmax flips; fraction of positions "
    "and of attention mass erased, never-flipped share",
    reference="Serrano & Smith 2019, §4",
)


def attention_gradient(
    model: Seq2Seq, trace: Trace, target: Tensor, chunk_rows: int = 4096
) -> Tensor:
    """∂ log p_t(target_t) / ∂ α_t for every real step, through ``logits_given_attention``.

    Each step's logits depend only on its own row (the prefix state is fixed), so one backward
    pass of the sum over steps gives every row's gradient.

    Args:
        trace: the trace (its attention is the point of differentiation).
        target: long (B, T_y), the token whose log-probability is differentiated (the prediction).

    Returns:
        (B, H, T_y, T_x); 0 at steps that are not real.
    """
    weights = trace.attention.detach().clone().requires_grad_(True)
    with gradients_in_eval():
        logits = model.logits_given_attention(trace, weights, chunk_rows)
        logp = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        (grad,) = torch.autograd.grad((logp * trace.step_mask).sum(), weights)
    return grad


def _order(score: Tensor, valid: Tensor) -> Tensor:
    """Positions by descending ``score`` (stable: ties keep position order), padding last.

    ``score``: (B, T_y, T_x); ``valid``: (B, T_x). Returns long (B, T_y, T_x).
    """
    key = (-score).masked_fill(~valid[:, None, :], float("inf"))
    return torch.sort(key, dim=-1, stable=True).indices


def ranking_orders(
    model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext, pred: Tensor
) -> dict[str, Tensor]:
    """Erasure orders of every ranking, each long (B, T_y, T_x), valid positions first.

    Random orders are keyed ``random/0`` … ``random/{n-1}`` (:func:`random_orders`, in
    ``ctx.rng``'s scheme).
    """
    tr = batch.trace
    att = tr.attention
    valid = ~tr.pad_mask
    mean_att = att.mean(1)
    grad = attention_gradient(model, tr, pred, ctx.chunk_rows)
    orders = {
        "attn_desc": _order(mean_att, valid),
        "attn_asc": _order(-mean_att, valid),
        "grad_desc": _order(grad.sum(1), valid),
        "grad_attn_desc": _order((grad * att).sum(1), valid),
    }
    randoms = random_orders(
        valid,
        tr.step_mask,
        batch.example_ids,
        seed=ctx.seed,
        n=params.n_random_orders,
        rng=ctx.rng,
    )
    for i, order in enumerate(randoms):
        orders[f"random/{i}"] = order.to(tr.src.device)
    return orders


def random_orders(
    valid: Tensor,
    step_mask: Tensor,
    example_ids: Sequence[str],
    *,
    seed: int,
    n: int,
    rng: str = "counter-1",
) -> list[Tensor]:
    """The ``n`` random erasure orders of every real step, drawn as :func:`random_orders_loop`.

    Counter-based streams (``rng = "counter-1"``): step (b, t)'s i-th order is its valid positions
    (ascending) permuted by row i of the stream (seed, example_ids[b], t, "erase_random")
    (:func:`attnstudy.analysis.random_streams.permutations`, every step in one call), then its
    padding positions (ascending). Legacy (``"legacy"``), exactly the loop's orders: step (b,
    t)'s i-th order is its valid positions (ascending)
    permuted by ``torch.randperm(n_valid, generator=step_generator(seed, example_ids[b], t,
    "erase_random/i"))``, then its padding positions (ascending); steps that are not real keep
    0, 1, …, T_x − 1. One CPU generator is reseeded per draw (:func:`step_seed`, the seed
    ``step_generator`` uses: the same stream) instead of one built per draw, the draws go into
    one buffer and the positions are gathered for all steps at once.

    Args:
        valid: bool (B, T_x), True at real positions. step_mask: bool (B, T_y), the real steps.
        example_ids: the example id of each batch row. seed: the ablation seed. n: orders.
        rng: the scheme, ``"counter-1"`` or ``"legacy"``.

    Returns:
        ``n`` long tensors (B, T_y, T_x), on the CPU.
    """
    cpu = torch.device("cpu")
    valid, step_mask = valid.to(cpu), step_mask.to(cpu)
    t_x = valid.size(1)
    base = torch.arange(t_x, device=cpu).expand(step_mask.shape + (t_x,))
    todo = step_mask.nonzero()  # (S, 2)
    bs, ts = todo[:, 0], todo[:, 1]
    nv = valid.sum(-1)
    slots = valid_first(valid)[bs]  # (S, T_x)
    step_nv = nv[bs]
    if rng != LEGACY:
        keys = CounterStreams(seed, example_ids, ERASE_PURPOSE).keys(bs.tolist(), ts.tolist())
        index = torch.from_numpy(permutations(keys, n, step_nv.numpy(), t_x)).to(cpu)  # (S, n, T_x)
        orders = slots[:, None, :].expand(index.shape).gather(-1, index)
        out = []
        for i in range(n):
            order = base.clone()
            order[bs, ts] = orders[:, i]
            out.append(order)
        return out
    draws = [
        (b, t, k)
        for (b, t), k in zip(todo.tolist(), step_nv.tolist())
        if k >= 2  # randperm(0 or 1) is the identity
    ]
    # the drawn columns of the buffer, row-major: the draws concatenated in (b, t) order
    drawn = (torch.arange(t_x, device=cpu) < step_nv[:, None]) & (step_nv >= 2)[:, None]
    shared = torch.Generator(device=cpu)
    out = []
    for i in range(n):
        index = torch.arange(t_x, device=cpu).repeat(todo.size(0), 1)  # (S, T_x)
        stream = f"erase_random/{i}"
        perms = [
            torch.randperm(
                k,
                generator=shared.manual_seed(step_seed(seed, example_ids[b], t, stream)),
                device=cpu,
            )
            for b, t, k in draws
        ]
        if perms:
            index[drawn] = torch.cat(perms)
        order = base.clone()
        order[bs, ts] = slots.gather(-1, index)
        out.append(order)
    return out


def random_orders_loop(
    valid: Tensor,
    step_mask: Tensor,
    example_ids: Sequence[str],
    *,
    seed: int,
    n: int,
    rng: str = "counter-1",
) -> list[Tensor]:
    """Plain per-step reference of :func:`random_orders` (per real step and order: the
    counter-based stream's row drawn alone, or a generator and a ``torch.randperm`` in the legacy
    scheme), the test oracle of the batched version; same arguments, same result."""
    cpu = torch.device("cpu")
    valid_cpu, real = valid.to(cpu), step_mask.to(cpu).nonzero().tolist()
    t_x = valid.size(1)
    base = torch.arange(t_x, device=cpu).expand(step_mask.shape + (t_x,))
    streams = CounterStreams(seed, example_ids, ERASE_PURPOSE)
    out = []
    for i in range(n):
        order = base.clone()
        for b, t in real:
            pos = valid_cpu[b].nonzero()[:, 0]
            if rng != LEGACY:
                k = pos.numel()
                row = permutations_loop(streams.keys([b], [t]), n, [k], k)[0, i]
                draw = torch.from_numpy(row).to(cpu)
            else:
                gen = step_generator(seed, example_ids[b], t, f"erase_random/{i}")
                draw = torch.randperm(pos.numel(), generator=gen, device=gen.device)
            order[b, t, : pos.numel()] = pos[draw]
            order[b, t, pos.numel() :] = (~valid_cpu[b]).nonzero()[:, 0]
        out.append(order)
    return out


def erase_until_flip(
    model: Seq2Seq, trace: Trace, order: Tensor, pred: Tensor, steps: Tensor, chunk_rows: int = 4096
) -> Tensor:
    """Smallest number of erased items (in ``order``) that changes the argmax, per step.

    All prefixes k = 1 … n_valid − 1 of every step, of every order, are evaluated as one P axis
    (orders × prefixes) per example chunk (Serrano & Smith 2019, §4).

    Args:
        trace: the trace whose attention is erased.
        order: long (B, T_y, T_x), valid positions first; or (O, B, T_y, T_x), O orders.
        pred: long (B, T_y), the unerased prediction.
        steps: bool (B, T_y), the steps to evaluate (need ≥ 2 valid positions).

    Returns:
        long (B, T_y) (or (O, B, T_y)): k of the first flip, 0 where it never flipped (or was not
        evaluated).
    """
    single = order.dim() == 3
    orders = order.unsqueeze(0) if single else order
    n_orders = orders.size(0)
    nv = n_valid(trace)
    dev = trace.src.device
    first = torch.zeros((n_orders,) + trace.step_mask.shape, dtype=torch.long, device=dev)
    for chunk in trace_chunks(trace, n_orders * max(1, int(nv.max()) - 1)):
        rows, window = chunk.rows, slice(chunk.start, chunk.stop)
        sub = sub_trace(trace, rows, chunk.start, chunk.stop)
        sub_steps = steps[rows, window]
        if not bool(sub_steps.any()):
            continue
        k_max = int(nv[rows].max()) - 1
        b, h, t_y, t_x = sub.attention.shape
        k = torch.arange(1, k_max + 1, device=dev)
        sub_order = orders[:, rows, window].transpose(0, 1)  # (b, O, T', T_x)
        rep = erase_ranked(
            sub.attention[:, None, None].expand(b, n_orders, k_max, h, t_y, t_x),
            sub_order[:, :, None, None],
            k.view(1, 1, k_max, 1, 1),
        )
        weights = rep.weights.reshape(b, n_orders * k_max, h, t_y, t_x)
        logits = model.logits_given_attention(sub, weights, chunk_rows, sub_steps)
        flipped = (
            logits.argmax(-1).reshape(b, n_orders, k_max, t_y) != pred[rows, window][:, None, None]
        )
        allowed = (k.view(1, 1, k_max) <= (nv[rows] - 1).view(b, 1, 1)).unsqueeze(-1)
        allowed = allowed & ~rep.empty.any(3)
        flipped &= allowed & sub_steps[:, None, None]
        any_flip = flipped.any(2)  # (b, O, T')
        k_first = flipped.int().argmax(2) + 1
        first[:, rows, window] = torch.where(any_flip, k_first, 0).transpose(0, 1)
    return first[0] if single else first


def run(model: Seq2Seq, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """Erase ranked items until the decision flips (Serrano & Smith 2019, §4, Figs. 3–6).

    Per ranking r and step t: k_r = the number of items erased when argmax p̃_t first differs
    from argmax p_t (erasing at most n_valid − 1 items).

    Returns:
        One row per real step: ``example_id``, ``step``, ``erase_until_flip_skipped`` (< 2 valid
        positions) and for each ranking in :data:`RANKINGS`:
        ``erase_<r>_frac_positions`` = k_r / n_valid, ``erase_<r>_frac_mass`` = head-mean
        attention mass of the erased items, ``erase_<r>_never_flipped`` (1.0 / 0.0; NaN when
        skipped); the fractions are NaN when the step never flipped. For ``random`` the values
        are the means over the ``params.n_random_orders`` orders (fractions over the orders that
        flipped; ``never_flipped`` = fraction of orders that never flipped).

    Raises:
        NoAttentionError: for the ``none`` model.
    """
    att = require_attention(model, batch, "erase_until_flip")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    nv = n_valid(tr)
    steps = tr.step_mask & (nv >= 2)[:, None]
    mean_att = att.mean(1).double()
    with eval_mode(model):
        with torch.no_grad():
            pred = base_probs(model, tr, ctx.chunk_rows).argmax(-1)
        orders = ranking_orders(model, batch, params, ctx, pred)
        results: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
        with torch.no_grad():
            # every order in one pass (orders × prefixes on the P axis)
            ks = erase_until_flip(
                model, tr, torch.stack(list(orders.values())), pred, steps, ctx.chunk_rows
            )
            for (name, order), k in zip(orders.items(), ks):
                flipped = k > 0
                mass = (
                    mean_att.gather(-1, order)
                    .cumsum(-1)
                    .gather(-1, (k - 1).clamp(min=0).unsqueeze(-1))[..., 0]
                )
                nan = torch.tensor(float("nan"), dtype=torch.float64, device=mean_att.device)
                frac_pos = torch.where(flipped, k.double() / nv[:, None].double(), nan)
                frac_mass = torch.where(flipped, mass, nan)
                never = torch.where(steps, (~flipped).double(), nan)
                results[name] = (frac_pos, frac_mass, never)
    for r in RANKINGS:
        if r == "random":
            parts = [results[f"random/{i}"] for i in range(params.n_random_orders)]
            stacked = [torch.stack([p[j] for p in parts]).cpu().numpy() for j in range(3)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN (never flipped / skipped)
                frac_pos, frac_mass, never = (
                    torch.from_numpy(np.nanmean(s, axis=0)).to(mean_att.device) for s in stacked
                )
        else:
            frac_pos, frac_mass, never = results[r]
        frame[f"erase_{r}_frac_positions"] = frac_pos[b_idx, t_idx].cpu().numpy()
        frame[f"erase_{r}_frac_mass"] = frac_mass[b_idx, t_idx].cpu().numpy()
        frame[f"erase_{r}_never_flipped"] = never[b_idx, t_idx].cpu().numpy()
    frame["erase_until_flip_skipped"] = (nv[b_idx] < 2).cpu().numpy()
    return frame
