"""Pretrained Hugging Face encoder-decoders (Marian, BART, T5) under the analysis contract.

A folder written by ``save_pretrained`` (config, safetensors weights, tokenizer) is loaded offline
and safely (:func:`load_pretrained`: ``local_files_only``, ``trust_remote_code=False``, safetensors
only) and wrapped as :class:`HFSeq2Seq`, which satisfies the model contract of
:mod:`attnstudy.analysis.contract` like the recurrent and Transformer families: a teacher-forced
:meth:`~HFSeq2Seq.trace` with the cross-attention of every decoder layer ``(B, L, H, T_y, T_x)``,
the exact local intervention :meth:`~HFSeq2Seq.logits_given_attention`, free-running
:meth:`~HFSeq2Seq.decode` with an intervention at every step, a trace through given source
embeddings (gradient and leave-one-out importance) and the encoder self-attention (rollout).

Interventions go through transformers' supported extension point: the attention function
``"attnstudy"`` registered in :class:`transformers.AttentionInterface` (with the additive float
mask of the ``eager`` implementation in :class:`transformers.AttentionMaskInterface`). It computes
attention exactly as the family's own ``eager_attention_forward`` and, only while an intervention
is active and only for the chosen cross-attention modules, replaces the weights before they
multiply the values. No module of the model is patched.

Ids. The battery's tables and decoding use attnstudy's id space (``<pad>`` 0, ``<bos>`` 1,
``<eos>`` 2, ``<unk>`` 3, then every other id of the model's vocabulary in its order):
:class:`HFVocabulary` maps it to the model's ids and back, exactly (a permutation of the output
columns). ``<bos>`` is the model's ``decoder_start_token_id``. The model's padding token and the
decoder-start token are never predictions: their output columns are banned (a logit of
:data:`BANNED_LOGIT`), as ``generate`` does with ``bad_words_ids`` for Marian; comparing with
``generate`` needs the same ban made explicit there.

Shapes (as in :mod:`attnstudy.analysis.contract`): B batch, P replacements, L decoder layers, H
heads, T_y steps, T_x source positions (subword tokens, the source's end-of-sequence token
included), V the vocabulary, d the model size, d_h the head size.
"""

from __future__ import annotations

import bisect
import contextvars
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnstudy.data.hf_folder import (
    TOKENIZER_FILES,
    HFError,
    check_model_files,
    folder_digests,
)
from attnstudy.data.types import Example
from attnstudy.data.vocab import EOS, PAD, SPECIALS, UNK, Vocab

from .decoding import BOS_ID, EOS_ID, PAD_ID, Decoding
from .trace import ALL, Trace

__all__ = [
    "ATTENTION_NAME",
    "BANNED_LOGIT",
    "FAMILIES",
    "HFError",
    "HFSeq2Seq",
    "HFTrace",
    "HFVocabulary",
    "TOKENIZER_FILES",
    "folder_digests",
    "load_pretrained",
    "subword_examples",
    "word_index",
]

ATTENTION_NAME = "attnstudy"
"""The ``attn_implementation`` name under which the intervening attention function is registered."""

BANNED_LOGIT = -1.0e9
"""Logit of a banned output column (padding, decoder start): its probability is exactly 0 in
float32, and unlike −inf it keeps p·log p finite in every divergence."""


@dataclass(frozen=True)
class Family:
    """Where a family keeps its attention modules (module paths relative to the loaded model).

    Attributes:
        decoder_layers / encoder_layers: the layer lists.
        cross / decoder_self / encoder_self: the attention module inside one layer.
        output: the output projection W^O inside an attention module.
    """

    encoder_layers: str
    decoder_layers: str
    encoder_self: str
    decoder_self: str
    cross: str
    output: str


FAMILIES: dict[str, Family] = {
    "marian": Family(
        "model.encoder.layers",
        "model.decoder.layers",
        "self_attn",
        "self_attn",
        "encoder_attn",
        "out_proj",
    ),
    "bart": Family(
        "model.encoder.layers",
        "model.decoder.layers",
        "self_attn",
        "self_attn",
        "encoder_attn",
        "out_proj",
    ),
    "t5": Family(
        "encoder.block",
        "decoder.block",
        "layer.0.SelfAttention",
        "layer.0.SelfAttention",
        "layer.1.EncDecAttention",
        "o",
    ),
}
"""The supported ``model_type`` values (``config.json``) and their attention modules."""


