"""The adversarial search's objective (Jain & Wallace 2019, §4.2), per searched row: the plain
reference (:func:`_row_objective_reference`) and the fused fast path with its analytic gradient
(:func:`_row_objective`, :func:`_objective_and_grad`), held equal by tests/analysis/test_adversarial.py.

    loss = Σ_k [ −JSD(α̃_k, α) + λ · ReLU(TVD(p̃_k, p) − ε_opt) ] − mean_{k,k'} JSD(α̃_k, α̃_k')

Split out of :mod:`attnstudy.analysis.ablations.adversarial` (the search, its settings and its
catalogue entry), which imports these names back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .batch import PreparedBatch
from .divergences import LN2, _smallest_positive, jsd, tvd

if TYPE_CHECKING:
    from .ablations.adversarial import AdversarialParams


def _row_objective_reference(
    logits_of,
    batch: PreparedBatch,
    theta: Tensor,
    b_idx: Tensor,
    t_idx: Tensor,
    acfg: AdversarialParams,
    smoothing: tuple[float, float] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row adversarial loss for the rows (b_idx, t_idx): the plain form, each term as written
    in the module docstring through :func:`~attnstudy.analysis.divergences.jsd` (the reference
    of :func:`_row_objective`); with ``smoothing`` = (δ, τ), the smoothed loss of the rprop-1
    solver (:func:`_smoothed_hinge`) in place of the hinge.

    Args:
        logits_of: :func:`~attnstudy.analysis._chunks.rows_given_attention`: candidates (N, K, H, T_x)
            → logits (N, K, V) from each row's traced prefix.
        theta: (N, K, H, T_x) candidate logits, −inf at padding (so the softmax gives 0 there).

    Returns:
        loss (N,), jsd (N, K), tvd (N, K), candidates α̃ (N, K, H, T_x).
    """
    tr = batch.trace
    cand = torch.softmax(theta, dim=-1)  # (N, K, H, T_x), exactly 0 at padding
    p_new = torch.softmax(logits_of(cand), -1)  # (N, K, V)
    p_orig = torch.softmax(tr.logits[b_idx, t_idx], -1).unsqueeze(1)  # (N, 1, V)
    alpha = tr.attention[b_idx, :, t_idx].mean(1).unsqueeze(1)  # (N, 1, T_x)
    cand_mean = cand.mean(2)  # (N, K, T_x)
    div = jsd(cand_mean, alpha)  # (N, K)
    out_tvd = tvd(p_new, p_orig)  # (N, K)
    cross = jsd(cand_mean.unsqueeze(1), cand_mean.unsqueeze(2))  # (N, K, K)
    if smoothing is None:
        hinge = torch.relu(out_tvd - acfg.eps_opt)
    else:
        delta, tau = smoothing
        smooth_tvd = 0.5 * (((p_new - p_orig) ** 2 + delta**2).sqrt() - delta).sum(-1)
        hinge = tau * torch.nn.functional.softplus((smooth_tvd - acfg.eps_opt) / tau)
    loss = (-div + acfg.lam * hinge).sum(-1) - cross.mean((-1, -2))
    return loss, div, out_tvd, cand


