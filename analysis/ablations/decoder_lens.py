"""DecoderLens (Langedijk, Mohebbi, Sarti, Zuidema & Beinborn 2024, "DecoderLens: Layerwise
Interpretation of Encoder-Decoder Transformers", Findings of NAACL, §3): what each encoder layer
already knows, read by letting the decoder cross-attend to an intermediate encoder layer.

For an encoder of L layers with outputs h^1 … h^L, the model's decoder reads h^L; the lens at
layer ℓ decodes from h^ℓ instead, the decoder's own weights unchanged (the paper's eq. 1 with the
encoder cut after layer ℓ):

    p_ℓ(y_t | y_<t, x) = Dec(y_<t, N(h^ℓ)),   ℓ = 1 … L,

where N is what the encoder applies to its last layer's output before the decoder reads it:

* attnstudy's :class:`~attnstudy.models.transformer.Transformer`, pre-LN (``layer_norm = "pre"``):
  the encoder's final layer norm, applied to h^ℓ as the paper does for pre-LN encoders;
  post-LN: nothing (every layer's output is already normalised);
* Hugging Face Marian and BART (post-LN, no final encoder layer norm): nothing, h^ℓ is the
  encoder's hidden state after layer ℓ; an encoder with a final ``layer_norm`` module gets it.

At ℓ = L the lens is the model itself (the same tensors, so the same outputs exactly). Per layer:
greedy decoding from the source (each example's own budget, 2 × its source length + 1 tokens, as
the battery's greedy prefix) scored by the task metrics every task registers
(:data:`attnstudy.data.tasks.METRICS`: exact match, and the token error rate Σ edit distance to
the closest reference / Σ its length), and teacher-forced decoding of the reference: the share
of reference tokens predicted (argmax) and the AER of the analysed layer's cross-attention argmax
against the gold links (Och & Ney 2003, eq. 7). chrF, which a translation task reports besides,
needs the task's detokenisation (its data config), which an ablation does not see: not computed.

Cost: per batch one encoder pass and L greedy decodings plus L teacher-forced decodings of the
analysed examples (incremental, one decoder step per target token).

Models: attnstudy's Transformer (``multihead`` or ``uniform`` cross-attention) and the Hugging
Face Marian and BART families, with at least two encoder layers; a recurrent model lacks the
encoder self-attention capability and is skipped; any other model (a one-layer encoder, T5) is
refused in one line (:class:`DecoderLensUnsupportedError`).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis.catalogue import AblationSpec, Figure, Question, Stat

from attnstudy.models.decoding import EOS_ID, Decoding

from .._chunks import require_attention

SPEC = AblationSpec(
    name="decoder_lens",
    run="attnstudy.analysis.ablations.decoder_lens:run",
    unit="example",
    prefix="reference",
    requires=("attention", "self_attention", "global"),
    stats={
        "exact_match_first": Stat(
            "decoder_lens_first_exact",
            label="exact match from encoder layer 1 (DecoderLens)",
            unit="share of examples (0–1)",
            question="decoder_lens",
            direction="higher",
        ),
        "token_error_rate_first": Stat(
            num="decoder_lens_first_edits",
            den="decoder_lens_first_ref_len",
            label="token error rate from encoder layer 1 (DecoderLens)",
            unit="errors per reference token",
            question="decoder_lens",
            direction="lower",
        ),
        "forced_accuracy_first": Stat(
            num="decoder_lens_first_forced_correct",
            den="decoder_lens_n_forced",
            label="teacher-forced token accuracy from encoder layer 1 (DecoderLens)",
            unit="share of reference tokens (0–1)",
            question="decoder_lens",
            direction="higher",
        ),
        "aer_first": Stat(
            num="decoder_lens_first_aer_num",
            den="decoder_lens_first_aer_den",
            complement=True,
            label="AER from encoder layer 1 (DecoderLens)",
            unit="0–1, lower is better",
            question="decoder_lens",
            direction="lower",
        ),
        "exact_match_last": Stat("decoder_lens_last_exact"),
        "token_error_rate_last": Stat(
            num="decoder_lens_last_edits", den="decoder_lens_last_ref_len"
        ),
        "forced_accuracy_last": Stat(
            num="decoder_lens_last_forced_correct", den="decoder_lens_n_forced"
        ),
        "aer_last": Stat(
            num="decoder_lens_last_aer_num", den="decoder_lens_last_aer_den", complement=True
        ),
    },
    more_stats="attnstudy.analysis.ablations.decoder_lens:more_stats",
    questions={
        "decoder_lens": Question(
            "What does each encoder layer already know? DecoderLens",
            "DecoderLens (Langedijk et al. 2024): the decoder cross-attends to the first "
            "encoder layer's output instead of the last one's (the pre-LN Transformer's final "
            "encoder layer norm applied to it); greedy decoding scored by the task's metrics, "
            "and teacher forcing on the reference: the share of reference tokens predicted and "
            "the AER of the analysed layer's attention argmax against gold links (corpus "
            "ratios). Every layer's numbers are logged as ablation/decoder_lens/<metric>_l<ℓ> "
            "and drawn in the figure; the last layer's are the model's own. 95 % intervals "
            "over examples.",
            order=44,
        ),
    },
    figure=Figure(
        "decoder_lens",
        "What each encoder layer already knows (DecoderLens)",
        "Langedijk et al. (2024): per encoder layer ℓ (x axis; ℓ = L is the model itself), the "
        "decoder reads layer ℓ's output instead of the last one's. Left: exact match of greedy "
        "decoding; middle: its token error rate; right: AER of the analysed layer's attention "
        "argmax, teacher-forced on the reference (where the examples have gold links). A line "
        "per model with 95 % bootstrap intervals over examples.",
    ),
    definitions=(
        (
            "DecoderLens",
            "the decoder run on an intermediate encoder layer's output h^ℓ instead of the last "
            "layer's (Langedijk et al. 2024, §3), the decoder's weights unchanged; for a pre-LN "
            "encoder the final layer norm is applied to h^ℓ. At the last layer it is the model "
            "itself.",
        ),
    ),
    default=False,
    order=88,
    description="DecoderLens: the decoder reads each encoder layer's output in turn; per layer "
    "greedy exact match and token error rate, teacher-forced token accuracy and attention AER; "
    "cost per example: one encoder pass, L greedy and L teacher-forced decodings (L encoder "
    "layers)",
    reference="Langedijk et al. 2024 (DecoderLens, Findings of NAACL), §3",
)


class DecoderLensUnsupportedError(ValueError):
    """A model DecoderLens cannot read (a one-layer encoder, T5, a recurrent model)."""


MAX_DECODE_FACTOR = 2.0
"""An example's greedy budget: 2 × its source length + 1 tokens, as the battery's greedy prefix
(:func:`attnstudy.analysis.batch.prepare_batches`)."""


# --- the encoder layers' outputs as decoding states --------------------------------------------
def _transformer_states(model, src: torch.Tensor, src_lengths: torch.Tensor) -> list:
    from attnstudy.models.transformer import TransformerMemory, _TransformerState

    pad_mask = torch.arange(src.size(1), device=src.device)[None, :] >= src_lengths[:, None]
    # exactly Transformer.encode's operations, keeping every layer's output
    emb = model.embed(src)
    x = model.dropout(emb * math.sqrt(model.d_model) + model._position(0, src.size(1)))
    outputs = []
    for layer in model.encoder_layers:
        x, _ = layer(x, pad_mask)
        outputs.append(x)
    states = []
    for h in outputs:
        if model.encoder_norm is not None:  # pre-LN: the final layer norm, as the paper does
            h = model.encoder_norm(h)
        kv = [layer.cross_attn.keys_values(h) for layer in model.decoder_layers]
        memory = TransformerMemory(
            torch.stack([k for k, _ in kv], 1), torch.stack([v for _, v in kv], 1), pad_mask
        )
        empty = pad_mask.new_zeros(
            (src.size(0), model.layers, model.heads, 0, model.d_model // model.heads),
            dtype=torch.float32,
        )
        states.append(_TransformerState(memory, empty, empty.clone()))
    return states


def _hf_states(model, src: torch.Tensor, src_lengths: torch.Tensor) -> list:
    from attnstudy.models import hf

    kind = model.hf.config.model_type
    if kind not in ("marian", "bart"):
        raise DecoderLensUnsupportedError(
            f"DecoderLens reads the Marian and BART families; {kind!r} is not one"
        )
    token = hf._ACTIVE.set(model._hooks())
    try:
        mask = (torch.arange(src.size(1), device=src.device)[None, :] < src_lengths[:, None]).long()
        enc = model._encoder()(
            inputs_embeds=model.embed(src),
            attention_mask=mask,
            output_hidden_states=True,
            return_dict=True,
        )
    finally:
        hf._ACTIVE.reset(token)
    hidden = enc.hidden_states  # the embeddings' output, then each layer's: L + 1
    n = model.encoder_layers
    if hidden is None or len(hidden) != n + 1:
        raise DecoderLensUnsupportedError(
            f"this encoder does not give one hidden state per layer ({n} layers); "
            "DecoderLens cannot read it"
        )
    norm = getattr(model._encoder(), "layer_norm", None)  # a final encoder layer norm, if any
    out = []
    for ell in range(1, n + 1):
        h = enc.last_hidden_state if ell == n else hidden[ell]
        if ell < n and norm is not None:
            h = norm(h)
        out.append(hf._HFState(h, mask, None, None))
    return out


def encoder_layer_states(model, src: torch.Tensor, src_lengths: torch.Tensor) -> list:
    """One incremental-decoding state per encoder layer ℓ = 1 … L, whose memory is layer ℓ's
    output (Langedijk et al. 2024, §3), the final layer norm applied for a pre-LN Transformer.

    Args:
        model: attnstudy's :class:`~attnstudy.models.transformer.Transformer` with
            cross-attention, or an :class:`~attnstudy.models.hf.HFSeq2Seq` of the Marian or BART
            family, with at least 2 encoder layers; in eval mode.
        src: long (B, T_x) source ids; src_lengths: long (B,).

    Returns:
        L states for the model's ``advance`` (:mod:`attnstudy.models.decoding`); the last is the
        state the model's own ``begin`` gives (the same tensors).

    Raises:
        DecoderLensUnsupportedError: any other model, or one encoder layer (one line).
    """
    from attnstudy.models.transformer import Transformer

    if isinstance(model, Transformer) and model.kind != "none":
        n, states = model.layers, _transformer_states
    elif type(model).__name__ == "HFSeq2Seq":
        n, states = model.encoder_layers, _hf_states
    else:
        raise DecoderLensUnsupportedError(
            "DecoderLens reads Transformer encoder-decoders (attnstudy's Transformer with "
            f"cross-attention, Hugging Face Marian/BART); {type(model).__name__} is not one"
        )
    if n < 2:
        raise DecoderLensUnsupportedError(
            f"DecoderLens needs at least 2 encoder layers; this encoder has {n}"
        )
    return states(model, src, src_lengths)


class _Lens(Decoding):
    """A model whose ``begin`` returns a given state: :class:`~attnstudy.models.decoding.Decoding`
    over the model's own ``advance``."""

    def __init__(self, model, state) -> None:
        self.model, self.state = model, state

    def begin(self, src, src_lengths):
        return self.state

    def advance(self, *args, **kwargs):
        return self.model.advance(*args, **kwargs)


