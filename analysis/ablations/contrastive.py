"""Contrastive questions per decoder step: why ŷ_t rather than a foil y'_t (Yin & Neubig 2022,
"Interpreting Language Models with Contrastive Explanations", §3).

* Contrastive input × gradient: c_tj = Σ_d e_jd · ∂(log p_t(ŷ_t) − log p_t(y'_t)) / ∂e_jd (the
  attention detached, as the importance ablation's gradient), beside the plain input × gradient
  of log p_t(ŷ_t): Kendall τ-b of |c_t| against the attention row and against the plain form.
* Interventions that move the decision *to the foil*: under uniform attention, with the largest
  weight erased, and under ``n`` random permutations (the permutation ablation's), whether the
  argmax becomes y'_t specifically, beside whether it changes at all (the plain flip).

The foil is the runner-up (the most probable token other than ŷ_t at that step) or a token the
user names (``foil = "x"``, a token of the target vocabulary; a step whose ŷ_t is that token has
no foil and is undefined).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from attnstudy.analysis.catalogue import AblationSpec, Params, Stat, VerdictRole
from pydantic import Field
from torch import Tensor

from attnstudy.models import eval_mode, gradients_in_eval

from .._chunks import base_probs, n_valid, require_attention, step_frame
from ..batch import AblationContext, PreparedBatch, step_streams
from ..divergences import kendall_tau
from ..interventions import erase_max, permute, uniform


class ContrastiveParams(Params):
    """Settings of ``[ablation.contrastive]``.

    Attributes:
        foil: ``"runner_up"`` or a token of the target vocabulary.
        n: random permutations per step.
    """

    foil: str = Field("runner_up", min_length=1, max_length=200)
    n: int = Field(20, ge=1, le=10_000)


SPEC = AblationSpec(
    name="contrastive",
    run="attnstudy.analysis.ablations.contrastive:run",
    params=ContrastiveParams,
    requires=("attention", "local", "gradients"),
    stats={
        "log_odds": Stat(
            "contrastive_log_odds", label="log p(y) − log p(foil)", unit="nats", question=None
        ),
        "tau_attn": Stat(
            "contrastive_tau_attn",
            label="τ attention–contrastive gradient",
            unit="Kendall τ-b",
            question="agrees",
            # its own sentence: the gradient of another quantity than the measures' log p(y_t)
            verdict=VerdictRole(
                "contrastive",
                "note",
                measure="the contrastive gradient",
                note="On the contrastive question (why y_t rather than its foil), attention "
                "{relation}.",
            ),
        ),
        "tau_plain": Stat(
            "contrastive_tau_plain",
            label="τ contrastive–plain gradient",
            unit="Kendall τ-b",
            question="agrees",
        ),
        "uniform_flip": Stat("contrastive_uniform_flip"),
        "uniform_to_foil": Stat(
            "contrastive_uniform_to_foil", label="uniform: to the foil", question="used"
        ),
        "erase_max_flip": Stat("contrastive_erase_max_flip"),
        "erase_max_to_foil": Stat(
            "contrastive_erase_max_to_foil", label="erase-max: to the foil", question="used"
        ),
        "permutation_flip": Stat("contrastive_permutation_flip"),
        "permutation_to_foil": Stat(
            "contrastive_permutation_to_foil",
            label="permutation: to the foil",
            unit="share of permutations (0–1)",
            question="used",
        ),
    },
    definitions=(
        (
            "foil",
            "the token a contrastive question sets against the emitted y_t: by default the "
            "runner-up of p_t; 'to the foil': the intervention makes the foil the argmax "
            "(Yin & Neubig 2022).",
        ),
        (
            "contrastive gradient",
            "Σ_d e_jd ∂(log p_t(y_t) − log p_t(foil))/∂e_jd, attention detached, ranked by "
            "absolute value.",
        ),
    ),
    terms=("Kendall τ-b", "flip"),
    default=False,
    order=78,
    description="contrastive questions: input × gradient of log p(y_t) − log p(foil) (runner-up or "
    "a named token) against attention and the plain gradient; whether uniform, erase-max and "
    "permuted attention move the argmax to the foil",
    reference="Yin & Neubig 2022",
)


def foils(probs: Tensor, target: Tensor, foil: str, vocab) -> Tensor:
    """The foil of every step: long (B, T_y); −1 where there is none (ŷ_t is the named token).

    Args:
        probs: (B, T_y, V) the step's output distribution; target: long (B, T_y) ŷ_t.
        foil: ``"runner_up"`` or a token of ``vocab`` (the target vocabulary).

    Raises:
        ValueError: a named foil that is not in the target vocabulary.
    """
    if foil == "runner_up":
        return probs.scatter(-1, target[..., None], -1.0).argmax(-1)
    if foil not in vocab.stoi:
        raise ValueError(
            f"ablation.contrastive.foil {foil!r} is not a token of the target vocabulary; name "
            "one of its tokens or use 'runner_up'"
        )
    out = torch.full_like(target, vocab.stoi[foil])
    return out.masked_fill(target == out, -1)


def contrastive_gradient(model, batch: PreparedBatch, foil: Tensor) -> Tensor:
    """Contrastive input × gradient, one backward per step for the whole batch.

    Args:
        foil: long (B, T_y) foils (−1: none).

    Returns:
        (B, T_y, T_x) signed scores (nats), NaN at padding, padding steps and steps without foil.
    """
    tr = batch.trace
    b, t_y, t_x = tr.src.size(0), tr.tgt_in.size(1), tr.src.size(1)
    out = torch.full((b, t_y, t_x), math.nan, dtype=tr.logits.dtype, device=tr.src.device)
    with eval_mode(model), gradients_in_eval():
        leaf = model.embed(tr.src).detach().requires_grad_(True)
        trace = model.trace(
            tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=leaf, detach_attention=True
        )
        steps = getattr(trace, "step_logits", None) or trace.logits.unbind(1)
        for t in range(t_y):
            logp = torch.log_softmax(steps[t], -1)
            diff = logp.gather(-1, tr.tgt_out[:, t : t + 1]) - logp.gather(
                -1, foil[:, t : t + 1].clamp(min=0)
            )
            (g,) = torch.autograd.grad(diff.sum(), leaf, retain_graph=t < t_y - 1)
            out[:, t] = (g * leaf).sum(-1).detach()
    bad = ~tr.step_mask[:, :, None] | tr.pad_mask[:, None, :] | (foil < 0)[:, :, None]
    return out.masked_fill(bad, math.nan)


def to_foil(model, batch: PreparedBatch, base: Tensor, foil: Tensor, ok: Tensor, n: int, ctx):
    """Whether uniform attention, the largest weight erased and each of ``n`` random permutations
    (the permutation ablation's: seed and stream ``"permutation"``) change the argmax, and
    whether they move it to the foil.

    Args:
        base: (B, T_y, V) the unmodified steps' distribution; foil: long (B, T_y); ok: bool
            (B, T_y), the steps to compute.

    Returns:
        ``contrastive_<uniform|erase_max|permutation>_<flip|to_foil>`` → (B, T_y) float64 (0/1;
        permutation: shares of the n that are not the identity), NaN outside ``ok``; to the foil = the argmax becomes the
        foil and was not the foil before (so it is also a flip).
    """
    tr = batch.trace
    att = tr.attention
    valid = ~tr.pad_mask
    base_arg = base.argmax(-1)
    # "to the foil" is a move: where the unmodified argmax is the foil already (y_t not the
    # argmax: a reference prefix, a forced <eos>), staying there is no move to it
    moved = base_arg != foil
    cols = {}
    with eval_mode(model), torch.no_grad():
        for name, weights in (
            ("uniform", uniform(valid, att)),
            ("erase_max", erase_max(att, valid).weights),
        ):
            arg = model.logits_given_attention(tr, weights, ctx.chunk_rows, ok).argmax(-1)
            cols[f"contrastive_{name}_flip"] = (arg != base_arg).double().masked_fill(~ok, math.nan)
            cols[f"contrastive_{name}_to_foil"] = (
                ((arg == foil) & moved).double().masked_fill(~ok, math.nan)
            )
        ids = batch.example_ids
        # the permutation ablation's streams: its first n permutations of each step
        perm = permute(att, valid, n, step_streams(ctx, ids, "permutation"), ok)
        arg = model.logits_given_attention(tr, perm.weights, ctx.chunk_rows, ok).argmax(-1)
        # shares of the permutations that are not the identity, as the permutation ablation's
        # flip rate (NaN where every permutation was the identity)
        real = (~perm.identity).double()  # (B, P, T_y)
        n_real = real.sum(1)
        undefined = ~ok | (n_real == 0)
        for col, hit in (
            ("flip", arg != base_arg[:, None]),
            ("to_foil", (arg == foil[:, None]) & moved[:, None]),
        ):
            share = (hit.double() * real).sum(1) / n_real.clamp(min=1)
            cols[f"contrastive_permutation_{col}"] = share.masked_fill(undefined, math.nan)
    return cols


def run(model, batch: PreparedBatch, params: ContrastiveParams, ctx: AblationContext):
    """The contrastive questions of every real step.

    Returns:
        One row per real step: ``example_id``, ``step``, ``contrastive_foil`` (token id, −1:
        none), ``contrastive_log_odds`` (log p_t(ŷ_t) − log p_t(foil), nats),
        ``contrastive_tau_attn`` / ``contrastive_tau_plain`` (Kendall τ-b of |contrastive
        gradient| against the head-mean attention / the plain |input × gradient|),
        ``contrastive_<intervention>_flip`` and ``…_to_foil`` for uniform, erase_max and
        permutation (permutation: shares of the ``n`` permutations), ``contrastive_skipped``
        (fewer than two source tokens); NaN where undefined.

    Raises:
        NoAttentionError: for the ``none`` model.
        ValueError: a named foil not in the target vocabulary.
    """
    from ..attribution import gradient_scores

    att = require_attention(model, batch, "contrastive")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    nv = n_valid(tr)
    with eval_mode(model), torch.no_grad():
        base = base_probs(model, tr, ctx.chunk_rows)
    foil = foils(base, tr.tgt_out, params.foil, batch.tgt_vocab)
    ok = tr.step_mask & (nv >= 2)[:, None] & (foil >= 0)
    logp = torch.log(base.double().clamp_min(1e-300))
    odds = (
        logp.gather(-1, tr.tgt_out[..., None])[..., 0]
        - logp.gather(-1, foil.clamp(min=0)[..., None])[..., 0]
    )
    cols = {"contrastive_log_odds": odds.masked_fill(~ok, math.nan)}
    cols.update(to_foil(model, batch, base, foil, ok, params.n, ctx))
    contrast = contrastive_gradient(model, batch, foil).abs().cpu().numpy()
    plain = gradient_scores(model, batch)["input_x_gradient"].abs().cpu().numpy()
    mean_att = att.mean(1).cpu().numpy()
    lengths = tr.src_lengths.tolist()
    ok_np = ok.cpu().numpy()
    tau_attn, tau_plain = [], []
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        n = int(lengths[b])
        if not ok_np[b, t]:
            tau_attn.append(math.nan)
            tau_plain.append(math.nan)
            continue
        c = contrast[b, t, :n]
        tau_attn.append(kendall_tau(mean_att[b, t, :n], c)[0])
        tau_plain.append(kendall_tau(plain[b, t, :n], c)[0])
    for col, v in cols.items():
        frame[col] = v[b_idx, t_idx].cpu().numpy()
    frame["contrastive_foil"] = foil[b_idx, t_idx].cpu().numpy()
    frame["contrastive_tau_attn"] = np.asarray(tau_attn, dtype=float)
    frame["contrastive_tau_plain"] = np.asarray(tau_plain, dtype=float)
    frame["contrastive_skipped"] = (nv[b_idx] < 2).cpu().numpy()
    return frame


__all__ = ["contrastive_gradient", "foils", "run", "to_foil"]