# --- the registered attention function ---------------------------------------------------------
@dataclass
class _Hooks:
    """What the attention function does while a call of :class:`HFSeq2Seq` is running.

    Attributes:
        cross: ``id(module) -> decoder layer`` for the cross-attention modules.
        replace: ``fn(layer, weights (N, H, T_q, T_x)) -> weights | None``; None keeps the model's.
        detach: stop gradients through the cross-attention weights.
    """

    cross: dict[int, int]
    replace: Callable[[int, Tensor], Tensor | None] | None = None
    detach: bool = False


_ACTIVE: contextvars.ContextVar[_Hooks | None] = contextvars.ContextVar(
    "attnstudy_hf", default=None
)


def attention_forward(module: nn.Module, query, key, value, attention_mask, **kwargs):
    """The ``"attnstudy"`` attention implementation: the family's own ``eager_attention_forward``
    (same arithmetic, so logits equal the ``eager`` implementation's), with the cross-attention
    weights of chosen layers replaced while an intervention is active.

    Args:
        query: (N, H, T_q, d_h); key, value: (N, H, T_k, d_h); attention_mask: additive float mask.

    Returns:
        (output (N, T_q, H, d_h), weights (N, H, T_q, T_k)) — the weights actually used.
    """
    eager = sys.modules[type(module).__module__].eager_attention_forward
    out, weights = eager(module, query, key, value, attention_mask, **kwargs)
    hooks = _ACTIVE.get()
    layer = None if hooks is None else hooks.cross.get(id(module))
    if layer is None:
        return out, weights
    used = weights
    if hooks.replace is not None:
        new = hooks.replace(layer, weights)
        if new is not None:
            used = new.to(weights.dtype)
    if hooks.detach:
        used = used.detach()
    if used is not weights:
        out = torch.matmul(used, value).transpose(1, 2).contiguous()
    return out, used


def _register() -> None:
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(ATTENTION_NAME, attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, eager_mask)


# --- ids ---------------------------------------------------------------------------------------
class HFVocabulary:
    """attnstudy's id space over a pretrained model's vocabulary (see the module docstring).

    Args:
        tokenizer: the model's tokenizer; config: its ``PretrainedConfig``.

    Attributes:
        vocab: the :class:`~attnstudy.data.vocab.Vocab` (specials first; other tokens by their
            model id, a name made unique with ``⟨id⟩`` where two ids share a string).
        to_model: long (V,), attnstudy id → model id (for inputs).
        columns: long (V,), the model's output column of every attnstudy id.
        banned: bool (V,), output columns never predicted.

    Raises:
        HFError: a model without padding or end-of-sequence id, or whose vocabulary is smaller
            than its tokenizer's.
    """

    def __init__(self, tokenizer: Any, config: Any) -> None:
        size = int(config.vocab_size)
        pad, eos = config.pad_token_id, config.eos_token_id
        start = config.decoder_start_token_id
        if pad is None or eos is None:
            raise HFError(
                "the model's config has no pad_token_id or eos_token_id; set both and save again"
            )
        start = pad if start is None else start
        unk = tokenizer.unk_token_id
        if len(tokenizer) > size:
            raise HFError(
                f"the tokenizer has {len(tokenizer)} tokens but the model only {size} output "
                "columns; resize the model's embeddings (resize_token_embeddings) and save again"
            )
        special = {pad: PAD, eos: EOS}
        if unk is not None and unk not in special:
            special[unk] = UNK
        others = [i for i in range(size) if i not in special and i != start]
        names = tokenizer.convert_ids_to_tokens(others)
        seen: dict[str, int] = {s: 1 for s in SPECIALS}
        itos = list(SPECIALS)
        for i, name in zip(others, names):
            name = name if isinstance(name, str) else f"⟨{i}⟩"
            if name in seen:
                name = f"{name}⟨{i}⟩"
            seen[name] = 1
            itos.append(name)
        self.vocab = Vocab(itos)
        to_model = [pad, start, eos, unk if unk is not None else pad, *others]
        # host-side id tables, moved to the model's device where they are used
        self.to_model = torch.tensor(to_model, dtype=torch.long, device="cpu")
        self.columns = self.to_model.clone()
        banned = torch.zeros(len(itos), dtype=torch.bool, device="cpu")
        banned[PAD_ID] = banned[BOS_ID] = True
        banned[3] = unk is None
        self.banned = banned
        # model id -> attnstudy id; the decoder start reads as <bos> unless it is <pad>/<eos>
        from_model = [PAD_ID] * size
        for k, i in enumerate(to_model):
            if k >= 4 or k in (BOS_ID, 3):
                from_model[i] = k
        from_model[eos], from_model[pad] = EOS_ID, PAD_ID
        self.from_model = torch.tensor(from_model, dtype=torch.long, device="cpu")
        self.model_ids = {"pad": pad, "eos": eos, "decoder_start": start, "unk": unk}

    def logits(self, model_logits: Tensor) -> Tensor:
        """Model logits (..., V_model) → attnstudy logits (..., V), banned columns at
        :data:`BANNED_LOGIT`."""
        cols = self.columns.to(model_logits.device)
        out = model_logits.index_select(-1, cols)
        return out.masked_fill(self.banned.to(model_logits.device), BANNED_LOGIT)

    def tokens(self, model_ids: Sequence[int]) -> tuple[str, ...]:
        """Model ids → attnstudy token names."""
        return tuple(self.vocab.itos[int(self.from_model[i])] for i in model_ids)


