"""The adversarial search's optimisers and iteration, shared by its two solvers
(:mod:`attnstudy.analysis.ablations.adversarial`): J&W's Adam with AMSGrad written out on one
tensor (:class:`AmsGrad`, the fast path; ``torch.optim.Adam(amsgrad=True)`` is its reference),
one iteration of either solver, and early stopping's check and slicing."""

from __future__ import annotations

import torch
from torch import Tensor

from . import adversarial_rprop as rprop_solver


class AmsGrad:
    """Adam with the AMSGrad maximum (Kingma & Ba 2015, alg. 1; Reddi et al. 2018), the update of
    ``torch.optim.Adam(amsgrad=True)`` (its single-tensor form, no weight decay) written out on one
    tensor updated in place, without the optimiser's per-step bookkeeping: the same operations in
    the same order, so the same θ bit for bit (``tests/analysis/test_adversarial.py``).

    Args:
        param: the tensor updated in place (not a leaf needing grad: gradients are passed in).
        lr, betas, eps: as ``torch.optim.Adam``.
    """

    def __init__(self, param: Tensor, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.param, self.lr, self.betas, self.eps = param, lr, betas, eps
        self.exp_avg = torch.zeros_like(param)
        self.exp_avg_sq = torch.zeros_like(param)
        self.max_exp_avg_sq = torch.zeros_like(param)
        self.steps = 0

    def step(self, grad: Tensor) -> None:
        """One update of ``param`` from its gradient ``grad`` (same shape)."""
        beta1, beta2 = self.betas
        self.steps += 1
        self.exp_avg.lerp_(grad, 1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = float(self.steps)
        step_size = self.lr / (1 - beta1**step)
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        torch.maximum(self.max_exp_avg_sq, self.exp_avg_sq, out=self.max_exp_avg_sq)
        denom = (self.max_exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
        self.param.addcdiv_(self.exp_avg, denom, value=-step_size)

    def keep(self, rows: Tensor) -> None:
        """Go on with the rows ``rows`` (bool (N,)) of ``param`` and of the moments only."""
        self.param = self.param[rows]
        self.exp_avg = self.exp_avg[rows]
        self.exp_avg_sq = self.exp_avg_sq[rows]
        self.max_exp_avg_sq = self.max_exp_avg_sq[rows]


def stopped(loss: Tensor, previous: Tensor | None, tol: float) -> tuple[Tensor | None, Tensor]:
    """Early stopping's check: (the rows (bool (N,)) whose loss improved by at most
    ``tol × max(1, |loss|)`` since ``previous``, or None at the first check; the loss now)."""
    now = loss.detach()
    if previous is None:
        return None, now
    return previous - now <= tol * now.abs().clamp(min=1.0), now


def keep_rows(keep: Tensor, theta: Tensor, *, optim, adam) -> Tensor:
    """θ of the rows ``keep`` (bool (N,)) only, the optimiser's moments sliced alike (torch's
    ``optim`` for the plain reference, else ``adam``); returns the new θ."""
    if optim is not None:
        state = optim.state.pop(theta)
        theta = theta.detach()[keep].requires_grad_(True)
        optim.param_groups[0]["params"] = [theta]
        optim.state[theta] = {k: v[keep] if v.dim() else v for k, v in state.items()}
        return theta
    adam.keep(keep)
    return adam.param


def optimisers(theta: Tensor, lr: float, *, plain: bool, rprop: bool):
    """(torch's optimiser, None) for the plain reference — ``theta`` then requires its gradient —
    or (None, the fast path's :class:`AmsGrad` or :class:`.adversarial_rprop.Rprop`) over
    ``theta``: J&W's Adam with AMSGrad at ``lr``, or rprop-1's Rprop."""
    if plain:  # the reference: autograd through the whole objective, torch's optimiser
        theta.requires_grad_(True)
        if rprop:
            return rprop_solver.torch_rprop(theta), None
        return torch.optim.Adam([theta], lr=lr, amsgrad=True), None
    return None, rprop_solver.Rprop(theta) if rprop else AmsGrad(theta, lr)


def iteration(step, theta: Tensor, smooth, *, optim, adam, rprop: bool) -> Tensor:
    """One iteration of :func:`_optimise`'s search: the loss (N,) at θ before the update, θ
    stepped by torch's optimiser ``optim`` (the plain reference, autograd) or by ``adam`` (the
    fast path's :class:`AmsGrad` or Rprop, from :func:`_objective_and_grad`'s gradient); for
    rprop-1, then the bound on the logits' spread."""
    if optim is not None:
        loss, *_ = step(theta, smooth)
        optim.zero_grad(set_to_none=True)
        loss.sum().backward()
        optim.step()
    else:
        loss, grad = step(theta, smooth)
        adam.step(grad)
    if rprop:
        rprop_solver.bound_spread_(theta if optim is not None else adam.param)
    return loss
