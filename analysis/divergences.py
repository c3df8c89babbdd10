"""Divergences and rank correlation, each defined once and used everywhere (docs/design.md §4).

* TVD(p, q) = ½ Σ_i |p_i − q_i| over the full output vocabulary (Jain & Wallace 2019, §4.1).
* JSD(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m), m = ½(p + q), natural log, so 0 ≤ JSD ≤ ln 2
  (Lin 1991; Jain & Wallace 2019, §4.2). Terms with p_i = 0 contribute 0 (0 · log 0 := 0), so
  fp32 underflow never produces NaN.
* Kendall τ-b with its two-sided p-value via :func:`scipy.stats.kendalltau`; undefined
  (a constant vector, fewer than 2 items) → ``nan`` for the caller to count, never to average.
  Values equal up to float rounding (within 1e-6 of the vector's scale) are ties.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from scipy import stats
from torch import Tensor

LN2 = math.log(2.0)


def tvd(p: Tensor, q: Tensor) -> Tensor:
    """Total variation distance along the last axis.

    Args:
        p, q: probability vectors, broadcastable shapes (..., V).

    Returns:
        shape (...), values in [0, 1].
    """
    diff = p - q
    if torch.is_grad_enabled() and (p.requires_grad or q.requires_grad):
        return 0.5 * diff.abs().sum(-1)
    # without a graph: the same operations in place on the one temporary (bit-identical, one
    # (..., V) allocation instead of two: the permutation ablation's outputs are large)
    return diff.abs_().sum(-1).mul_(0.5)


@functools.cache
def _smallest_positive(dtype: torch.dtype) -> float:
    """The smallest positive (subnormal) number of a floating dtype."""
    cpu = torch.device("cpu")  # a host scalar, cached per dtype
    zero = torch.zeros((), dtype=dtype, device=cpu)
    return float(torch.nextafter(zero, torch.ones((), dtype=dtype, device=cpu)))


def _kl_to_mixture(p: Tensor, q: Tensor) -> Tensor:
    """Terms p_i log(p_i / m_i), m = (p + q)/2, written as p (log p − log(p + q) + ln 2) so that a
    subnormal p_i (where (p + q)/2 would underflow to 0) stays exact; 0 log 0 := 0."""
    # clamping at the smallest positive float changes nothing where p > 0 (the same operations
    # on the same values) and turns the p = 0 terms into 0 · finite = 0, with finite gradients:
    # where p is the softmax of −inf (padding), the softmax's Jacobian then zeroes them exactly
    tiny = _smallest_positive(p.dtype)
    return p * (p.clamp_min(tiny).log() - (p + q).clamp_min(tiny).log() + LN2)


def jsd(p: Tensor, q: Tensor) -> Tensor:
    """Jensen–Shannon divergence (natural log) along the last axis.

    Args:
        p, q: probability vectors, broadcastable shapes (..., V).

    Returns:
        shape (...), values in [0, ln 2]; differentiable (used as the adversarial objective).
    """
    p, q = torch.broadcast_tensors(p, q)
    out = 0.5 * (_kl_to_mixture(p, q).sum(-1) + _kl_to_mixture(q, p).sum(-1))
    return out.clamp(min=0.0, max=LN2)


TIE_TOLERANCE = 1e-6
"""Values of one vector closer than this fraction of its largest magnitude are ties in Kendall τ."""


def tied(v: np.ndarray, rel: float = TIE_TOLERANCE) -> np.ndarray:
    """``v`` with values that differ by less than ``rel`` × max |v| from their group's smallest
    member replaced by it, so equal values computed with different float rounding stay ties.

    (Two leave-one-out deletions of equal adjacent tokens give the same source and so the same
    TVD in exact arithmetic; batched with other examples, the two numbers can differ in the last
    bits, and an untied pair would change τ-b by up to 2/n(n−1) per pair.)
    """
    v = np.asarray(v, dtype=float)
    if v.size < 2:
        return v
    tol = rel * float(np.max(np.abs(v)))
    out = v.copy()
    order = np.argsort(v, kind="stable")
    rep = v[order[0]]
    for i in order:
        if v[i] - rep > tol:
            rep = v[i]
        out[i] = rep
    return out


def kendall_tau(x, y) -> tuple[float, float]:
    """Kendall τ-b and two-sided p-value (scipy.stats.kendalltau, method 'auto'), with values of a
    vector within :data:`TIE_TOLERANCE` of its scale treated as ties (:func:`tied`).

    Args:
        x, y: 1-D sequences of equal length n.

    Returns:
        (tau, p_value); (nan, nan) when undefined (n < 2 or a constant vector).

    Raises:
        ValueError: if the lengths differ.
    """
    x = tied(np.asarray(x, dtype=float))
    y = tied(np.asarray(y, dtype=float))
    if x.shape != y.shape:
        raise ValueError(f"kendall_tau needs equal lengths, got {x.shape} and {y.shape}")
    if x.size < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan, math.nan
    res = stats.kendalltau(x, y, variant="b")
    return float(res.statistic), float(res.pvalue)


def entropy(p: Tensor) -> Tensor:
    """Shannon entropy (nats) along the last axis, 0 · log 0 := 0. Shape (...)."""
    return -torch.where(
        p > 0, p * torch.where(p > 0, p, torch.ones_like(p)).log(), torch.zeros_like(p)
    ).sum(-1)
