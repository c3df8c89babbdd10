"""Model-consistent adversarial training (Wiegreffe & Pinter 2019, "Attention is not not
Explanation", §4).

Jain & Wallace's adversary (:mod:`attnstudy.analysis.ablations.adversarial`) searches, per
decoder step, for attention rows the *given* model would accept with an unchanged output. The
stronger question is whether a *model* can attend differently and still predict the same: a
second model M_a of the same configuration is trained, from its own initialisation, to keep every
step's output distribution close to the base model M_b's while pushing its attention away from
M_b's (W&P §4, eq. 1, per decoder step t of example i):

    L(M_a; M_b) = Σ_i Σ_t [ TVD(ŷ_a^(i,t), ŷ_b^(i,t)) − λ · KL(α_a^(i,t) ‖ α_b^(i,t)) ] / n_steps

on the reference prefix (teacher forcing; M_b frozen, in eval mode). λ = 0 is distillation under
TVD; larger λ buys attention divergence with output change. The result is read as a curve: for
each λ, the attention JSD reached against the output TVD, both between M_a and M_b on held-out
examples (:func:`compare_to_base`), beside the seed variance and the per-instance adversary.

Attention here is the head mean of the analysed layer's rows (the last layer by default), as in
the seed variance. KL(α_a ‖ α_b) is summed over valid source positions; α_b is clamped below at
the smallest positive float so a weight that underflowed to 0 gives a large finite term, not inf.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pandas as pd
import torch
from torch import Tensor, nn

from attnstudy.data.batching import make_batches
from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models.trace import eval_mode
from attnstudy.runtime.progress import Progress

from .divergences import _smallest_positive, tvd
from .errors import NoAttentionError
from .seed_variance import pair_divergences


def head_mean(trace, layer: int | str = -1) -> Tensor:
    """The analysed layer's attention, head mean: (B, T_y, T_x), rows summing to 1 over the valid
    positions, exactly 0 at padding.

    Raises:
        NoAttentionError: the trace has no cross-attention.
    """
    if trace.cross_attention is None:
        raise NoAttentionError("model-consistent adversarial training needs attention")
    return trace.with_layer(layer).attention.mean(1)


def attention_kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p ‖ q) along the last axis, natural log; 0 · log 0 := 0, q clamped at the smallest
    positive float (an underflowed weight is a large finite term, never inf). p is clamped the
    same way inside its log, which changes no value and keeps the gradient finite where p is the
    masked softmax's exact 0 (its Jacobian then zeroes the term).

    Args:
        p, q: attention rows (..., T_x), exactly 0 at padding in both.

    Returns:
        shape (...), nats, ≥ 0.
    """
    tiny = _smallest_positive(q.dtype)
    return (p * (p.clamp_min(tiny).log() - q.clamp_min(tiny).log())).sum(-1)


