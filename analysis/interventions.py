"""What replaces an attention row: permute, uniform, erase, one-hot, given (docs/design.md §3, §4).

Every function maps attention weights and a valid-position mask to replacement weights of the
same shape (or with a P axis of replacements). Shapes (glossary):

    B   batch size (or N independent rows)
    P   replacements per step
    H   attention heads
    T_y decoder steps
    T_x source positions (padded)

``valid`` is always bool (B, T_x), True at real source positions (``~trace.pad_mask``); it is
broadcast over the middle axes of ``weights`` (B, …, T_x), so a function accepts full tensors
(B, H, T_y, T_x) as well as rows (N, H, T_x). Guarantees, checked by the shared invariance tests
(``tests/analysis/test_interventions.py``): rows sum to 1 or are flagged empty (all zeros, never
NaN), padding keeps exactly 0 weight, a permutation keeps the multiset of a row's weights,
erasing padding changes nothing, and a row's replacement does not depend on the other rows of
the batch (randomness comes from a generator per (seed, example, step, ablation),
:func:`attnstudy.analysis.batch.step_generator`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

GeneratorFn = Callable[[int, int], torch.Generator]
"""``fn(batch_row, step) -> torch.Generator``: the random stream of one (example, step)."""


class Erased(NamedTuple):
    """Result of an erasure.

    Attributes:
        weights: renormalised weights, same shape as the input (all zeros in an empty row).
        empty: bool, ``weights.shape[:-1]``; True where nothing (or only zero mass) was left,
            so the row is not a distribution and must not be used.
    """

    weights: Tensor
    empty: Tensor


class Permuted(NamedTuple):
    """Result of :func:`permute`.

    Attributes:
        weights: (B, P, H, T_y, T_x) permuted weights.
        identity: bool (B, P, T_y); True where replacement p of a step is the identity
            permutation on every head (or the step was not permuted), to be skipped and counted.
    """

    weights: Tensor
    identity: Tensor


def _valid_like(weights: Tensor, valid: Tensor) -> Tensor:
    """``valid`` (B, T_x) viewed as (B, 1, …, 1, T_x) to broadcast against ``weights``."""
    if valid.dtype != torch.bool:
        raise ValueError(f"valid must be a bool mask (True at real positions), got {valid.dtype}")
    if valid.dim() != 2 or valid.size(0) != weights.size(0) or valid.size(1) != weights.size(-1):
        raise ValueError(
            f"valid must be (B, T_x) = ({weights.size(0)}, {weights.size(-1)}), "
            f"got {tuple(valid.shape)}"
        )
    return valid.view(valid.size(0), *([1] * (weights.dim() - 2)), valid.size(1))


def renormalise(weights: Tensor) -> Erased:
    """L1-renormalise rows along the last axis; rows with no mass left become empty.

    Args:
        weights: non-negative, shape (..., T_x).

    Returns:
        :class:`Erased`: rows divided by their sum, or all zeros and ``empty`` where the sum is 0.
    """
    total = weights.sum(-1, keepdim=True)
    empty = total[..., 0] <= 0
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return Erased(torch.where(total > 0, weights / safe, torch.zeros_like(weights)), empty)


def permutation_indices(
    generator: torch.Generator,
    n: int,
    heads: int,
    n_valid: int,
    device: torch.device | str | None = None,
) -> Tensor:
    """``n`` independent uniform permutations of ``n_valid`` items per head.

    The draw is one ``torch.rand(n, heads, n_valid)`` from ``generator`` on the generator's own
    device (the CPU for :func:`attnstudy.analysis.batch.step_generator`), argsorted there (argsort
    of i.i.d. uniforms is a uniform random permutation) and only then moved to ``device``, so the
    local path and the loop reference, given the same generator, see the same permutations on
    every device.

    Returns:
        long (n, heads, n_valid) on ``device`` (default: the generator's); row ``[p, h]`` maps new
        position i to old position ``[p, h, i]``.
    """
    draw = torch.rand(n, heads, n_valid, generator=generator, device=generator.device)
    order = draw.argsort(-1)
    return order if device is None else order.to(device)


def permute(
    weights: Tensor,
    valid: Tensor,
    n: int,
    generators: GeneratorFn | torch.Generator,
    steps: Tensor | None = None,
) -> Permuted:
    """P random permutations of each attention row over its valid positions.

    Jain & Wallace (2019), §4.1 ("permute_attn"): α̃ = α[π] for a uniform random permutation π
    of the valid positions; every head gets its own permutation. Padding stays 0.

    Args:
        weights: (B, H, T_y, T_x) attention, or rows (B, H, T_x) (treated as T_y = 1).
        valid: bool (B, T_x), True at real positions.
        n: number of permutations P per step.
        generators: ``fn(b, t) -> torch.Generator`` (one stream per example and step, e.g.
            ``step_generator(seed, example_ids[b], t, "permutation")``), or one generator used
            for the steps in (b, t) order.
        steps: optional bool (B, T_y), the steps to permute (default: all); other steps keep
            the original row and count as identity.

    Returns:
        :class:`Permuted` with weights (B, P, H, T_y, T_x) — (B, P, H, T_x) for row input — and
        ``identity`` (B, P, T_y) — (B, P) for row input, on the device of ``weights`` (the
        permutation indices are built on the CPU, where they are drawn, and moved once per group of steps of one valid length).

    Raises:
        ValueError: for a bad shape or mask, or ``n < 1``.
    """
    rows = weights.dim() == 3
    if rows:
        weights = weights.unsqueeze(2)
    if weights.dim() != 4:
        raise ValueError(
            f"weights must be (B, H, T_y, T_x) or (B, H, T_x), got {tuple(weights.shape)}"
        )
    if n < 1:
        raise ValueError(f"need at least one permutation, got n={n}")
    _valid_like(weights, valid)
    b, h, t_y, t_x = weights.shape
    cpu = torch.device("cpu")
    steps = torch.ones(b, t_y, dtype=torch.bool, device=cpu) if steps is None else steps.to(cpu)
    gen_fn = generators if callable(generators) else (lambda _b, _t: generators)
    out = weights.unsqueeze(1).expand(b, n, h, t_y, t_x).clone()
    identity = torch.ones(b, n, t_y, dtype=torch.bool, device=cpu)
    for bs, ts, index, ident in _permuted_steps(valid.to(cpu), steps, n, h, gen_fn):
        identity[bs, :, ts] = ident
        bs, ts, index = bs.to(out.device), ts.to(out.device), index.to(out.device)
        picked = weights[bs, :, ts]  # (S_k, H, T_x)
        out[bs, :, :, ts] = picked.unsqueeze(1).expand(index.shape).gather(-1, index)
    identity = identity.to(weights.device)
    if rows:
        return Permuted(out[:, :, :, 0], identity[:, :, 0])
    return Permuted(out, identity)


def _permuted_steps(valid: Tensor, steps: Tensor, n: int, heads: int, gen_fn: GeneratorFn):
    """The permuted steps of :func:`permute`, one group per valid length k, on the CPU.

    Yields ``(b, t, index, identity)``: long (S_k,) example rows and steps, the gather index
    long (S_k, P, H, T_x) of their new rows (new position i takes old position ``index[..., i]``;
    padding positions map to themselves) and ``identity`` bool (S_k, P).

    Exactly the permutations of :func:`permutation_indices` called step by step in (b, t) order
    (the generator calls are the same and in the same order; steps with fewer than 2 valid
    positions draw nothing), but argsorted and scattered for all steps of one valid length at
    once: a batched argsort sorts every row on its own, so the orders, ties included, are those
    of the per-step calls (``tests/analysis/test_permutation_fast_path.py`` holds :func:`permute`
    equal to the per-step loop :func:`_permutation_index_loop`).
    """
    t_x = valid.size(1)
    nv = valid.sum(-1)  # (B,)
    todo = steps.nonzero()  # (S, 2), (b, t) order: the order of the generator calls
    todo = todo[nv[todo[:, 0]] >= 2]
    if todo.numel() == 0:
        return
    # per example, its valid positions (ascending) then its padding positions (ascending)
    slots = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)  # (B, T_x)
    # right-padded sources (every trace's): the slots are the positions, no scatter needed
    in_place = bool((valid == (torch.arange(t_x, device=valid.device) < nv[:, None])).all())
    step_nv = nv[todo[:, 0]]
    draws = []
    for (bi, ti), k in zip(todo.tolist(), step_nv.tolist()):
        g = gen_fn(bi, ti)
        draws.append(torch.rand(n, heads, k, generator=g, device=g.device).to("cpu"))
    for k in step_nv.unique().tolist():
        which = (step_nv == k).nonzero()[:, 0]
        # (S_k, P, H, k), sorted on the CPU where it was drawn, then on the model's device
        perm = torch.stack([draws[i] for i in which.tolist()]).argsort(-1).to(valid.device)
        bs, ts = todo[which, 0], todo[which, 1]
        order = torch.cat(
            [perm, torch.arange(k, t_x, device=perm.device).expand(*perm.shape[:-1], t_x - k)], -1
        )  # (S_k, P, H, T_x): a permutation of the slots that fixes the padding slots
        if in_place:
            index = order
        else:
            slot = slots[bs][:, None, None, :].expand(order.shape)
            # new position slot[i] takes the weight of old position slot[order[i]]
            index = torch.empty_like(order).scatter_(-1, slot, slot.gather(-1, order))
        yield bs, ts, index, (perm == torch.arange(k, device=perm.device)).all(-1).all(-1)


def _permutation_index_loop(
    valid: Tensor, steps: Tensor, n: int, heads: int, gen_fn: GeneratorFn
) -> tuple[Tensor, Tensor]:
    """Plain per-step reference of :func:`_permutation_index` (one :func:`permutation_indices`
    call and one assignment per step), the test oracle of the batched version."""
    b, t_x = valid.shape
    t_y = steps.size(1)
    index = torch.arange(t_x, device=valid.device).expand(b, n, heads, t_y, t_x).clone()
    identity = torch.ones(b, n, t_y, dtype=torch.bool, device=valid.device)
    for bi, ti in steps.nonzero().tolist():
        pos = valid[bi].nonzero()[:, 0]
        nv = pos.numel()
        if nv < 2:
            continue
        perm = permutation_indices(gen_fn(bi, ti), n, heads, nv, device="cpu")  # (P, H, nv)
        index[bi, :, :, ti][..., pos] = pos[perm]  # view of (P, H, T_x), valid columns
        identity[bi, :, ti] = (perm == torch.arange(nv, device=perm.device)).all(-1).all(-1)
    return index, identity


def uniform(valid: Tensor, like: Tensor | None = None) -> Tensor:
    """Uniform weights over the valid positions (Moradi et al. 2019; Wiegreffe & Pinter 2019).

    Args:
        valid: bool (B, T_x).
        like: optional tensor (B, …, T_x) whose shape and dtype the result takes.

    Returns:
        (B, T_x), or ``like``'s shape: 1 / n_valid at valid positions, exactly 0 at padding.

    Raises:
        ValueError: for a bad mask or a row without a valid position.
    """
    if like is None:
        like = valid.new_zeros(valid.shape, dtype=torch.float32)
    v = _valid_like(like, valid)
    if not bool(valid.any(-1).all()):
        raise ValueError("every row needs at least one valid position")
    rows = valid.to(like.dtype) / valid.sum(-1, keepdim=True).to(like.dtype)
    return rows.view(v.shape).expand(like.shape).clone()


def erase_max(weights: Tensor, valid: Tensor) -> Erased:
    """Zero the largest weight of every row (every head) and L1-renormalise.

    Serrano & Smith (2019), §3 ("erase the single highest-attention item"). Ties: the first
    maximal position. A row with one valid position becomes empty (flagged, all zeros).

    Args:
        weights: (B, …, T_x), e.g. (B, H, T_y, T_x).
        valid: bool (B, T_x).

    Returns:
        :class:`Erased`.
    """
    v = _valid_like(weights, valid)
    masked = weights.masked_fill(~v, float("-inf"))
    top = masked.argmax(-1, keepdim=True)
    return renormalise(weights.scatter(-1, top, 0.0).masked_fill(~v, 0.0))


def ranks_of(order: Tensor) -> Tensor:
    """Inverse permutation: ``ranks[..., order[..., r]] = r``. ``order``: long (..., T_x)."""
    ar = torch.arange(order.size(-1), device=order.device).expand(order.shape)
    return torch.empty_like(order).scatter_(-1, order, ar)


def erase_ranked(weights: Tensor, order: Tensor, k: Tensor | int) -> Erased:
    """Zero the first ``k`` positions of a ranking and L1-renormalise (Serrano & Smith 2019, §4).

    Args:
        weights: (..., T_x), e.g. (B, H, T_y, T_x) or (B, P, H, T_y, T_x).
        order: long (..., T_x), broadcastable to ``weights``: a permutation of 0…T_x−1 per row,
            the position erased first coming first (put padding last; erasing padding is a
            no-op because its weight is already 0).
        k: how many leading positions to erase; an int or a long tensor broadcastable to
            ``order.shape[:-1]``.

    Returns:
        :class:`Erased`; erasing every position with mass gives an empty row (flagged, zeros),
        never NaN.
    """
    k = torch.as_tensor(k, device=order.device)
    erased = ranks_of(order) < k.unsqueeze(-1)
    return renormalise(weights.masked_fill(erased, 0.0))


def one_hot(index: Tensor, valid: Tensor) -> Tensor:
    """All weight on one position (a hard, counterfactual attention row).

    Args:
        index: long (B, …), the chosen position of each row.
        valid: bool (B, T_x); the chosen position must be valid.

    Returns:
        (B, …, T_x) float32, 1 at ``index``, 0 elsewhere.

    Raises:
        ValueError: if an index is out of range or points at padding.
    """
    t_x = valid.size(1)
    if bool(((index < 0) | (index >= t_x)).any()):
        raise ValueError(f"one_hot index out of range 0…{t_x - 1}")
    out = torch.nn.functional.one_hot(index, t_x).to(torch.float32)
    if bool((out.bool() & ~_valid_like(out, valid)).any()):
        raise ValueError("one_hot index points at a padding position")
    return out


def given(
    weights: Tensor,
    valid: Tensor,
    shape: tuple[int, ...] | None = None,
    steps: Tensor | None = None,
    atol: float = 1e-5,
) -> Tensor:
    """Validate user-supplied replacement weights and return them unchanged.

    Args:
        weights: (B, H, T_y, T_x) or (B, P, H, T_y, T_x) (any (B, …, T_x) if ``shape`` is None).
        valid: bool (B, T_x).
        shape: the expected shape, e.g. ``tuple(trace.attention.shape)``; a P axis after B is
            also accepted.
        steps: optional bool (B, T_y): only these steps' rows are checked (padding steps are
            ignored by :meth:`Seq2Seq.logits_given_attention`).
        atol: tolerance on the row sums.

    Returns:
        ``weights``.

    Raises:
        ValueError: wrong shape, weight at padding, a negative or non-finite weight, or a row
            that does not sum to 1.
    """
    if shape is not None and tuple(weights.shape) != tuple(shape):
        with_p = weights.dim() == len(shape) + 1 and (
            weights.shape[:1] + weights.shape[2:]
        ) == tuple(shape)
        if not with_p:
            raise ValueError(
                f"replacement weights must have shape {tuple(shape)} (or a P axis after B), "
                f"got {tuple(weights.shape)}"
            )
    v = _valid_like(weights, valid)
    check = torch.ones(weights.shape[:-1], dtype=torch.bool, device=weights.device)
    if steps is not None:
        s = steps.view(steps.size(0), *([1] * (weights.dim() - 3)), steps.size(1))
        check = check & s
    rows = weights[check]
    if not bool(torch.isfinite(rows).all()) or bool((rows < 0).any()):
        raise ValueError("replacement weights must be finite and non-negative")
    if bool((weights.masked_fill(v, 0.0)[check] != 0).any()):
        raise ValueError("replacement weights must be exactly 0 at padding positions")
    sums = rows.sum(-1)
    if not bool(((sums - 1).abs() <= atol).all()):
        raise ValueError(
            f"replacement rows must sum to 1 (±{atol}); got sums in "
            f"[{float(sums.min()):.6g}, {float(sums.max()):.6g}]"
        )
    return weights
