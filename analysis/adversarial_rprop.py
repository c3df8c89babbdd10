"""The ``rprop-1`` solver of the adversarial search (the default; ``solver = "jw"`` is Jain &
Wallace's Adam): its update, its smoothing schedule and its bound on the logits.

Jain & Wallace's solver (Adam with AMSGrad, lr 0.01, 500 iterations) has not converged at 500
iterations: its hinge λ · ReLU(TVD − ε) with λ = 500 makes Adam's normalised steps of 0.01
per logit the pace of the whole search, and its objective still falls at 5,000 and 20,000
iterations on the bench_adversarial models. ``rprop-1`` minimises the
same per-row objective (module :mod:`attnstudy.analysis.adversarial_objective`) from the same
initial logits with three changes:

1. **Resilient propagation** (Riedmiller & Braun 1993; the iRprop− variant of Igel & Hüsken
   2003, ``torch.optim.Rprop``): every logit θ_i has its own step Δ_i; with g_i the gradient,

       Δ_i ← min(η⁺ Δ_i, Δ_max) if g_i · g_i^prev > 0,
       Δ_i ← max(η⁻ Δ_i, Δ_min), g_i ← 0      if g_i · g_i^prev < 0,
       θ_i ← θ_i − sign(g_i) · Δ_i,

   η⁺ = 1.2, η⁻ = 0.5, Δ₀ = :data:`STEP0`, Δ_min = :data:`STEP_MIN`, Δ_max = :data:`STEP_MAX`.
   Only signs are used, so the search is scale-free (the λ = 500 hinge and the O(1) JSD terms
   move θ at the same pace) and a logit moving one way keeps accelerating; the update is
   element-wise, so every row follows its own trajectory in a batch (docs/design.md §4).
2. **Continuation on a smoothed objective** (Nesterov 2005; Chen & Mangasarian 1996): at
   iteration t the hinge λ · ReLU(TVD(p̃, p) − ε_opt) is replaced by λ · h_τ(TVD_δ(p̃, p) − ε_opt),
   TVD_δ = ½ Σ_v (√((p̃_v − p_v)² + δ²) − δ) and h_τ(x) = τ log(1 + e^{x/τ}), with (δ, τ) going
   geometrically from :data:`SMOOTHING_START` to :data:`SMOOTHING_END` over the iterations
   (:func:`smoothing`), so the last iterations minimise J&W's objective itself. Sign-based
   steps stall on a kink (every sign flip halves Δ), and the TVD's |·| and the hinge's corner
   are kinks; on the benchmark models the smoothing lowered the median final objective of
   plain Rprop (with the bound below) from −2.1 to −2.6 on the Transformer.
3. **A bound on the logits' spread**: after each update, θ_j ← max(θ_j, max_i θ_i − M) over the
   valid positions of each head (:func:`bound_spread_`, M = :data:`SPREAD`), i.e. every valid
   position keeps at least e^{−M} ≈ 2·10⁻⁹ of the largest weight. Without it the sign steps
   drive unused positions to θ ≈ −100 within a few dozen iterations, where their gradient
   underflows and they can never come back (J&W's Adam keeps |θ| ≲ 20 by moving 0.01 per
   iteration). A JSD changes by less than 10⁻⁷ under the bound.

The constants are part of the solver: changing any of them makes a new solver name (as
``ablation.rng = "counter-1"``), so a stored result's key names what computed it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

NAME = "rprop-1"
"""The solver's name in ``[ablation.adversarial] solver``."""
STEPS = 80
"""Default iterations (``rprop_steps``): a fifth of the 500 J&W iterations' CPU time and less."""
STEP0 = 0.05
"""Δ₀, the first step of every logit."""
STEP_MIN = 1e-6
STEP_MAX = 1.0
ETAS = (0.5, 1.2)
"""(η⁻, η⁺)."""
SPREAD = 20.0
"""M: the largest gap between a head's largest logit and any of its valid logits."""
SMOOTHING_START = (1e-2, 5e-3)
"""(δ, τ) of the first iteration."""
SMOOTHING_END = (1e-5, 1e-4)
"""(δ, τ) of the last iteration."""


def smoothing(it: int, n_iter: int) -> tuple[float, float]:
    """(δ, τ) of iteration ``it`` of ``n_iter``: geometric from :data:`SMOOTHING_START` (it = 0)
    to :data:`SMOOTHING_END` (it = n_iter − 1)."""
    frac = it / max(n_iter - 1, 1)
    return tuple(
        a * math.exp(frac * math.log(b / a)) for a, b in zip(SMOOTHING_START, SMOOTHING_END)
    )


def bound_spread_(theta: Tensor, spread: float = SPREAD) -> Tensor:
    """θ ← max(θ, max_j θ_j − spread) along the last axis, in place, −inf (padding) left alone.

    Args:
        theta: (..., T_x) logits, −inf at padding, at least one finite entry per row.

    Returns:
        ``theta`` (modified in place).
    """
    with torch.no_grad():
        floor = theta.amax(-1, keepdim=True) - spread
        theta.copy_(torch.where(theta.isneginf(), theta, torch.maximum(theta, floor)))
    return theta


class Rprop:
    """The update of ``torch.optim.Rprop(lr=STEP0, etas=ETAS, step_sizes=(STEP_MIN, STEP_MAX))``
    (its single-tensor form) written out on one tensor updated in place: the same operations in
    the same order, so the same θ bit for bit (``tests/analysis/test_adversarial_rprop.py``);
    element-wise, so a row's update never depends on another row. −inf entries (padding, whose
    gradient is 0) stay −inf.

    Args:
        param: the tensor updated in place (gradients are passed in).
    """

    def __init__(self, param: Tensor):
        self.param = param
        self.prev = torch.zeros_like(param)
        self.step_size = torch.full_like(param, STEP0)

    def step(self, grad: Tensor) -> None:
        """One update of ``param`` from its gradient ``grad`` (same shape).

        torch's factors η⁺, η⁻, 1 by the sign of g · g^prev and its zeroed gradient, with
        ``torch.where`` in place of its masked assignments (the same values; 3× faster on the
        search's small tensors)."""
        etaminus, etaplus = ETAS
        prod = grad * self.prev
        flipped = prod < 0
        up, down, same = (prod.new_full((), v) for v in (etaplus, etaminus, 1.0))  # its dtype
        factor = torch.where(prod > 0, up, torch.where(flipped, down, same))
        self.step_size.mul_(factor).clamp_(STEP_MIN, STEP_MAX)
        grad = torch.where(flipped, prod.new_zeros(()), grad)
        self.param.addcmul_(grad.sign(), self.step_size, value=-1)
        self.prev = grad


def torch_rprop(param: Tensor) -> torch.optim.Rprop:
    """``torch.optim.Rprop`` with the solver's constants (the plain reference's optimiser)."""
    return torch.optim.Rprop(
        [param], lr=STEP0, etas=ETAS, step_sizes=(STEP_MIN, STEP_MAX), foreach=False
    )