# --- trace -------------------------------------------------------------------------------------
@dataclass(kw_only=True)
class HFTrace(Trace):
    """A teacher-forced pass of a pretrained model: :class:`~attnstudy.models.trace.Trace` plus
    the caches its exact local intervention replays.

    Attributes:
        self_keys, self_values: (B, L, H, T_full, d_h) decoder self-attention keys and values of
            every position of the whole prefix (not windowed by :meth:`select`).
        cross_keys, cross_values: (B, L, H, T_x, d_h) cross-attention keys and values.
        encoder_hidden: (B, T_x, d) the encoder output.
        offset: absolute position of this trace's step 0.
        encoder_attention: (B, L_enc, H, T_x, T_x) encoder self-attention.
    """

    self_keys: Tensor
    self_values: Tensor
    cross_keys: Tensor
    cross_values: Tensor
    encoder_hidden: Tensor
    offset: int = 0
    encoder_attention: Tensor

    def select(self, rows: Tensor, start: int = 0, stop: int | None = None) -> HFTrace:
        """The trace of a subset of batch rows (long (B',)) and a window of steps ``[start, stop)``,
        still exact for local interventions of those steps."""
        t = self._window(start, stop)

        def pick(x):
            return x.index_select(0, rows)

        return HFTrace(
            **self._pick(rows, t),
            self_keys=pick(self.self_keys),
            self_values=pick(self.self_values),
            cross_keys=pick(self.cross_keys),
            cross_values=pick(self.cross_values),
            encoder_hidden=pick(self.encoder_hidden),
            offset=self.offset + t.start,
            encoder_attention=pick(self.encoder_attention),
        )


@dataclass
class _HFState:
    """Incremental decoding state: the encoder output, its mask and the key/value caches
    (N, L, H, t, d_h) self and (N, L, H, T_x, d_h) cross (empty before the first step)."""

    encoder_hidden: Tensor
    mask: Tensor
    self_kv: tuple[Tensor, Tensor] | None
    cross_kv: tuple[Tensor, Tensor] | None

    def index_select(self, index: Tensor) -> _HFState:
        def pick(kv):
            return (
                None if kv is None else (kv[0].index_select(0, index), kv[1].index_select(0, index))
            )

        return _HFState(
            self.encoder_hidden.index_select(0, index),
            self.mask.index_select(0, index),
            pick(self.self_kv),
            pick(self.cross_kv),
        )


def _cache(self_kv, cross_kv):
    """An ``EncoderDecoderCache`` from stacked (N, L, H, t, d_h) tensors (None: empty)."""
    from transformers import DynamicCache, EncoderDecoderCache

    def dyn(kv):
        if kv is None:
            return DynamicCache()
        k, v = kv
        return DynamicCache([(k[:, m], v[:, m]) for m in range(k.size(1))])

    return EncoderDecoderCache(dyn(self_kv), dyn(cross_kv))