def _smoothed_hinge(
    diff: Tensor, eps: float, delta: float, tau: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The smoothed hinge of the rprop-1 solver and its derivatives, from diff = p̃ − p (..., V).

    TVD_δ = ½ Σ_v (√(diff_v² + δ²) − δ) (the pseudo-Huber smoothing of |·|, ≤ TVD, → TVD as δ → 0)
    and h_τ(x) = τ · log(1 + e^{x/τ}) (softplus, → ReLU(x) as τ → 0, ≤ ReLU(x) + τ ln 2): the
    hinge ReLU(TVD − ε) becomes h_τ(TVD_δ − ε), smooth in p̃ (Nesterov 2005's smoothing of a
    non-smooth objective; Chen & Mangasarian 1996 for the plus function).

    Returns:
        h (...), ∂h/∂TVD_δ = σ((TVD_δ − ε)/τ) (...), and ∂TVD_δ/∂p̃ = ½ diff / √(diff² + δ²)
        (..., V).
    """
    root = (diff * diff).add_(delta * delta).sqrt_()
    x = (root - delta).sum(-1).mul_(0.5).sub_(eps).div_(tau)
    return tau * torch.nn.functional.softplus(x), torch.sigmoid(x), diff.div(root).mul_(0.5)


def _log_clamped(x: Tensor) -> Tensor:
    """log(max(x, smallest positive float)): 0 · log 0 terms become 0 · finite = 0."""
    return x.clamp_min(_smallest_positive(x.dtype)).log()


def _jsd_fused(p: Tensor, q: Tensor, p_log_p: Tensor, q_log_q: Tensor) -> Tensor:
    """JSD(p, q) along the last axis from precomputed Σ p log p and Σ q log q (shape (...)).

    The same quantity as :func:`attnstudy.analysis.divergences.jsd` (Lin 1991): with
    m = (p + q)/2, JSD = ½ [Σ p log p + Σ q log q − Σ (p + q) log(p + q) + ln 2 · Σ (p + q)],
    so a pair costs one ``log`` (of p + q) instead of four, and a candidate's own entropy term
    is computed once for all the pairs it takes part in. Equal to ``jsd`` up to float rounding
    (``tests/analysis/test_adversarial.py`` holds the two objectives together); clamped to
    [0, ln 2] as ``jsd``.
    """
    s = p + q
    mixed = (s * (_log_clamped(s) - LN2)).sum(-1)
    return (0.5 * (p_log_p + q_log_q - mixed)).clamp(min=0.0, max=LN2)


def _row_objective(
    logits_of,
    batch: PreparedBatch,
    theta: Tensor,
    b_idx: Tensor,
    t_idx: Tensor,
    acfg: AdversarialParams,
    fixed: _Fixed | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-row adversarial loss for the rows (b_idx, t_idx), the fused form of
    :func:`_row_objective_reference` (the same loss up to float rounding).

    What does not depend on θ (p, α and α's Σ α log α) is computed once per search
    (:class:`_Fixed`); every JSD is :func:`_jsd_fused`: one ``log`` of the candidates' head means
    per iteration and one per pair, the K × K pairwise term over the pairs k < k' only (JSD is
    symmetric and JSD(α̃_k, α̃_k) = 0: mean over K × K = 2 Σ_{k<k'} / K²).

    Args / Returns: as :func:`_row_objective_reference`; ``fixed`` from :func:`_fixed_terms`
    (computed here when None).
    """
    fixed = _fixed_terms(batch, b_idx, t_idx) if fixed is None else fixed
    cand = torch.softmax(theta, dim=-1)  # (N, K, H, T_x), exactly 0 at padding
    p_new = torch.softmax(logits_of(cand), -1)  # (N, K, V)
    cand_mean = cand.mean(2)  # (N, K, T_x)
    c_log_c = (cand_mean * _log_clamped(cand_mean)).sum(-1)  # (N, K)
    div = _jsd_fused(cand_mean, fixed.alpha, c_log_c, fixed.alpha_log_alpha)  # (N, K)
    out_tvd = tvd(p_new, fixed.p_orig)  # (N, K)
    k = cand_mean.size(1)
    loss = (-div + acfg.lam * torch.relu(out_tvd - acfg.eps_opt)).sum(-1)
    if k > 1:
        i, j = torch.triu_indices(k, k, 1, device=theta.device)
        cross = _jsd_fused(cand_mean[:, i], cand_mean[:, j], c_log_c[:, i], c_log_c[:, j])
        loss = loss - cross.sum(-1) * (2.0 / (k * k))
    return loss, div, out_tvd, cand


@dataclass
class _Fixed:
    """The parts of the objective that do not depend on θ, for the rows of one search.

    Attributes:
        p_orig: (N, 1, V) the model's output distribution p at each row.
        alpha: (N, 1, T_x) the head mean of the model's attention α.
        alpha_log_alpha: (N, 1) Σ α log α (0 · log 0 := 0).
    """

    p_orig: Tensor
    alpha: Tensor
    alpha_log_alpha: Tensor


def _fixed_terms(batch: PreparedBatch, b_idx: Tensor, t_idx: Tensor) -> _Fixed:
    """:class:`_Fixed` of the rows (b_idx, t_idx) (long (N,) each)."""
    tr = batch.trace
    p_orig = torch.softmax(tr.logits[b_idx, t_idx], -1).unsqueeze(1)
    alpha = tr.attention[b_idx, :, t_idx].mean(1).unsqueeze(1)
    return _Fixed(p_orig, alpha, (alpha * _log_clamped(alpha)).sum(-1))


def _softmax_rows(theta: Tensor) -> Tensor:
    """softmax(θ) along the last axis written out, exp(θ − max θ) / Σ exp(θ − max θ) (−inf gives
    exactly 0). The same function as ``torch.softmax`` up to float rounding; on the CPU about 4×
    faster for the search's short rows (T_x ≈ 10 positions: ``torch.softmax`` vectorises along
    the row)."""
    e = (theta - theta.amax(-1, keepdim=True)).exp_()
    return e.div_(e.sum(-1, keepdim=True))


@functools.lru_cache(maxsize=16)
def _pair_weights(k: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """W (K+1, K+1) (cached: never modified): the loss's JSD terms as Σ_ab W_ab JSD(d_a, d_b) over d = [α̃_1 … α̃_K; α]
    (head means): W_kα = W_αk = −½ (so −JSD(α̃_k, α) once per candidate), W_kk' = −1/K² (the
    mean over the K × K candidate pairs, diagonal included), W_αα = 0."""
    w = torch.full((k + 1, k + 1), -1.0 / (k * k), dtype=dtype, device=device)
    w[:k, k] = w[k, :k] = -0.5
    w[k, k] = 0.0
    return w


_softmax_backward = torch.ops.aten._softmax_backward_data
"""_softmax_backward(g, y, dim, dtype) = y ⊙ (g − Σ y g): the gradient through y = softmax(a)
from its output, one kernel."""


def _objective_and_grad(
    logits_of,
    theta: Tensor,
    fixed: _Fixed,
    acfg: AdversarialParams,
    smoothing: tuple[float, float] | None = None,
) -> tuple[Tensor, Tensor]:
    """The per-row loss of :func:`_row_objective` and its gradient w.r.t. θ, every derivative
    written out; autograd only through a model whose row form has no written-out
    vector–Jacobian product (``logits_of.with_vjp``, :class:`attnstudy.models.seq2seq.RowLogits`:
    the recurrent family has one; the Transformer's row form and the scatter form do not).

    The JSD terms as one (K+1) × (K+1) matrix: with d = [c_1 … c_K; α] (c_k the head mean of
    α̃_k = softmax(θ_k)), s_ab = d_a + d_b and JSD(d_a, d_b) = ½ [Σ d_a log d_a + Σ d_b log d_b −
    Σ s_ab log s_ab + ln 2 · Σ s_ab] (Lin 1991), the loss's JSD part is Σ_ab W_ab JSD(d_a, d_b)
    (:func:`_pair_weights`), and since ∂JSD(p, q)/∂p_j = ½ (log p_j − log s_j + ln 2) and W is
    symmetric, ∂/∂c_k = Σ_b W_kb (log c_k − log s_kb + ln 2); the clamp to [0, ln 2] passes the
    gradient only inside it (as ``clamp``'s backward). The diagonal JSD(c_k, c_k) is 0 up to
    rounding, its derivative too. The hinge λ · ReLU(TVD(p̃, p) − ε) has ∂/∂p̃ = λ/2 · sign(p̃ −
    p) where TVD > ε, taken through the output softmax (∂/∂z = p̃ ⊙ (g − Σ p̃ g)) and then
    through the model; the candidates' gradient (the JSD part spread over the H heads of the
    mean) goes through the softmax over positions the same way. Logs are clamped as in
    :func:`_log_clamped`, so padding positions (α̃ = 0) get finite terms times 0.

    Args:
        logits_of: candidates (N, K, H, T_x) → logits (N, K, V), differentiable (or with
            ``with_vjp``).
        theta: (N, K, H, T_x) candidate logits, −inf at padding. fixed: :func:`_fixed_terms`.
        smoothing: (δ, τ): the rprop-1 solver's smoothed hinge (:func:`_smoothed_hinge`) in
            place of λ · ReLU(TVD − ε): its value in the loss, λ σ((TVD_δ − ε)/τ) · ½ diff /
            √(diff² + δ²) as ∂/∂p̃ (the plain form: :func:`_row_objective_reference` with the same
            ``smoothing``).

    Returns:
        loss (N,) and ∂ Σ loss / ∂θ (N, K, H, T_x) (0 at padding). Equal to :func:`_row_objective`
        and its autograd gradient up to float rounding (``tests/analysis/test_adversarial.py``).
    """
    with torch.no_grad():
        cand = _softmax_rows(theta)  # (N, K, H, T_x)
        heads, k = cand.size(2), cand.size(1)
        c = cand[:, :, 0] if heads == 1 else cand.mean(2)  # (N, K, T_x)
        d = torch.cat([c, fixed.alpha], 1)  # (N, K + 1, T_x)
        log_d = _log_clamped(d)
        d_log_d = (d * log_d).sum(-1)  # (N, K + 1)
        s = d.unsqueeze(2) + d.unsqueeze(1)  # (N, K + 1, K + 1, T_x)
        log_s = _log_clamped(s)
        raw = (d_log_d.unsqueeze(2) + d_log_d.unsqueeze(1)).sub_((s * (log_s - LN2)).sum(-1))
        raw.mul_(0.5)  # JSD(d_a, d_b), (N, K + 1, K + 1)
        pair_w = _pair_weights(k, c.dtype, c.device)
        clamped = raw.clamp(min=0.0, max=LN2)
        loss = (clamped * pair_w).sum((1, 2))
        w = (clamped == raw) * pair_w  # clamped == raw: 0 ≤ raw ≤ ln 2, where clamp passes ∂
        # ∂/∂c_k = Σ_b W_kb (log c_k − log s_kb + ln 2), (N, K, T_x)
        grad_c = (log_d[:, :k].unsqueeze(2) - log_s[:, :k]).add_(LN2).mul_(w[:, :k, :, None])
        grad_c = grad_c.sum(2)
    with_vjp = getattr(logits_of, "with_vjp", None)
    if with_vjp is not None:  # the model's backward written out (the recurrent row forms)
        logits, vjp = with_vjp(cand)  # (N, K, V)
    else:
        cand.requires_grad_(True)
        with torch.enable_grad():
            logits = logits_of(cand)  # (N, K, V)
    with torch.no_grad():
        p_new = torch.softmax(logits.detach(), -1)
        diff = p_new - fixed.p_orig
        if smoothing is None:
            over = diff.abs().sum(-1).mul_(0.5).sub_(acfg.eps_opt)  # TVD − ε, (N, K)
            loss.add_(torch.relu(over).sum(-1), alpha=acfg.lam)
            g_p = diff.sign_().mul_(((over > 0).to(diff.dtype) * (0.5 * acfg.lam)).unsqueeze(-1))
        else:
            hinge, slope, g_p = _smoothed_hinge(diff, acfg.eps_opt, *smoothing)
            loss.add_(hinge.sum(-1), alpha=acfg.lam)
            g_p.mul_(slope.mul_(acfg.lam).unsqueeze(-1))
        g_logits = _softmax_backward(g_p, p_new, -1, p_new.dtype)
    if with_vjp is not None:
        grad = vjp(g_logits)
    else:
        (grad,) = torch.autograd.grad(logits, cand, g_logits)
    with torch.no_grad():
        grad.add_((grad_c if heads == 1 else grad_c.div_(heads)).unsqueeze(2))
        grad = _softmax_backward(grad, cand.detach(), -1, cand.dtype)
    return loss, grad