def consistency_loss(
    adv_logits: Tensor,
    adv_attention: Tensor,
    base_probs: Tensor,
    base_attention: Tensor,
    step_mask: Tensor,
    lam: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """W&P eq. 1 per decoder step, averaged over the real steps.

    Args:
        adv_logits: (B, T_y, V) the adversary's logits (with gradient).
        adv_attention: (B, T_y, T_x) its head-mean attention (with gradient).
        base_probs: (B, T_y, V) the base model's output distributions (no gradient).
        base_attention: (B, T_y, T_x) the base model's head-mean attention (no gradient).
        step_mask: bool (B, T_y), True at real steps.
        lam: λ ≥ 0, the weight of the attention divergence.

    Returns:
        (loss, mean TVD, mean KL) over the real steps; loss = TVD − λ·KL.
    """
    mask = step_mask.to(adv_logits.dtype)
    n = mask.sum().clamp_min(1.0)
    out_tvd = (tvd(adv_logits.softmax(-1), base_probs) * mask).sum() / n
    kl = (attention_kl(adv_attention, base_attention) * mask).sum() / n
    return out_tvd - lam * kl, out_tvd, kl


def train_consistent_adversary(
    base: nn.Module,
    adversary: nn.Module,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    lam: float,
    epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    clip_norm: float = 1.0,
    layer: int | str = -1,
    progress: bool = False,
    on_epoch: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Train ``adversary`` in place against the frozen ``base`` (W&P 2019, §4, eq. 1).

    Both models share the vocabularies; the base runs in eval mode without gradients and gets
    its mode back; the adversary trains with Adam (``lr``), gradient-norm clipping and its own
    dropout, on batches of ``examples`` drawn as in training (bucketed, shuffled with ``seed``
    and the epoch), and is left in eval mode. Its dropout masks are drawn from torch's generator
    seeded with ``seed`` (inside ``torch.random.fork_rng``: the caller's stream is untouched), so
    the result does not depend on what the process ran before.

    Args:
        base, adversary: two models of one family and configuration, on one device.
        examples: the training examples (reference prefix).
        src_vocab, tgt_vocab: the vocabularies both models were built for.
        lam: λ ≥ 0.
        epochs, lr, batch_size, seed, clip_norm: the optimisation.
        layer: the analysed cross-attention layer (default the last).
        progress: a progress bar per epoch.
        on_epoch: called with (epoch, {"train/loss", "train/output_tvd", "train/attention_kl"}).

    Returns:
        The per-epoch history of those three means (over the epoch's steps).

    Raises:
        ValueError: λ < 0 or no examples. NoAttentionError: a model without attention.
        FloatingPointError: the loss became non-finite.
    """
    if lam < 0 or not math.isfinite(lam):
        raise ValueError(f"λ must be finite and ≥ 0, got {lam}")
    if not examples:
        raise ValueError("model-consistent adversarial training needs training examples")
    device = next(adversary.parameters()).device
    optimizer = torch.optim.Adam(adversary.parameters(), lr=lr)
    history = []
    # the adversary's dropout masks come from ``seed`` alone, not from whatever the process drew
    # before (an ablation, another adversary): torch's global generator is seeded inside a fork,
    # so the caller's stream is left as it was
    forked = [device.index or 0] if device.type == "cuda" else []
    with eval_mode(base), torch.random.fork_rng(devices=forked):
        torch.manual_seed(seed)
        for epoch in range(1, epochs + 1):
            adversary.train()
            batches = make_batches(
                examples, src_vocab, tgt_vocab, batch_size, shuffle=True, seed=seed + epoch
            )
            sums = {"train/loss": 0.0, "train/output_tvd": 0.0, "train/attention_kl": 0.0}
            steps = 0
            bar = Progress(len(batches), f"adversary λ={lam:g} epoch {epoch}", enabled=progress)
            for batch in batches:
                batch = batch.to(device)
                mask = batch.tgt_out != 0
                with torch.no_grad():
                    bt = base.trace(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
                    b_probs, b_att = bt.logits.softmax(-1), head_mean(bt, layer)
                at = adversary.trace(batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
                loss, out_tvd, kl = consistency_loss(
                    at.logits, head_mean(at, layer), b_probs, b_att, mask, lam
                )
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"adversary λ={lam:g} epoch {epoch}: the loss is {float(loss)}; lower lr"
                    )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(adversary.parameters(), clip_norm)
                optimizer.step()
                n = int(mask.sum())
                for key, value in zip(sums, (loss, out_tvd, kl)):
                    sums[key] += value.item() * n
                steps += n
                bar.update(1)
            bar.close()
            metrics = {k: v / max(steps, 1) for k, v in sums.items()}
            history.append(metrics)
            if on_epoch is not None:
                on_epoch(epoch, metrics)
    adversary.eval()
    return history


def compare_to_base(
    base: nn.Module,
    adversary: nn.Module,
    examples: Sequence[Example],
    src_vocab: Vocab,
    tgt_vocab: Vocab,
    batch_size: int = 32,
    layer: int | str = -1,
) -> pd.DataFrame:
    """Attention JSD and output TVD between the adversary and the base model, per decoder step of
    ``examples`` (reference prefix, so both are scored on the same steps).

    Returns:
        One row per real step: ``example_id``, ``step``, ``adversary_attention_jsd`` (JSD of the
        head-mean rows, nats, ≤ ln 2), ``adversary_output_tvd`` (over the full vocabulary),
        ``adversary_argmax_differs`` (bool).

    Raises:
        NoAttentionError: a model without attention.
    """
    table = pair_divergences(
        [base, adversary], examples, src_vocab, tgt_vocab, batch_size=batch_size, layer=layer
    )
    return table.drop(columns=["a", "b"]).rename(
        columns={
            "attention_jsd": "adversary_attention_jsd",
            "output_tvd": "adversary_output_tvd",
            "argmax_differs": "adversary_argmax_differs",
        }
    )