def _stack(cache) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """(self keys, values), (cross keys, values) of an ``EncoderDecoderCache``, (N, L, H, t, d_h)."""

    def stack(c):
        return (
            torch.stack([layer.keys for layer in c.layers], 1),
            torch.stack([layer.values for layer in c.layers], 1),
        )

    return stack(cache.self_attention_cache), stack(cache.cross_attention_cache)


# --- the model ---------------------------------------------------------------------------------
class HFSeq2Seq(Decoding, nn.Module):
    """A pretrained encoder-decoder under the analysis contract (see the module docstring).

    Args:
        model: a transformers ``*ForConditionalGeneration`` of a family in :data:`FAMILIES`,
            loaded with ``attn_implementation="attnstudy"``.
        tokenizer: its tokenizer.

    Raises:
        HFError: an unsupported family or attention implementation.
    """

    def __init__(self, model: nn.Module, tokenizer: Any) -> None:
        super().__init__()
        config = model.config
        family = FAMILIES.get(config.model_type)
        if family is None:
            raise HFError(
                f"model_type {config.model_type!r} is not supported; attnstudy analyses "
                f"{', '.join(sorted(FAMILIES))} encoder-decoders"
            )
        if config._attn_implementation != ATTENTION_NAME:
            raise HFError(
                f"load the model with attn_implementation={ATTENTION_NAME!r} "
                "(attnstudy.models.hf.load_pretrained does)"
            )
        self.hf = model
        self.tokenizer = tokenizer
        self.family = family
        self.ids = HFVocabulary(tokenizer, config)
        self.vocab = self.ids.vocab
        dec = model.get_submodule(family.decoder_layers)
        enc = model.get_submodule(family.encoder_layers)
        self._cross = {id(layer.get_submodule(family.cross)): m for m, layer in enumerate(dec)}
        self.layers = len(dec)
        self.encoder_layers = len(enc)
        self.heads = int(getattr(config, "decoder_attention_heads", None) or config.num_heads)

    has_attention = True

    @property
    def n_layers(self) -> int:
        """L, decoder layers with cross-attention."""
        return self.layers

    def _hooks(self, replace=None, detach: bool = False) -> _Hooks:
        return _Hooks(self._cross, replace, detach)

    def _model_ids(self, ids: Tensor) -> Tensor:
        return self.ids.to_model.to(ids.device)[ids]

    def _encoder(self):
        return self.hf.get_encoder()

    # --- 1. trace ------------------------------------------------------------------------------
    def embed(self, src: Tensor) -> Tensor:
        """Source embeddings as the encoder computes them from ids (B, T_x, d), scale included."""
        enc = self._encoder()
        return enc.embed_tokens(self._model_ids(src)) * getattr(enc, "embed_scale", 1.0)

    def embed_target(self, tgt_in: Tensor) -> Tensor:
        """Target-prefix embeddings (B, T_y, d) as the decoder computes them from ids, scale
        included (as :meth:`embed`): what source-vs-prefix attribution differentiates against."""
        dec = self.hf.get_decoder()
        return dec.embed_tokens(self._model_ids(tgt_in)) * getattr(dec, "embed_scale", 1.0)

    def _encode(self, src, src_lengths, embedded):
        mask = (torch.arange(src.size(1), device=src.device)[None, :] < src_lengths[:, None]).long()
        enc = self._encoder()(
            inputs_embeds=embedded, attention_mask=mask, output_attentions=True, return_dict=True
        )
        return enc, mask

    def trace(
        self,
        src: Tensor,
        src_lengths: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor | None = None,
        embedded: Tensor | None = None,
        detach_attention: bool = False,
        embedded_target: Tensor | None = None,
    ) -> HFTrace:
        """Teacher-forced pass over a given target prefix, keeping the key/value caches.

        Args:
            src: long (B, T_x) attnstudy ids (the source's end-of-sequence token included);
                src_lengths: long (B,).
            tgt_in: long (B, T_y), BOS followed by the prefix, PAD-padded.
            tgt_out: long (B, T_y), the prefix followed by EOS (for ``step_mask``).
            embedded: optional source embeddings (B, T_x, d) to differentiate against.
            detach_attention: stop gradients through every layer's cross-attention weights.
            embedded_target: optional target-prefix embeddings (B, T_y, d) of ``tgt_in``
                (:meth:`embed_target`) to differentiate against.

        Returns:
            :class:`HFTrace`, analysing the last layer.
        """
        embedded = self.embed(src) if embedded is None else embedded
        token = _ACTIVE.set(self._hooks(detach=detach_attention))
        try:
            enc, mask = self._encode(src, src_lengths, embedded)
            out = self.hf(
                encoder_outputs=enc,
                attention_mask=mask,
                **(
                    {"decoder_input_ids": self._model_ids(tgt_in)}
                    if embedded_target is None
                    else {"decoder_inputs_embeds": embedded_target}
                ),
                use_cache=True,
                output_attentions=True,
                return_dict=True,
            )
        finally:
            _ACTIVE.reset(token)
        (sk, sv), (ck, cv) = _stack(out.cache)
        step_mask = (tgt_out if tgt_out is not None else tgt_in) != PAD_ID
        if tgt_out is None:
            tgt_out = torch.cat([tgt_in[:, 1:], tgt_in.new_full((tgt_in.size(0), 1), PAD_ID)], 1)
        cross = torch.stack(out.cross_attentions, 1)
        return HFTrace(
            src=src,
            src_lengths=src_lengths,
            pad_mask=mask == 0,
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            step_mask=step_mask,
            logits=self.ids.logits(out.logits),
            cross=cross.masked_fill(mask[:, None, None, None, :] == 0, 0.0),
            embedded=embedded,
            layer=self.layers - 1,
            self_keys=sk,
            self_values=sv,
            cross_keys=ck,
            cross_values=cv,
            encoder_hidden=enc.last_hidden_state,
            encoder_attention=torch.stack(enc.attentions, 1),
        )

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T_y, V) in attnstudy's id space."""
        return self.trace(src, src_lengths, tgt_in).logits

    # --- 2. local intervention -----------------------------------------------------------------
    def _step(self, ids, hidden, mask, self_kv, cross_kv, replace=None):
        """One decoder position for N rows from their caches: logits (N, V_model), new caches and
        the cross-attention rows used per layer {m: (N, H, T_x)}."""
        used: dict[int, Tensor] = {}

        def fn(m, w):
            new = None if replace is None else replace(m, w[:, :, -1])
            used[m] = w[:, :, -1] if new is None else new
            if new is None:
                return None
            return new[:, :, None, :]

        token = _ACTIVE.set(self._hooks(fn))
        try:
            out = self.hf(
                encoder_outputs=(hidden,),
                attention_mask=mask,
                decoder_input_ids=ids[:, None],
                cache=_cache(self_kv, cross_kv),
                use_cache=True,
                return_dict=True,
            )
        finally:
            _ACTIVE.reset(token)
        new_self, new_cross = _stack(out.cache)
        return out.logits[:, -1], new_self, new_cross, used

    def logits_given_attention(
        self,
        trace: HFTrace,
        weights: Tensor,
        chunk_rows: int = 4096,
        steps: Tensor | None = None,
    ) -> Tensor:
        """Logits each step gives with its cross-attention rows at the analysed layer replaced,
        the prefix fixed (exact local intervention).

        Position t is recomputed by one decoder call from the traced key/value caches of
        positions < t (causal masking leaves them as traced) with the replacement rows at the
        analysed layer(s); layers below it recompute the traced values. The rows of one step —
        every (example, replacement) — share one call, ``chunk_rows`` at a time.

        Args:
            trace: from :meth:`trace` (or a :meth:`HFTrace.select` of it).
            weights: replacements of :attr:`Trace.attention`'s rows, (B, H', T_y, T_x) or
                (B, P, H', T_y, T_x).
            chunk_rows: rows per decoder call.
            steps: optional bool (B, T_y), the steps to compute (default every real step).

        Returns:
            logits (B, T_y, V) or (B, P, T_y, V); 0 at steps not computed.

        Raises:
            ValueError: a shape that does not match the trace.
        """
        single = weights.dim() == 4
        if single:
            weights = weights.unsqueeze(1)
        expected = tuple(trace.attention.shape)
        if weights.dim() != 5 or weights.shape[:1] + weights.shape[2:] != expected:
            raise ValueError(
                f"weights must be (B, P, H', T_y, T_x) with (B, H', T_y, T_x) = {expected}, "
                f"got {tuple(weights.shape)}"
            )
        weights = trace.expand_heads(weights)  # (B, P, H_u, T_y, T_x)
        b, p, _, t_y, _ = weights.shape
        h = self.heads
        layers = list(range(self.layers)) if trace.layer == ALL else [trace.layer]
        mask = trace.step_mask if steps is None else steps & trace.step_mask
        src_mask = (~trace.pad_mask).long()
        out = weights.new_zeros(b, p, t_y, len(self.vocab))
        for t in range(t_y):
            rows = mask[:, t].nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            t_abs = trace.offset + t
            bi = rows.repeat_interleave(p)
            pi = torch.arange(p, device=rows.device).repeat(rows.numel())
            for start in range(0, bi.numel(), chunk_rows):
                cb, cp = bi[start : start + chunk_rows], pi[start : start + chunk_rows]
                repl = {
                    m: weights[cb, cp, i * h : (i + 1) * h, t] for i, m in enumerate(layers)
                }  # (N, H, T_x)
                logits, *_ = self._step(
                    self._model_ids(trace.tgt_in[cb, t]),
                    trace.encoder_hidden[cb],
                    src_mask[cb],
                    None
                    if t_abs == 0
                    else (trace.self_keys[cb, :, :, :t_abs], trace.self_values[cb, :, :, :t_abs]),
                    (trace.cross_keys[cb], trace.cross_values[cb]),
                    lambda m, w, repl=repl: repl.get(m),
                )
                out[cb, cp, t] = self.ids.logits(logits)
        return out[:, 0] if single else out

    # --- 3. decoding (Decoding.decode / greedy / beam_search) ----------------------------------
    def begin(self, src: Tensor, src_lengths: Tensor) -> _HFState:
        """Encode for incremental decoding (see :mod:`attnstudy.models.decoding`)."""
        token = _ACTIVE.set(self._hooks())
        try:
            enc, mask = self._encode(src, src_lengths, self.embed(src))
        finally:
            _ACTIVE.reset(token)
        return _HFState(enc.last_hidden_state, mask, None, None)

    def advance(
        self, y: Tensor, state: _HFState, t: int, intervene=None, layer: int | str = ALL
    ) -> tuple[Tensor, Tensor | None, _HFState]:
        """One decoder step at position ``t`` from the previous token ``y`` (long (N,)).

        Args:
            intervene: optional ``fn(rows (N, H, T_x)) -> rows`` replacing the cross-attention
                rows of ``layer`` (of every layer, in order, when :data:`ALL`).
            layer: the intervened layer (index, negative from the top, or :data:`ALL`).

        Returns:
            logits (N, V), the rows of the intervened layer(s) (N, H or L·H, T_x), the next state.

        Raises:
            ValueError: for a layer out of range.
        """
        chosen = self._layers_of(layer)

        def replace(m, w):
            return intervene(w) if intervene is not None and m in chosen else None

        logits, self_kv, cross_kv, used = self._step(
            self._model_ids(y),
            state.encoder_hidden,
            state.mask,
            state.self_kv,
            state.cross_kv,
            replace,
        )
        rows = torch.cat([used[m] for m in sorted(chosen)], 1)
        nxt = _HFState(state.encoder_hidden, state.mask, self_kv, cross_kv)
        return self.ids.logits(logits), rows, nxt

    def encoder_attention(self, trace: HFTrace) -> Tensor:
        """The encoder's self-attention of every layer, (B, L_enc, H, T_x, T_x) (attention rollout)."""
        return trace.encoder_attention

    # --- 4. value vectors (norm-based analysis) ------------------------------------------------
    def value_vectors(self, trace: HFTrace) -> Tensor:
        """f_h(x_j) = W^O_h v_{h,j} per analysed head, (B, H', T_x, d), so the cross-attention
        output at step t is Σ_h Σ_j α_thj f_h(x_j) (+ the bias of W^O, if any) (Kobayashi et al.
        2020, eq. 4)."""
        layers = list(range(self.layers)) if trace.layer == ALL else [trace.layer]
        dec = self.hf.get_submodule(self.family.decoder_layers)
        out = []
        for m in layers:
            proj = dec[m].get_submodule(self.family.cross).get_submodule(self.family.output)
            w = proj.weight  # (d, H·d_h)
            blocks = w.view(w.size(0), self.heads, -1).permute(1, 2, 0)  # (H, d_h, d)
            out.append(torch.einsum("bhxk,hkd->bhxd", trace.cross_values[:, m], blocks))
        vectors = torch.cat(out, 1)
        return vectors if trace.head == ALL else vectors[:, trace.head : trace.head + 1]

    # --- 5. data -------------------------------------------------------------------------------
    def source_tokens(self, text: str) -> tuple[str, ...]:
        """The model's subword tokens of a source text, as attnstudy token names (its
        end-of-sequence token included, as the model is trained to see it)."""
        return self.ids.tokens(self.tokenizer(text).input_ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of decoded attnstudy ids (no ``<eos>``), as the model's tokenizer writes it
        (``tokenizer.decode`` with ``skip_special_tokens=True``)."""
        ids = torch.as_tensor(list(ids), dtype=torch.long, device=self.ids.to_model.device)
        model_ids = self._model_ids(ids).tolist()
        return self.tokenizer.decode(model_ids, skip_special_tokens=True)

    def target_tokens(self, text: str) -> tuple[str, ...]:
        """The model's subword tokens of a target text, without the end-of-sequence token."""
        ids = self.tokenizer(text_target=text).input_ids
        eos = self.ids.model_ids["eos"]
        if ids and ids[-1] == eos:
            ids = ids[:-1]
        return self.ids.tokens(ids)

    def word_maps(
        self, example: Example, source_join: str = " ", target_join: str = " "
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The word index of every subword token of an example's source (end-of-sequence
        included, −1) and target (as :meth:`target_tokens`), from the tokenizer's offsets.

        Raises:
            HFError: a tokenizer without character offsets (a slow one) that splits the words,
                or a subword spanning two words (:func:`word_index`).
        """
        src_text, tgt_text = source_join.join(example.src), target_join.join(example.tgt)
        try:
            src_enc = self.tokenizer(src_text, return_offsets_mapping=True)
            tgt_enc = self.tokenizer(text_target=tgt_text, return_offsets_mapping=True)
        except NotImplementedError:
            src, tgt = self.source_tokens(src_text), self.target_tokens(tgt_text)
            if len(src) == len(example.src) + 1 and len(tgt) == len(example.tgt):
                # one subword per word (then word and subword indices coincide)
                return tuple(range(len(example.src))) + (-1,), tuple(range(len(example.tgt)))
            raise HFError(
                f"example {example.id!r}: the tokenizer splits words into subwords and gives no "
                "character offsets (a slow tokenizer), so subword attention cannot be given to "
                "the gold links' words; save the model with a fast tokenizer (tokenizer.json) "
                "or leave 'alignment' out of ablation.ablations"
            ) from None
        src_words = word_index(src_enc["offset_mapping"], example.src, source_join)
        tgt_ids, tgt_off = tgt_enc["input_ids"], tgt_enc["offset_mapping"]
        if tgt_ids and tgt_ids[-1] == self.ids.model_ids["eos"]:
            tgt_off = tgt_off[:-1]
        tgt_words = word_index(tgt_off, example.tgt, target_join)
        return tuple(src_words), tuple(tgt_words)


def word_index(offsets: Sequence[tuple[int, int]], words: Sequence[str], join: str) -> list[int]:
    """The word each subword token belongs to, from the tokenizer's character offsets.

    Args:
        offsets: (start, end) character span of every token in ``join.join(words)``; (0, 0)
            (an empty span) for a special token.
        words: the data's tokens (the words of the gold links).
        join: what joined them into the text (``" "`` or ``""``).

    Returns:
        Word index per token, −1 for a special token.

    Raises:
        HFError: a token spanning two words (its attention cannot be given to one word).
    """
    starts, pos = [], 0
    for w in words:
        starts.append(pos)
        pos += len(w) + len(join)
    ends = [st + len(w) for st, w in zip(starts, words)]
    out = []
    for start, end in offsets:
        if end <= start:
            out.append(-1)
            continue
        i = bisect.bisect_right(starts, start) - 1
        if i < 0 or end > ends[i]:
            raise HFError(
                f"a subword token (characters {start}–{end}) spans two of the data's words, so "
                "its attention belongs to no single word; give data whose tokens the tokenizer "
                "keeps apart (e.g. spaces between words) or leave 'alignment' out"
            )
        out.append(i)
    return out


def subword_examples(
    model: HFSeq2Seq, examples: Sequence[Example], source_join: str = " ", target_join: str = " "
) -> list[Example]:
    """The data's examples as the pretrained model sees them: source and every reference
    re-tokenized by the model's tokenizer (the source's end-of-sequence token included), with the
    word index of every subword token where the example has gold links.

    Gold links stay word-level (``Example.alignment`` then links words, ``src_words`` /
    ``tgt_words`` map subwords to words): the alignment ablation aggregates subword attention to
    words (:func:`attnstudy.analysis.ablations.alignment.word_attention`).

    Args:
        examples: as the task loaders give them (tokens of the data's own tokenization).
        source_join, target_join: how the data's tokens make the text again — ``" "`` for
            ``spaces`` tokenization, ``""`` for ``chars``.

    Returns:
        Examples with the same ids and subword tokens; those with links carry the word maps.

    Raises:
        HFError: gold links on data the tokenizer cannot map back to words (a slow tokenizer
            without character offsets that splits words, or a subword spanning two words).
    """
    out = []
    for ex in examples:
        src_text = source_join.join(ex.src)
        src = model.source_tokens(src_text)
        refs = tuple(model.target_tokens(target_join.join(r)) for r in ex.references)
        src_words: tuple[int, ...] = ()
        tgt_words: tuple[int, ...] = ()
        if ex.alignment is not None:
            src_words, tgt_words = model.word_maps(ex, source_join, target_join)
            if len(src_words) != len(src) or len(tgt_words) != len(refs[0]):
                raise HFError(f"example {ex.id!r}: the word maps do not match the subword tokens")
        out.append(
            Example(
                ex.id,
                src,
                refs[0],
                ex.alignment,
                refs if len(refs) > 1 else (),
                src_words,
                tgt_words,
            )
        )
    return out


# --- loading -----------------------------------------------------------------------------------
def load_pretrained(path: str | Path) -> HFSeq2Seq:
    """Load a ``save_pretrained`` folder offline and safely, wrapped for the battery.

    Nothing is downloaded (``local_files_only=True``), no code from the folder runs
    (``trust_remote_code=False``), and only safetensors weights are read.

    Raises:
        HFError: a missing folder, pickle-only weights, no tokenizer, a decoder-only or
            unsupported model, or transformers not installed — one line each.
    """
    folder = Path(path)
    # present, safe, a supported family, no custom code, a config that describes the weights;
    # the digests are the caller's (reuse, load_recorded)
    check_model_files(folder)
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the install
        raise HFError(
            "Hugging Face models need the optional extra: pip install 'attnstudy[hf]'"
        ) from e
    _register()
    transformers.utils.logging.disable_progress_bar()  # attnstudy reports its own progress
    transformers.utils.logging.set_verbosity_error()  # its load reports are not the CLI's output
    common = dict(local_files_only=True, trust_remote_code=False)
    config = _transformers_load(folder, "config", transformers.AutoConfig, **common)
    if not getattr(config, "is_encoder_decoder", False):
        raise HFError(
            f"{folder}: {config.model_type!r} is not an encoder-decoder; attnstudy analyses "
            "cross-attention, which decoder-only models do not have"
        )
    if config.model_type not in FAMILIES:
        raise HFError(
            f"{folder}: model_type {config.model_type!r} is not supported; attnstudy analyses "
            f"{', '.join(sorted(FAMILIES))} encoder-decoders"
        )
    model = _transformers_load(
        folder,
        "weights",
        transformers.AutoModelForSeq2SeqLM,
        use_safetensors=True,
        attn_implementation=ATTENTION_NAME,
        **common,
    )
    tokenizer = _transformers_load(folder, "tokenizer", transformers.AutoTokenizer, **common)
    model.eval()
    return HFSeq2Seq(model, tokenizer)


def _transformers_load(folder: Path, what: str, auto, **kwargs):
    """``auto.from_pretrained(folder, **kwargs)``, with whatever transformers raises turned into
    one :class:`HFError` line naming the folder and the part that failed."""
    try:
        return auto.from_pretrained(folder, **kwargs)
    except HFError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds, multi-line
        first = next(
            (line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__
        )
        raise HFError(
            f"{folder}: transformers cannot load its {what} ({first[:200]}); save the model "
            "and its tokenizer again with save_pretrained"
        ) from None
