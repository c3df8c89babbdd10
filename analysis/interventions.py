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
the batch (randomness comes from a stream per (seed, example, step, purpose),
:func:`attnstudy.analysis.batch.step_streams`: counter-based, or a reseeded generator in the legacy
scheme).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .random_streams import CounterStreams, permutations, permutations_loop

GeneratorFn = Callable[[int, int], torch.Generator]
"""``fn(batch_row, step) -> torch.Generator``: the random stream of one (example, step) in the
legacy scheme; :class:`~attnstudy.analysis.random_streams.CounterStreams` names the counter-based
streams of the same rows and steps."""


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


class PermutationIndex(NamedTuple):
    """Result of :func:`permutation_index`: the permutations of the permuted steps.

    Attributes:
        b, t: long (S,), batch row and step of each permuted step, in (b, t) order.
        index: long (S, P, H, T_x), the gather index of the new rows: new position i takes old
            position ``index[s, p, h, i]``; padding positions map to themselves.
        identity: bool (S, P); True where replacement p of a step is the identity permutation
            on every head.
    """

    b: Tensor
    t: Tensor
    index: Tensor
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
    positive = total > 0
    safe = torch.where(positive, total, torch.ones_like(total))
    # two full-size passes (divide, then zero the empty rows in place), not four (divide, zeros,
    # where): the same numbers
    return Erased((weights / safe).masked_fill_(~positive, 0.0), total[..., 0] <= 0)


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
    generators: CounterStreams | GeneratorFn | torch.Generator,
    steps: Tensor | None = None,
) -> Permuted:
    """P random permutations of each attention row over its valid positions.

    Jain & Wallace (2019), §4.1 ("permute_attn"): α̃ = α[π] for a uniform random permutation π
    of the valid positions; every head gets its own permutation. Padding stays 0.

    Args:
        weights: (B, H, T_y, T_x) attention, or rows (B, H, T_x) (treated as T_y = 1).
        valid: bool (B, T_x), True at real positions.
        n: number of permutations P per step.
        generators: the streams of the rows' steps
            (:func:`attnstudy.analysis.batch.step_streams`): counter-based
            (:class:`~attnstudy.analysis.random_streams.CounterStreams`, step (b, t)'s
            replacement p and head h the row p·H + h of its stream's permutations), or, in the
            legacy scheme, ``fn(b, t) -> torch.Generator`` (one stream per example and step,
            e.g. ``step_generator(seed, example_ids[b], t, "permutation")``) or one generator
            used for the steps in (b, t) order.
        steps: optional bool (B, T_y), the steps to permute (default: all); other steps keep
            the original row and count as identity.

    Returns:
        :class:`Permuted` with weights (B, P, H, T_y, T_x) — (B, P, H, T_x) for row input — and
        ``identity`` (B, P, T_y) — (B, P) for row input, on the device of ``weights`` (the
        permutation indices are built on the CPU, where they are drawn
        (:func:`permutation_index`), and moved once).

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
    out = weights.unsqueeze(1).expand(b, n, h, t_y, t_x).clone()
    identity = torch.ones(b, n, t_y, dtype=torch.bool, device=cpu)
    bs, ts, index, ident = permutation_index(valid.to(cpu), steps, n, h, generators)
    if bs.numel():
        identity[bs, :, ts] = ident
        bs, ts, index = bs.to(out.device), ts.to(out.device), index.to(out.device)
        picked = weights[bs, :, ts]  # (S, H, T_x)
        out[bs, :, :, ts] = picked.unsqueeze(1).expand(index.shape).gather(-1, index)
    identity = identity.to(weights.device)
    if rows:
        return Permuted(out[:, :, :, 0], identity[:, :, 0])
    return Permuted(out, identity)


def permutation_index(
    valid: Tensor,
    steps: Tensor,
    n: int,
    heads: int,
    generators: CounterStreams | GeneratorFn | torch.Generator,
) -> PermutationIndex:
    """The P random permutations of :func:`permute` as a gather index, for the permuted steps.

    Counter-based streams: every permuted step's P · H rows come from one
    :func:`~attnstudy.analysis.random_streams.permutations` call (one Philox call and one sort
    for the batch); steps with fewer than 2 valid positions are left out. Legacy generators:
    exactly the permutations of :func:`permutation_indices` called step by step in (b, t) order
    (the generator calls are the same and in the same order; steps with fewer than 2 valid
    positions draw nothing and are left out), but drawn into one buffer (:func:`_draw_steps`)
    and argsorted for all steps at once (:func:`_argsort_draws`: every row sorted on its own, so
    the orders, ties included, are those of the per-step calls;
    ``tests/analysis/test_permutation_fast_path.py`` holds it equal to the per-step loop
    :func:`_permutation_index_loop`). :func:`permute` gathers the weights with it; the
    permutation ablation gathers its steps' rows only.

    Args:
        valid: bool (B, T_x), True at real positions, on the CPU.
        steps: bool (B, T_y), the steps to permute, on the CPU.
        n: permutations per step (P). heads: H.
        generators: as :func:`permute`'s.

    Returns:
        :class:`PermutationIndex`, on the CPU (S = 0 when no step is permuted).
    """
    t_x = valid.size(1)
    nv = valid.sum(-1)  # (B,)
    todo = steps.nonzero()  # (S, 2), (b, t) order: the order of the generator calls
    todo = todo[nv[todo[:, 0]] >= 2]
    bs, ts = todo[:, 0], todo[:, 1]
    step_nv = nv[bs]
    if isinstance(generators, CounterStreams):
        # every step's P · H rows in one call (rows p·H + h of its stream, random_streams)
        keys = generators.keys(bs.tolist(), ts.tolist())
        order_np = permutations(keys, n * heads, step_nv.numpy(), t_x).reshape(-1, n, heads, t_x)
        order = torch.from_numpy(order_np).to(valid.device)
        identity = torch.from_numpy(_is_identity(order_np)).to(valid.device)
    else:
        gen_fn = generators if callable(generators) else (lambda _b, _t: generators)
        draw = _draw_steps(todo, step_nv, n, heads, t_x, gen_fn)
        order, identity = _argsort_draws(draw, step_nv)  # (S, P, H, T_x): the slots' orders
    # right-padded sources (every trace's): the slots are the positions, no scatter needed
    if bool((valid == (torch.arange(t_x, device=valid.device) < nv[:, None])).all()):
        return PermutationIndex(bs, ts, order, identity)
    slots = valid_first(valid)  # (B, T_x)
    slot = slots[bs][:, None, None, :].expand(order.shape)
    # new position slot[i] takes the weight of old position slot[order[i]]
    index = torch.empty_like(order).scatter_(-1, slot, slot.gather(-1, order))
    return PermutationIndex(bs, ts, index, identity)


def valid_first(valid: Tensor) -> Tensor:
    """Each row's valid positions (ascending), then its padding positions (ascending).

    Args:
        valid: bool (B, T_x), True at real positions.

    Returns:
        long (B, T_x): a permutation of 0 … T_x − 1 per row.
    """
    return torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)


def _draw_steps(
    todo: Tensor, step_nv: Tensor, n: int, heads: int, width: int, gen_fn: GeneratorFn
) -> Tensor:
    """The uniform draws of :func:`permutation_indices` for every step of ``todo``, in its order.

    Step j draws ``torch.rand(n, heads, k_j)`` (k_j = ``step_nv[j]``) from its generator into
    columns ``[:k_j]`` of its slice of one buffer; a column c ≥ k_j holds 1 + c · 2^-23, above
    every draw and distinct (:func:`_argsort_draws` sorts it after the draws, in column order).
    A generator function with a ``seed_of(b, t)`` method
    (:class:`attnstudy.analysis.batch.StepStreams`) has one CPU generator reseeded per step
    instead of a generator built per step: the same numbers.

    Args:
        todo: long (S, 2), (b, t) of the steps. step_nv: long (S,), their valid lengths.
        width: the buffer's columns (T_x ≥ every k_j).

    Returns:
        float32 (S, n, heads, width) on the CPU.
    """
    pad = 1 + torch.arange(width, dtype=torch.float32, device="cpu") * 2.0**-23
    out = pad.expand(todo.size(0), n, heads, width).clone()
    seed_of = getattr(gen_fn, "seed_of", None)
    shared = torch.Generator(device="cpu") if seed_of is not None else None
    for row, (bi, ti), k in zip(out, todo.tolist(), step_nv.tolist()):
        draws = row[..., :k]  # (n, heads, k): filled in the order torch.rand fills its tensor
        if shared is not None:
            draws.uniform_(generator=shared.manual_seed(seed_of(bi, ti)))
            continue
        g = gen_fn(bi, ti)
        if g.device.type == "cpu":
            draws.uniform_(generator=g)  # what torch.rand(n, heads, k, generator=g) draws
        else:
            draws.copy_(torch.rand(n, heads, k, generator=g, device=g.device))
    return out


UNIFORM_BITS = 24
"""Random bits of a float32 ``torch.rand`` draw on the CPU: the draws are multiples of 2^-24 in
[0, 1) (the generator's 32-bit output masked to 24 bits, times 2^-24)."""


def _argsort_draws(draw: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """Per row, the argsort of its first k draws, then its columns k, …, T_x − 1 in order; and
    which replacements are the identity.

    For row (s, p, h): ``draw[s, p, h, :k].argsort(-1)`` with k = ``lengths[s]``, followed by k
    … T_x − 1 — by one ``np.sort`` of int32 keys instead of a ``torch.argsort`` per valid length.
    Draws are scaled to integers (u = ⌊draw · 2^24⌋, exact for ``torch.rand``'s draws,
    :data:`UNIFORM_BITS`) and the key u · 64 + column sorts a row by value with its column in the
    low 6 bits; the columns past k hold 1 + c · 2^-23 (:func:`_draw_steps`), so their keys come
    last, in column order. ``np.sort`` of short int32 rows is several times faster than
    ``torch.argsort``. A row in which two draws share an integer (equal draws: about k²/2^25 per
    row) is argsorted by ``torch.argsort``, so every row's order, ties included, is the per-step
    ``argsort``'s. Draws of 1 or more (not ``torch.rand``'s: counted after the sort), more than 64
    columns or a tensor off the CPU: ``torch.argsort`` for each valid length. The identity
    replacements are found by :func:`_is_identity`.

    Args:
        draw: float32 (S, P, H, T_x), as :func:`_draw_steps` fills it. lengths: long (S,), each
            step's k.

    Returns:
        ``(order, identity)``: long (S, P, H, T_x) and bool (S, P), True where every head's
        order is 0, 1, …, T_x − 1.
    """
    s, p, h, t_x = draw.shape
    row_lengths = lengths.view(s, 1, 1).expand(s, p, h)
    if draw.dtype == torch.float32 and draw.device.type == "cpu" and 0 < s and t_x <= 64:
        cols = torch.arange(t_x, dtype=torch.int32, device=draw.device)
        keys = torch.add(cols, draw.mul(float(1 << UNIFORM_BITS)).to(torch.int32), alpha=64)
        ordered = keys.numpy()
        ordered.sort(axis=-1)
        # draws below 1 (torch.rand's): exactly k keys per row below the padding's (a negative
        # draw sorts right as it is: its key's low bits are still its column)
        padding = int((p * h * (t_x - lengths)).sum())
        if int((ordered >= 64 << UNIFORM_BITS).sum()) == padding:
            flat = ordered.reshape(-1) >> 6
            order_np = ordered & 63
            order = torch.from_numpy(order_np).to(draw.device, torch.long)
            if bool((flat[1:] == flat[:-1]).any()):  # some draw tied (or rows' ends met): exact
                values = ordered >> 6
                ties = torch.from_numpy((values[..., 1:] == values[..., :-1]).any(-1)).to(
                    draw.device
                )
                order[ties] = _argsort_rows(draw[ties], row_lengths[ties])
                return order, (order == torch.arange(t_x, device=order.device)).all(-1).all(-1)
            return order, torch.from_numpy(_is_identity(order_np)).to(draw.device)
    order = _argsort_rows(draw.reshape(-1, t_x), row_lengths.reshape(-1)).view(draw.shape)
    return order, (order == torch.arange(t_x, device=order.device)).all(-1).all(-1)


def _is_identity(order: np.ndarray) -> np.ndarray:
    """``(order == 0, 1, …, T_x − 1).all over (H, T_x)`` for an ndarray (S, P, H, T_x) → bool
    (S, P): a replacement can be the identity only where every head's order starts at 0, so
    only those are compared in full (about 1/k of them for one head, fewer for more)."""
    s, p, h, t_x = order.shape
    rows = order.reshape(s * p, h, t_x)
    out = (rows[:, :, 0] == 0).all(-1)
    maybe = out.nonzero()[0]
    same = rows[maybe] == np.arange(t_x, dtype=rows.dtype)
    out[maybe] = same.reshape(len(maybe), h * t_x).all(-1)
    return out.reshape(s, p)


def _argsort_rows(draw: Tensor, lengths: Tensor) -> Tensor:
    """:func:`_argsort_draws`' order by ``torch.argsort``, one call per valid length: draw
    (N, T_x), lengths long (N,) → long (N, T_x)."""
    t_x = draw.size(-1)
    order = torch.arange(t_x, device=draw.device).expand(draw.shape).clone()
    for k in lengths.unique().tolist():
        rows = (lengths == k).nonzero()[:, 0]
        order[rows, :k] = draw[rows, :k].argsort(-1)
    return order


def _permutation_index_loop(
    valid: Tensor, steps: Tensor, n: int, heads: int, gen_fn: CounterStreams | GeneratorFn
) -> tuple[Tensor, Tensor]:
    """Plain per-step reference of :func:`permutation_index` (one :func:`permutation_indices`
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
        if isinstance(gen_fn, CounterStreams):  # the stream's P · H rows, drawn alone
            key = gen_fn.keys([bi], [ti])
            perm = permutations_loop(key, n * heads, [nv], nv)
            perm = torch.from_numpy(perm).to(valid.device).view(n, heads, nv)
        else:
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