def lens_decode(
    model,
    state,
    src: torch.Tensor,
    src_lengths: torch.Tensor,
    *,
    max_len: int,
    prefix: torch.Tensor | None = None,
    layer: int | str = -1,
):
    """Greedy or teacher-forced decoding from one lens state (:func:`encoder_layer_states`).

    Args:
        model: the model the state is of; state: one of :func:`encoder_layer_states`.
        src: long (B, T_x); src_lengths: long (B,).
        max_len: most steps (including ``<eos>``) when free-running.
        prefix: optional long (B, T_y) ``<bos>`` + reference to teacher-force (T_y steps).
        layer: the decoder layer whose cross-attention rows are returned (index, negative from
            the top, or :data:`~attnstudy.models.ALL`).

    Returns:
        :class:`~attnstudy.models.trace.Decoded`: tokens (B, T) the argmax at every step, logits
        (B, T, V), attention (B, H_u, T, T_x) of ``layer``.
    """
    return _Lens(model, state).decode(src, src_lengths, max_len, prefix=prefix, layer=layer)


# --- the ablation ------------------------------------------------------------------------------
def _greedy_hypotheses(decoded, src_lengths: torch.Tensor) -> list[list[int]]:
    """:meth:`Decoding.greedy`'s ids per example, cut to each example's own budget as
    :func:`~attnstudy.analysis.batch.prepare_batches` cuts the greedy prefix."""
    out = []
    for row, n, n_src in zip(decoded.tokens, decoded.lengths, src_lengths.tolist()):
        n = int(n)
        ids = row[: max(n - 1, 0)].tolist() if row[n - 1] == EOS_ID else row[:n].tolist()
        out.append(ids[: int(MAX_DECODE_FACTOR * n_src) + 1])
    return out


