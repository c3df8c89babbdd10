"""ALTI+ (Ferrando, Gállego, Alastruey, Escolano & Costa-jussà 2022, "Towards Opening the Black Box
of Neural Machine Translation: Source and Target Contributions to the Model", EMNLP, §3), built on
ALTI (Ferrando, Gállego & Costa-jussà 2022, "Measuring the Mixing of Contextual Information in the
Transformer", EMNLP): how much of each prediction comes from every source token and from
every target-prefix token, through the residual stream, the value vectors and the layer norms.

Per attention sublayer, the output y_i (after the residual connection and, post-LN, the layer norm)
is decomposed into one vector per input: T_i(x_j) = Σ_h α^h_ij W^O_h (W^V_h x'_j + b^V_h), plus the
residual x_i on its own position (self-attention) or as an input of its own (cross-attention: the
decoder stream). A post-LN layer norm LN(z) = γ ⊙ (z − μ(z)) / σ(z) + β is linear in z once σ(z)
of the whole sum is fixed, so every part is carried through L_i(u) = γ ⊙ (u − μ(u)) / σ_i (the
paper's "folded" layer norm); the output bias b^O and β belong to no input and are left out of the
parts but kept in y_i. The contribution of input j (ALTI's, with the L1 distance):

    c_{i←j} = max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁),  normalised to sum 1 over j.

Pre-LN (attnstudy's ``layer_norm = "pre"``): the layer norm acts on each input alone (x'_j =
LN(x_j)), so it is part of T_i(x_j), and y_i = x_i + Σ_j … + b^O is the sublayer's output; the
final layer norm of a stack acts on one position and is not a mixing step.

Rollout (ALTI+ §3): the encoder's R_enc = C^enc_L ⋯ C^enc_1 (source tokens → encoder outputs); in
the decoder, each position carries a row over [source tokens | prefix tokens], R^0 = [0 | I]; at
layer l, the self-attention gives S = C^self_l R^{l−1}, and the cross-attention mixes the encoder
outputs (each carrying its row of R_enc over the source) with the decoder stream (carrying S):
R^l_t = Σ_j C^cross_l[t, j] [R_enc[j] | 0] + C^cross_l[t, res] S_t. The feed-forward sublayers are
not decomposed (ALTI's assumption: a position-wise map keeps its input's contributions). Row t of
R^L is step t's ALTI+ contributions; its source block's sum is the source contribution.

Per decoder step (on the reference prefix, so that gold links can score the argmax): the source
contribution, Kendall τ-b of the source contributions against the analysed layer's head-mean
attention and against leave-one-out importance (and attention's own τ with LOO), and the argmax of
the source contributions as a hard alignment beside attention's argmax (AER against gold links).

Models: attnstudy's Transformer (pre- and post-LN) and the Hugging Face Marian and BART families
(post-LN); any other model is refused in one line (:class:`AltiUnsupportedError`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import AblationSpec, Figure, Question, Stat, VerdictRole

from .._chunks import require_attention, step_frame
from ..batch import AblationContext, PreparedBatch
from ..divergences import kendall_tau

SPEC = AblationSpec(
    name="alti_plus",
    run="attnstudy.analysis.ablations.alti_plus:run",
    prefix="reference",
    requires=("attention", "self_attention"),
    stats={
        "source_share": Stat(
            "alti_plus_source_share",
            label="source contribution (ALTI+)",
            unit="share of the prediction (0–1)",
            question="alti_plus",
            direction="higher",
        ),
        "tau_attn_alti": Stat(
            "alti_plus_tau_attn_alti",
            label="τ attention–ALTI+",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
            # partly built from attention itself: named beside the importance measures, not read
            verdict=VerdictRole("agrees", "beside", measure="ALTI+"),
        ),
        "tau_alti_loo": Stat(
            "alti_plus_tau_alti_loo",
            label="τ ALTI+–LOO",
            unit="Kendall τ-b",
            question="agrees",
            direction="higher",
        ),
        "tau_attn_loo": Stat("alti_plus_tau_attn_loo"),
        "aer_alti": Stat(
            num="alti_plus_alti_aer_num",
            den="alti_plus_alti_aer_den",
            complement=True,
            label="AER ALTI+ argmax",
            unit="0–1, lower is better",
            question="alti_plus",
            direction="lower",
        ),
        "aer_attention": Stat(
            num="alti_plus_attention_aer_num",
            den="alti_plus_attention_aer_den",
            complement=True,
            label="AER attention argmax",
            unit="0–1, lower is better",
            question="alti_plus",
            direction="lower",
        ),
    },
    derive="attnstudy.analysis.ablations.alti_plus:derive",
    questions={
        "alti_plus": Question(
            "How much of a prediction comes from the source? ALTI+ contributions",
            "ALTI+ (Ferrando et al. 2022) per reference target token (teacher forcing): the share "
            "of the prediction attributed to the source tokens (the rest to the target prefix), "
            "and the argmax of the source contributions as a hard alignment beside attention's "
            "argmax (AER against the gold links, corpus ratios); 95 % intervals over examples.",
            order=42,
        ),
    },
    figure=Figure(
        "alti_plus",
        "ALTI+: how much of each prediction comes from the source, along the output",
        "Ferrando et al. (2022): per reference target token (teacher forcing), the share of the "
        "prediction that ALTI+ attributes to the source tokens (the rest comes from the target "
        "prefix), averaged over the steps in each fifth of the output, a line per model with "
        "95 % bootstrap intervals over examples; steps whose contributions are undefined are "
        "left out. Near 1: the step reads the source; near 0: the decoder's own prefix decides "
        "it.",
    ),
    definitions=(
        (
            "ALTI+ contribution",
            "the share of a prediction attributed to each source and target-prefix token by "
            "ALTI+ (Ferrando et al. 2022, §3): every attention sublayer's output decomposed into "
            "one vector per input (values, residual, layer norm folded), each input's "
            "contribution max(0, ‖y‖₁ − ‖y − T(x_j)‖₁) normalised to sum 1, rolled out "
            "through the encoder and decoder layers.",
        ),
        (
            "source contribution",
            "the sum of a step's ALTI+ contributions over the source tokens (0–1); the rest "
            "comes from the target prefix.",
        ),
    ),
    terms=("Kendall τ-b",),
    default=False,
    order=87,
    description="ALTI+ contributions of every source and prefix token per step: the source "
    "share, Kendall τ against attention and leave-one-out, the argmax's AER beside attention's",
    reference="Ferrando et al. 2022 (ALTI+, EMNLP), §3; Ferrando et al. 2022 (ALTI)",
)


class AltiUnsupportedError(ValueError):
    """A model ALTI+ cannot decompose (a recurrent model, T5, the ``none`` Transformer)."""


# --- the contribution of each part of a sum --------------------------------------------------
def l1_contributions(parts: torch.Tensor, resultant: torch.Tensor) -> torch.Tensor:
    """ALTI's contributions (Ferrando et al. 2022, ALTI): c_j = max(0, ‖y‖₁ − ‖y − T_j‖₁),
    normalised to sum 1 over j.

    Args:
        parts: (…, n, d) the vectors T_j the output is decomposed into.
        resultant: (…, d) the output y.

    Returns:
        (…, n), non-negative, each row summing to 1; NaN for a row whose unnormalised
        contributions are all 0 (no part is closer to y than 0 is: undefined, never guessed).
    """
    y = resultant.unsqueeze(-2)
    c = (y.abs().sum(-1) - (y - parts).abs().sum(-1)).clamp_min(0.0)
    total = c.sum(-1, keepdim=True)
    return torch.where(total > 0, c / total.clamp_min(torch.finfo(c.dtype).tiny), math.nan)


def fold_layer_norm(
    parts: torch.Tensor, z: torch.Tensor, norm: torch.nn.Module
) -> tuple[torch.Tensor, torch.Tensor]:
    """A post-LN layer norm over a sum carried through to its parts (ALTI): with σ of the whole
    sum fixed, LN(z) = Σ_j L(u_j) + L(rest) + β, L(u) = γ ⊙ (u − μ(u)) / σ(z), σ(z) = √(Var(z) + ε)
    with the biased variance, as :class:`torch.nn.LayerNorm` computes it.

    Args:
        parts: (…, n, d) the parts u_j; z: (…, d) the whole sum (parts plus any bias).
        norm: the :class:`torch.nn.LayerNorm`.

    Returns:
        (L(u_j) (…, n, d), LN(z) (…, d)).

    Raises:
        AltiUnsupportedError: another kind of norm (RMSNorm has no mean to fold).
    """
    if not isinstance(norm, torch.nn.LayerNorm):
        raise AltiUnsupportedError(
            f"ALTI+ folds torch.nn.LayerNorm only, not {type(norm).__name__}"
        )
    gamma = norm.weight if norm.weight is not None else torch.ones_like(z[..., 0, None])
    sigma = torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + norm.eps)  # (…, 1)
    folded = gamma * (parts - parts.mean(-1, keepdim=True)) / sigma.unsqueeze(-2)
    return folded, norm(z)


def block_contributions(
    *,
    weights: torch.Tensor,
    values: torch.Tensor,
    w_out: torch.Tensor,
    b_out: torch.Tensor | None,
    residual: torch.Tensor,
    norm: torch.nn.Module | None,
    self_attention: bool,
) -> torch.Tensor:
    """ALTI contributions of one attention sublayer y_i = N(x_i + Σ_h Σ_j α^h_ij W^O_h v^h_j + b^O).

    Args:
        weights: (B, H, T_q, T_k) attention weights (0 at keys not attended).
        values: (B, H, T_k, d_h) value vectors, the value bias included (pre-LN: of the
            normalised inputs).
        w_out: (d, H·d_h) the output projection W^O; b_out: (d,) its bias or None.
        residual: (B, T_q, d) the stream x entering the sublayer.
        norm: the post-LN layer norm N over the sum (a :class:`torch.nn.LayerNorm`), or None
            (pre-LN: no norm after the residual).
        self_attention: True: the residual is position i's own input (added to part i,
            T_q = T_k); False (cross-attention): the residual is an input of its own, the last.

    Returns:
        (B, T_q, T_k) for self-attention, (B, T_q, T_k + 1) for cross-attention (the residual
        last); rows sum to 1 (NaN where undefined, :func:`l1_contributions`).
    """
    h = weights.size(1)
    blocks = w_out.view(w_out.size(0), h, -1)  # (d, H, d_h)
    per_head = torch.einsum("bhkv,dhv->bhkd", values, blocks)  # W^O_h v_j, (B, H, T_k, d)
    parts = torch.einsum("bhqk,bhkd->bqkd", weights, per_head)  # (B, T_q, T_k, d)
    if self_attention:
        eye = torch.eye(parts.size(1), dtype=parts.dtype, device=parts.device)
        parts = parts + eye[None, :, :, None] * residual[:, :, None, :]
    else:
        parts = torch.cat([parts, residual[:, :, None, :]], 2)
    z = parts.sum(2) + (0.0 if b_out is None else b_out)  # the stream before the norm
    if norm is None:
        return l1_contributions(parts, z)
    folded, y = fold_layer_norm(parts, z, norm)
    return l1_contributions(folded, y)


def mix(c: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """c @ r where a row of r that is undefined (NaN) counts only where c reads it (c > 0): a
    step is not made undefined by a later position it gives no weight (0 · NaN is NaN in a plain
    product). A row of c that is undefined gives an undefined row.

    Args:
        c: (B, N, K) contributions; r: (B, K, M) the rows they mix.

    Returns:
        (B, N, M), NaN in the rows that read an undefined row or are undefined themselves.
    """
    r_bad = torch.isnan(r).any(-1)  # (B, K)
    c_bad = torch.isnan(c).any(-1)  # (B, N)
    out = torch.nan_to_num(c, nan=0.0) @ torch.nan_to_num(r, nan=0.0)
    bad = c_bad | ((torch.nan_to_num(c, nan=0.0) > 0) & r_bad[:, None, :]).any(-1)
    return out.masked_fill(bad[..., None], math.nan)


def rollout(
    encoder: list[torch.Tensor], self_: list[torch.Tensor], cross: list[torch.Tensor]
) -> torch.Tensor:
    """ALTI+ rollout (Ferrando et al. 2022, §3) of per-layer contribution matrices.

    Args:
        encoder: per encoder layer (B, T_x, T_x).
        self_: per decoder layer (B, T_y, T_y) decoder self-attention contributions.
        cross: per decoder layer (B, T_y, T_x + 1) cross-attention contributions (residual last).

    Returns:
        (B, T_y, T_x + T_y): each decoder position's contributions over the source tokens, then the
        decoder input tokens (BOS + prefix); rows sum to 1, NaN where undefined (a row of some
        layer with no positive contribution, or one that reads such a row).
    """
    r_enc = None
    for c in encoder:
        r_enc = c if r_enc is None else mix(c, r_enc)
    b, t_y = cross[0].shape[:2]
    t_x = cross[0].size(2) - 1
    eye = torch.eye(t_y, dtype=cross[0].dtype, device=cross[0].device).expand(b, -1, -1)
    r = torch.cat([cross[0].new_zeros(b, t_y, t_x), eye], 2)
    src = torch.cat([r_enc, r_enc.new_zeros(b, t_x, t_y)], 2)  # encoder output j's row
    for cs, cc in zip(self_, cross):
        s = mix(cs, r)
        res = cc[..., t_x:]
        r = mix(cc[..., :t_x], src) + torch.where(res > 0, res * s, torch.zeros_like(s))
        r = r.masked_fill(torch.isnan(res) | (res > 0) & torch.isnan(s), math.nan)
    return r


# --- the models ------------------------------------------------------------------------------
def _split(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.view(*x.shape[:-1], heads, -1).transpose(-2, -3)


def _transformer_layers(model, tr) -> tuple[list, list, list]:
    from attnstudy.models.transformer import attend

    pre = model.pre
    src, lengths, tgt_in = tr.src, tr.src_lengths, tr.tgt_in
    pad = torch.arange(src.size(1), device=src.device)[None, :] >= lengths[:, None]
    x = model.src_embedding(src) * math.sqrt(model.d_model) + model._position(0, src.size(1))
    enc = []
    for layer in model.encoder_layers:
        a = layer.sub.inp(0, x)
        k, v = layer.self_attn.keys_values(a)
        w = attend(layer.self_attn.queries(a), k, pad[:, None, None, :])
        att = layer.self_attn
        enc.append(
            block_contributions(
                weights=w,
                values=v,
                w_out=att.out_proj.weight,
                b_out=att.out_proj.bias,
                residual=x,
                norm=None if pre else layer.sub.norms[0],
                self_attention=True,
            )
        )
        x = layer.sub.add(0, x, att.output(w, v))
        x = layer.sub.add(1, x, layer.ff(layer.sub.inp(1, x)))
    memory, _ = model.encode(src, lengths)
    t_y = tgt_in.size(1)
    x = model._decoder_input(tgt_in, 0, memory)
    future = torch.ones(t_y, t_y, dtype=torch.bool, device=src.device).triu(1)
    selfs, crosses = [], []
    for m, layer in enumerate(model.decoder_layers):
        a = layer.sub.inp(0, x)
        k, v = layer.self_attn.keys_values(a)
        w = attend(layer.self_attn.queries(a), k, future)
        att = layer.self_attn
        selfs.append(
            block_contributions(
                weights=w,
                values=v,
                w_out=att.out_proj.weight,
                b_out=att.out_proj.bias,
                residual=x,
                norm=None if pre else layer.sub.norms[0],
                self_attention=True,
            )
        )
        x = layer.sub.add(0, x, att.output(w, v))
        cw = model._cross_weights(layer, x, memory.keys[:, m], memory.pad_mask)
        cv = memory.values[:, m]
        crosses.append(
            block_contributions(
                weights=cw,
                values=cv,
                w_out=layer.cross_attn.out_proj.weight,
                b_out=layer.cross_attn.out_proj.bias,
                residual=x,
                norm=None if pre else layer.sub.norms[1],
                self_attention=False,
            )
        )
        x = layer.feed_forward(layer.cross_given_weights(x, cw, cv))
    return enc, selfs, crosses


def _hf_layers(model, tr) -> tuple[list, list, list]:
    hf, fam = model.hf, model.family
    kind = hf.config.model_type
    if kind not in ("marian", "bart") or getattr(hf.config, "normalize_before", False):
        raise AltiUnsupportedError(
            f"ALTI+ decomposes the post-LN Marian and BART families; {kind!r} is not one"
        )
    to_model = model.ids.to_model.to(tr.src.device)
    mask = (~tr.pad_mask).long()
    enc_out = hf.get_encoder()(
        inputs_embeds=model.embed(tr.src),
        attention_mask=mask,
        output_attentions=True,
        output_hidden_states=True,
        return_dict=True,
    )
    out = hf(
        encoder_outputs=enc_out,
        attention_mask=mask,
        decoder_input_ids=to_model[tr.tgt_in],
        use_cache=False,
        output_attentions=True,
        output_hidden_states=True,
        return_dict=True,
    )
    memory = enc_out.last_hidden_state

    def self_block(layer, x, w, name_attn, name_norm):
        att = layer.get_submodule(name_attn)
        v = _split(att.v_proj(x), w.size(1))
        c = block_contributions(
            weights=w,
            values=v,
            w_out=att.out_proj.weight,
            b_out=att.out_proj.bias,
            residual=x,
            norm=layer.get_submodule(name_norm),
            self_attention=True,
        )
        stream = layer.get_submodule(name_norm)(x + att.out_proj(_merge(w @ v)))
        return c, stream

    enc = []
    for layer, x, w in zip(
        hf.get_submodule(fam.encoder_layers), enc_out.hidden_states, enc_out.attentions
    ):
        enc.append(self_block(layer, x, w, fam.encoder_self, "self_attn_layer_norm")[0])
    selfs, crosses = [], []
    for layer, x, w, cw in zip(
        hf.get_submodule(fam.decoder_layers),
        out.decoder_hidden_states,
        out.decoder_attentions,
        out.cross_attentions,
    ):
        c, stream = self_block(layer, x, w, fam.decoder_self, "self_attn_layer_norm")
        selfs.append(c)
        att = layer.get_submodule(fam.cross)
        _check_cross_weights(att, stream, memory, tr.pad_mask, cw)
        crosses.append(
            block_contributions(
                weights=cw,
                values=_split(att.v_proj(memory), cw.size(1)),
                w_out=att.out_proj.weight,
                b_out=att.out_proj.bias,
                residual=stream,
                norm=layer.encoder_attn_layer_norm,
                self_attention=False,
            )
        )
    return enc, selfs, crosses


def _check_cross_weights(att, stream, memory, pad_mask, weights) -> None:
    """The cross-attention weights recomputed from the stream ALTI+ decomposes must be the
    model's: else the layer does not compute as it is read here (a wrong number is worse than
    none).

    Raises:
        AltiUnsupportedError: they differ by more than 1e-4.
    """
    h = weights.size(1)
    q, k = _split(att.q_proj(stream), h), _split(att.k_proj(memory), h)
    scores = (q @ k.transpose(-1, -2)) * att.scaling
    again = torch.softmax(scores.masked_fill(pad_mask[:, None, None, :], -math.inf), -1)
    if not torch.allclose(again, weights, atol=1e-4, rtol=0):
        raise AltiUnsupportedError(
            "this model's decoder layers do not compute as ALTI+ reads Marian/BART layers "
            "(post-LN self-attention, then cross-attention); it cannot be decomposed"
        )


def _merge(x: torch.Tensor) -> torch.Tensor:
    x = x.transpose(-2, -3)
    return x.reshape(*x.shape[:-2], -1)


ELEMENT_BUDGET = 4_000_000
"""Most elements of one sublayer's parts tensor (B', T_q, T_k, d), ~16 MB in fp32: a batch is
decomposed a few examples at a time (examples are independent), so memory stays flat."""


def alti_plus(model, trace, budget: int = ELEMENT_BUDGET) -> torch.Tensor:
    """ALTI+ contributions of every decoder step of a trace (Ferrando et al. 2022, §3).

    Args:
        model: attnstudy's :class:`~attnstudy.models.Transformer` (``multihead`` or ``uniform``
            cross-attention, pre- or post-LN) or an :class:`~attnstudy.models.hf.HFSeq2Seq` of the
            Marian or BART family, in eval mode (dropout off).
        trace: its teacher-forced trace (``src``, ``src_lengths``, ``tgt_in``) from step 0.
        budget: most elements of one sublayer's parts tensor; examples are decomposed in groups
            that fit (at least one at a time).

    Returns:
        (B, T_y, T_x + T_y) float64 on the CPU: step t's contributions over the source positions,
        then the decoder inputs (``<bos>`` + prefix; 0 past position t); 0 at padding; rows of
        real steps sum to 1 (NaN where undefined).

    Raises:
        AltiUnsupportedError: any other model (one line: what ALTI+ decomposes).
        ValueError: a trace that does not start at step 0.
    """
    from attnstudy.models.transformer import Transformer

    if getattr(trace, "offset", 0):
        raise ValueError("ALTI+ needs a trace from the first decoder step (offset 0)")
    if isinstance(model, Transformer) and model.kind != "none":
        layers, d = _transformer_layers, model.d_model
    elif type(model).__name__ == "HFSeq2Seq":
        layers, d = _hf_layers, int(model.hf.config.d_model)
    else:
        raise AltiUnsupportedError(
            "ALTI+ decomposes Transformer encoder-decoders (attnstudy's Transformer with "
            f"cross-attention, Hugging Face Marian/BART); {type(model).__name__} is not one"
        )
    b, t_x, t_y = trace.src.size(0), trace.src.size(1), trace.tgt_in.size(1)
    per_example = max(t_x + 1, t_y) * max(t_x, t_y) * d
    group = max(1, budget // per_example)
    out = []
    with torch.no_grad():
        for start in range(0, b, group):
            rows = torch.arange(start, min(b, start + group), device=trace.src.device)
            sub = trace if group >= b else trace.select(rows)
            enc, selfs, crosses = ([c.double() for c in cs] for cs in layers(model, sub))
            # a padded source position's own row is never read but could be undefined (NaN),
            # and 0 · NaN is NaN in the products: give it none
            pad = sub.pad_mask[:, :, None].to(enc[0].device)
            enc = [c.masked_fill(pad, 0.0) for c in enc]
            out.append(rollout(enc, selfs, crosses).cpu())
    return torch.cat(out)


# --- the ablation ----------------------------------------------------------------------------
COUNTS = ("n_hyp", "n_hyp_sure", "n_hyp_possible")


def run(model, batch: PreparedBatch, params, ctx: AblationContext) -> pd.DataFrame:
    """ALTI+ against attention, leave-one-out importance and gold alignments, per decoder step.

    Returns:
        One row per real step of the reference prefix: ``example_id``, ``step``,
        ``alti_plus_source_share`` (the source tokens' summed contribution),
        ``alti_plus_tau_attn_alti``, ``alti_plus_tau_alti_loo``, ``alti_plus_tau_attn_loo``
        (Kendall τ-b over the real source positions, NaN when undefined),
        ``alti_plus_{alti,attention}_{n_hyp,n_hyp_sure,n_hyp_possible}`` and
        ``alti_plus_n_sure`` (argmax links against gold, NaN without gold), and
        ``alti_plus_skipped`` (one source position, or contributions undefined).

    Raises:
        NoAttentionError: a model without cross-attention.
        AltiUnsupportedError: a model ALTI+ does not decompose.
    """
    from .attribution_alignment import argmax_counts
    from .importance import loo_importance

    require_attention(model, batch, "alti_plus")
    tr = batch.trace
    frame, b_idx, t_idx = step_frame(batch)
    contrib = alti_plus(model, tr)
    t_x = tr.src.size(1)
    source = contrib[..., :t_x].masked_fill(tr.pad_mask.cpu()[:, None, :], 0.0)
    with torch.no_grad():
        loo = loo_importance(model, batch, ctx.chunk_rows).double().cpu().numpy()
    att_t = tr.attention.mean(1).double().cpu()
    att, src_np = att_t.numpy(), source.numpy()
    share = source.sum(-1).numpy()
    cols: dict[str, list[float]] = {
        k: [] for k in ("tau_attn_alti", "tau_alti_loo", "tau_attn_loo")
    }
    skipped, shares = [], []
    lengths = tr.src_lengths.tolist()
    for b, t in zip(b_idx.tolist(), t_idx.tolist()):
        n = int(lengths[b])
        s = src_np[b, t, :n]
        bad = n < 2 or not np.isfinite(s).all()
        skipped.append(bad)
        shares.append(math.nan if not np.isfinite(s).all() else float(share[b, t]))
        if bad:
            for v in cols.values():
                v.append(math.nan)
            continue
        a, lo = att[b, t, :n], loo[b, t, :n]
        cols["tau_attn_alti"].append(kendall_tau(a, s)[0])
        cols["tau_alti_loo"].append(kendall_tau(s, lo)[0])
        cols["tau_attn_loo"].append(kendall_tau(a, lo)[0])
    frame["alti_plus_source_share"] = np.asarray(shares, dtype=float)
    for k, v in cols.items():
        frame[f"alti_plus_{k}"] = np.asarray(v, dtype=float)
    n_sure = None
    for name, scores in (("alti", source), ("attention", att_t)):
        counts = argmax_counts(batch, scores)
        n_sure = counts["n_sure"]
        for c in COUNTS:
            frame[f"alti_plus_{name}_{c}"] = counts[c]
    frame["alti_plus_n_sure"] = n_sure
    frame["alti_plus_skipped"] = np.asarray(skipped, dtype=bool)
    return frame


def derive(rows: pd.DataFrame) -> pd.DataFrame:
    """AER's numerator |A∩S| + |A∩P| and denominator |A| + |S| (Och & Ney 2003, eq. 7) of the
    ALTI+ argmax and of attention's, per step (corpus sums; 0 where there is no gold)."""
    if "alti_plus_n_sure" not in rows.columns:
        return rows
    n_sure = rows["alti_plus_n_sure"].astype(float)
    cols = {}
    for m in ("alti", "attention"):
        pre = f"alti_plus_{m}_"
        hyp = rows[f"{pre}n_hyp"].astype(float)
        ok = n_sure.notna() & hyp.notna()
        num = rows[f"{pre}n_hyp_sure"].astype(float) + rows[f"{pre}n_hyp_possible"].astype(float)
        cols[f"{pre}aer_num"] = num.where(ok, 0.0)
        cols[f"{pre}aer_den"] = (hyp + n_sure).where(ok, 0.0)
    return rows.assign(**cols)