def run(model, batch, params, ctx) -> pd.DataFrame:
    """DecoderLens (Langedijk et al. 2024, §3) per encoder layer ℓ = 1 … L, per example.

    Returns:
        One row per EXAMPLE: ``example_id``, ``decoder_lens_layers`` (L), and per layer ℓ
        (``l<ℓ>``, and ``first`` = ℓ 1, ``last`` = ℓ L): ``decoder_lens_<ℓ>_exact`` (1.0: the
        greedy output equals a reference), ``_edits`` and ``_ref_len`` (edit distance to the
        closest reference and its length, tokens), ``_forced_correct`` (reference tokens that are
        the argmax under teacher forcing), ``_aer_num`` and ``_aer_den`` (|A∩S| + |A∩P| and
        |A| + |S| of the analysed layer's head-mean attention argmax, summed over the example's
        steps; 0 without gold); ``decoder_lens_n_forced`` (the reference's steps, ``<eos>``
        included); ``decoder_lens_skipped`` (False).

    Raises:
        NoAttentionError: a model without cross-attention.
        DecoderLensUnsupportedError: a model DecoderLens does not read (one line).
    """
    from attnstudy.models import ALL, eval_mode
    from attnstudy.scoring.metrics import closest_reference

    from .attribution_alignment import argmax_counts

    require_attention(model, batch, "decoder_lens")
    tr = batch.trace
    src, lengths = tr.src, tr.src_lengths
    max_len = int(MAX_DECODE_FACTOR * int(lengths.max())) + 2
    head = getattr(tr, "head", ALL)
    decode = batch.tgt_vocab.decode
    real = tr.step_mask.cpu()
    rows = [
        {"example_id": ex.id, "decoder_lens_n_forced": float(real[i].sum())}
        for i, ex in enumerate(batch.examples)
    ]
    with eval_mode(model), torch.no_grad():
        states = encoder_layer_states(model, src, lengths)
        n_layers = len(states)
        for ell, state in enumerate(states, start=1):
            greedy = lens_decode(model, state, src, lengths, max_len=max_len)
            forced = lens_decode(
                model, state, src, lengths, max_len=0, prefix=tr.tgt_in, layer=tr.layer
            )
            att = forced.attention
            att = att.mean(1) if head == ALL else att[:, head]  # (B, T_y, T_x)
            counts = argmax_counts(batch, att.masked_fill(tr.pad_mask[:, None, :], 0.0))
            # the argmax at every step (Decoded.tokens is <pad> after a predicted <eos>)
            correct = ((forced.logits.argmax(-1) == tr.tgt_out) & tr.step_mask).sum(1).cpu()
            names = [f"l{ell}"] + ["first"] * (ell == 1) + ["last"] * (ell == n_layers)
            hyps = _greedy_hypotheses(greedy, lengths)
            b_of_step = tr.step_mask.nonzero()[:, 0].cpu().numpy()
            num = np.nan_to_num(counts["n_hyp_sure"] + counts["n_hyp_possible"])
            den = np.nan_to_num(counts["n_hyp"] + counts["n_sure"])
            aer_num = np.bincount(b_of_step, weights=num, minlength=len(rows))
            aer_den = np.bincount(b_of_step, weights=den, minlength=len(rows))
            for i, ex in enumerate(batch.examples):
                hyp = tuple(decode(hyps[i]))
                ref, dist = closest_reference(hyp, ex.references)
                values = {
                    "exact": float(hyp in {tuple(r) for r in ex.references}),
                    "edits": float(dist),
                    "ref_len": float(len(ref)),
                    "forced_correct": float(correct[i]),
                    "aer_num": float(aer_num[i]),
                    "aer_den": float(aer_den[i]),
                }
                for name in names:
                    for k, v in values.items():
                        rows[i][f"decoder_lens_{name}_{k}"] = v
    frame = pd.DataFrame(rows)
    frame["decoder_lens_layers"] = n_layers
    frame["decoder_lens_skipped"] = False
    return frame


_LAYER_COLUMN = re.compile(r"^decoder_lens_l(\d+)_exact$")


def layers_of(columns) -> list[int]:
    """The encoder layers ℓ (1-based, ascending) whose DecoderLens columns are among ``columns``."""
    return sorted(int(m.group(1)) for c in columns if (m := _LAYER_COLUMN.match(str(c))))


def more_stats(columns) -> dict[str, Stat]:
    """Per encoder layer ℓ found among ``columns``: ``exact_match_l<ℓ>``,
    ``token_error_rate_l<ℓ>``, ``forced_accuracy_l<ℓ>`` and ``aer_l<ℓ>`` (logged, not report
    columns: the figure draws them)."""
    out: dict[str, Stat] = {}
    for ell in layers_of(columns):
        p = f"decoder_lens_l{ell}_"
        out[f"exact_match_l{ell}"] = Stat(f"{p}exact")
        out[f"token_error_rate_l{ell}"] = Stat(num=f"{p}edits", den=f"{p}ref_len")
        out[f"forced_accuracy_l{ell}"] = Stat(num=f"{p}forced_correct", den="decoder_lens_n_forced")
        out[f"aer_l{ell}"] = Stat(num=f"{p}aer_num", den=f"{p}aer_den", complement=True)
    return out
