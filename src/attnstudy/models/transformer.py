"""The Transformer encoder-decoder (Vaswani et al. 2017) in plain torch, under the analysis contract.

Shapes (glossary, as in :mod:`attnstudy.analysis.contract`):

    B   batch size      L   decoder layers (each with cross-attention)    H   heads
    T_x source length   T_y target steps      d   d_model      d_h = d / H     N   rows

Architecture (Vaswani et al. 2017, §3): token embeddings × √d plus sinusoidal (§3.5) or learned
positions; N encoder layers (self-attention, feed-forward) and N decoder layers (causal
self-attention, cross-attention, feed-forward), each sublayer with a residual connection and layer
normalisation either after it (``post``, the paper's "LayerNorm(x + Sublayer(x))") or before it
(``pre``, Xiong et al. 2020, with a final normalisation of both stacks); dropout on every sublayer
output and on the embeddings; the output projection optionally tied to the target embeddings
(Press & Wolf 2017). Attention is eq. (1)–(2): softmax(Q Kᵀ / √d_h) V per head, heads
concatenated, times W^O. Cross-attention baselines: ``uniform`` (every head's row fixed to 1/T_x
over the valid positions; values and W^O still learnt) and ``none`` (no cross-attention: the
decoder sees the source only through the masked mean of the encoder output, projected and added
to every input position — the fixed-size bottleneck of the recurrent ``none`` model).

The analysis contract:

* :meth:`Transformer.trace` — teacher-forced pass keeping, per decoder layer, the
  cross-attention sublayer's input of every position and the self-attention keys and values;
* :meth:`Transformer.logits_given_attention` — *exact local intervention*: position t's
  cross-attention rows at the analysed layer l (one head, all heads, or all layers at once)
  replaced and position t recomputed from layer l up, the prefix fixed. Causal masking makes
  positions < t unchanged, so their traced keys and values serve position t's self-attention in
  the layers above l; every (step, replacement) row is independent and computed in one batch;
* :meth:`Transformer.decode` (from :class:`~attnstudy.models.decoding.Decoding`) — global
  intervention, incremental decoding with a key/value cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .decoding import PAD_ID, Decoding
from .trace import ALL, ROW_VALUES_BUDGET, Trace, folded_rows

__all__ = ["Transformer", "TransformerMemory", "TransformerTrace", "sinusoidal_positions"]


def sinusoidal_positions(n: int, d: int, device: torch.device | str = "cpu") -> Tensor:
    """Vaswani et al. (2017), §3.5: PE(pos, 2i) = sin(pos / 10000^{2i/d}), PE(pos, 2i+1) = cos(…).

    Args:
        n: positions; d: model size; device: where the table is created (a model's buffer is
            built on the CPU and moves with ``Module.to``).

    Returns:
        (n, d) float32.
    """
    pos = torch.arange(n, dtype=torch.float32, device=device)[:, None]
    div = torch.exp(
        torch.arange(0, d, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / d)
    )
    pe = torch.zeros(n, d, device=device)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)[:, : d // 2]
    return pe


def attend(q: Tensor, k: Tensor, blocked: Tensor | None) -> Tensor:
    """Scaled dot-product attention weights, Vaswani et al. (2017) eq. (1).

    Args:
        q: (…, H, T_q, d_h); k: (…, H, T_k, d_h).
        blocked: bool broadcastable to (…, H, T_q, T_k), True where a key may not be attended
            (padding, future positions); every row needs one allowed key.

    Returns:
        (…, H, T_q, T_k), rows summing to 1, exactly 0 where blocked.
    """
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    if blocked is not None:
        scores = scores.masked_fill(blocked, float("-inf"))
    return torch.softmax(scores, -1)


class MultiHeadAttention(nn.Module):
    """Projections of one multi-head attention (Vaswani et al. 2017, eq. 2): W^Q, W^K, W^V
    (d → H·d_h) and W^O (H·d_h → d), with biases.

    Args:
        d_model: d; heads: H (d_h = d / H).
    """

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads, self.d_h = heads, d_model // heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split(self, x: Tensor) -> Tensor:
        """(…, T, d) → (…, H, T, d_h)."""
        return x.view(*x.shape[:-1], self.heads, self.d_h).transpose(-2, -3)

    def merge(self, x: Tensor) -> Tensor:
        """(…, H, T, d_h) → (…, T, d)."""
        x = x.transpose(-2, -3)
        return x.reshape(*x.shape[:-2], self.heads * self.d_h)

    def queries(self, x: Tensor) -> Tensor:
        """(…, T, d) → (…, H, T, d_h)."""
        return self.split(self.q_proj(x))

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(…, T, d) → keys and values, each (…, H, T, d_h)."""
        return self.split(self.k_proj(x)), self.split(self.v_proj(x))

    def output(self, weights: Tensor, values: Tensor) -> Tensor:
        """W^O [head_1; …; head_H] with head_h = weights_h · values_h.

        Args:
            weights: (…, H, T_q, T_k); values: (…, H, T_k, d_h).

        Returns:
            (…, T_q, d).
        """
        return self.out_proj(self.merge(torch.matmul(weights, values)))


class FeedForward(nn.Module):
    """Position-wise feed-forward network, Vaswani et al. (2017) eq. (2): W₂ ReLU(W₁ x + b₁) + b₂."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class _Sublayers(nn.Module):
    """Residual + layer-norm plumbing shared by the encoder and decoder layers: ``pre`` (LN before
    the sublayer, x + F(LN(x))) or ``post`` (LN(x + F(x)))."""

    def __init__(self, d_model: int, n: int, dropout: float, pre: bool):
        super().__init__()
        self.pre = pre
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(n))
        self.dropout = nn.Dropout(dropout)

    def inp(self, i: int, x: Tensor) -> Tensor:
        """What sublayer ``i`` reads from the residual stream ``x``."""
        return self.norms[i](x) if self.pre else x

    def add(self, i: int, x: Tensor, out: Tensor) -> Tensor:
        """The residual stream after sublayer ``i`` wrote ``out``."""
        return x + self.dropout(out) if self.pre else self.norms[i](x + self.dropout(out))


class EncoderLayer(nn.Module):
    """Self-attention and feed-forward over the source (Vaswani et al. 2017, §3.1)."""

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float, pre: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.sub = _Sublayers(d_model, 2, dropout, pre)

    def forward(self, x: Tensor, pad_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``x``: (B, T_x, d); ``pad_mask``: bool (B, T_x). Returns x and weights (B, H, T_x, T_x)."""
        a = self.sub.inp(0, x)
        k, v = self.self_attn.keys_values(a)
        w = attend(self.self_attn.queries(a), k, pad_mask[:, None, None, :])
        x = self.sub.add(0, x, self.self_attn.output(w, v))
        return self.sub.add(1, x, self.ff(self.sub.inp(1, x))), w


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention (absent for ``none``) and feed-forward
    (Vaswani et al. 2017, §3.1). Sublayer 0: self-attention, 1: cross-attention, 2: feed-forward."""

    def __init__(self, d_model: int, heads: int, d_ff: int, dropout: float, pre: bool, cross: bool):
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, heads)
        self.cross_attn = MultiHeadAttention(d_model, heads) if cross else None
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.sub = _Sublayers(d_model, 3, dropout, pre)

    def feed_forward(self, x: Tensor) -> Tensor:
        """The stream after the feed-forward sublayer. ``x``: (…, d)."""
        return self.sub.add(2, x, self.ff(self.sub.inp(2, x)))

    def feed_forward_rows(self, x: Tensor) -> Tensor:
        """:meth:`feed_forward` of rows ``x`` (N, d) in eval mode without autograd, in fewer passes:
        the ReLU in place and the residual added inside the second product (``addmm``).

        Same function as :meth:`feed_forward` (rounding differs in the last bits: the sum is
        (x + W₂h) + b₂ instead of x + (W₂h + b₂)); it falls back to it when gradients are
        recorded or dropout is active.
        """
        if torch.is_grad_enabled() or (self.training and self.sub.dropout.p > 0):
            return self.feed_forward(x)
        first, second = self.ff.net[0], self.ff.net[3]
        h = torch.addmm(first.bias, self.sub.inp(2, x), first.weight.t()).relu_()
        out = torch.addmm(x, h, second.weight.t()).add_(second.bias)
        return out if self.sub.pre else self.sub.norms[2](out)

    def cross_given_weights(self, x: Tensor, weights: Tensor, values: Tensor) -> Tensor:
        """The stream after the cross-attention sublayer with given weights.

        Args:
            x: (…, T_q, d) the stream entering the sublayer; weights: (…, H, T_q, T_x);
            values: (…, H, T_x, d_h) this layer's cross-attention values.
        """
        return self.sub.add(1, x, self.cross_attn.output(weights, values))


@dataclass
class TransformerMemory:
    """Encoder-side tensors of every decoder layer, computed once per batch.

    Attributes:
        keys, values: (B, L, H, T_x, d_h) cross-attention keys and values (None for ``none``).
        pad_mask: bool (B, T_x), True at padding.
        summary: (B, d) the projected masked mean of the encoder output (``none`` only).
    """

    keys: Tensor | None
    values: Tensor | None
    pad_mask: Tensor
    summary: Tensor | None = None

    def index_select(self, index: Tensor) -> TransformerMemory:
        """Rows of the batch. ``index``: long (N,)."""

        def pick(x):
            return None if x is None else x.index_select(0, index)

        return TransformerMemory(
            pick(self.keys), pick(self.values), pick(self.pad_mask), pick(self.summary)
        )


@dataclass(kw_only=True)
class TransformerTrace(Trace):
    """A teacher-forced pass of the Transformer: :class:`~attnstudy.models.trace.Trace` plus what
    the exact local intervention needs.

    Attributes:
        mids: (B, T_y, L, d) the stream entering each layer's cross-attention sublayer.
        self_keys, self_values: (B, L, H, T_full, d_h) decoder self-attention keys and values of
            every position of the whole prefix (not windowed by :meth:`select`).
        offset: absolute position of this trace's step 0 (a window's start).
        memory: :class:`TransformerMemory`.
        self_attention: (B, L, H, T_y, T_full) decoder self-attention rows.
        encoder_attention: (B, L_enc, H, T_x, T_x) encoder self-attention.
    """

    mids: Tensor
    self_keys: Tensor
    self_values: Tensor
    offset: int = 0
    memory: TransformerMemory
    self_attention: Tensor
    encoder_attention: Tensor

    def select(self, rows: Tensor, start: int = 0, stop: int | None = None) -> TransformerTrace:
        """The trace of a subset of batch rows (long (B',)) and a window of steps ``[start, stop)``;
        the keys and values of the whole prefix travel with it, so it stays exact for local
        interventions of its steps."""
        t = self._window(start, stop)

        def pick(x):
            return x.index_select(0, rows)

        return TransformerTrace(
            **self._pick(rows, t),
            mids=pick(self.mids)[:, t],
            self_keys=pick(self.self_keys),
            self_values=pick(self.self_values),
            offset=self.offset + t.start,
            memory=self.memory.index_select(rows),
            self_attention=pick(self.self_attention)[:, :, :, t],
            encoder_attention=pick(self.encoder_attention),
        )


@dataclass
class _TransformerState:
    """Incremental decoding state: the memory and, per layer, the self-attention keys and values
    of the positions decoded so far, (N, L, H, t, d_h)."""

    memory: TransformerMemory
    keys: Tensor
    values: Tensor

    def index_select(self, index: Tensor) -> _TransformerState:
        return _TransformerState(
            self.memory.index_select(index),
            self.keys.index_select(0, index),
            self.values.index_select(0, index),
        )


class Transformer(Decoding, nn.Module):
    """Transformer encoder-decoder (see the module docstring).

    Args:
        src_vocab_size, tgt_vocab_size: vocabulary sizes (specials included).
        d_model: d; heads: H; d_ff: feed-forward size; layers: encoder and decoder layers each.
        dropout: on embeddings and sublayer outputs.
        layer_norm: ``"pre"`` or ``"post"``.
        positions: ``"sinusoidal"`` or ``"learned"``; max_positions: longest sequence.
        tie_embeddings: share the target embedding and the output projection.
        attention: ``"multihead"``, ``"uniform"`` or ``"none"`` (cross-attention kind).

    Raises:
        ValueError: d_model not divisible by heads, or an unknown option.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 128,
        heads: int = 4,
        d_ff: int = 512,
        layers: int = 2,
        dropout: float = 0.1,
        layer_norm: str = "pre",
        positions: str = "sinusoidal",
        max_positions: int = 1024,
        tie_embeddings: bool = False,
        attention: str = "multihead",
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
        if layer_norm not in ("pre", "post") or positions not in ("sinusoidal", "learned"):
            raise ValueError(f"unknown layer_norm {layer_norm!r} or positions {positions!r}")
        if attention not in ("multihead", "uniform", "none"):
            raise ValueError(f"unknown Transformer attention {attention!r}")
        self.d_model, self.heads, self.layers = d_model, heads, layers
        self.kind, self.pre, self.max_positions = attention, layer_norm == "pre", max_positions
        self.src_embedding = nn.Embedding(src_vocab_size, d_model, padding_idx=PAD_ID)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model, padding_idx=PAD_ID)
        if positions == "learned":
            self.positions = nn.Embedding(max_positions, d_model)
        else:
            self.register_buffer(
                "sinusoid", sinusoidal_positions(max_positions, d_model), persistent=False
            )
            self.positions = None
        pre = self.pre
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(d_model, heads, d_ff, dropout, pre) for _ in range(layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(d_model, heads, d_ff, dropout, pre, cross=attention != "none")
            for _ in range(layers)
        )
        self.encoder_norm = nn.LayerNorm(d_model) if pre else None
        self.decoder_norm = nn.LayerNorm(d_model) if pre else None
        self.bridge = nn.Linear(d_model, d_model) if attention == "none" else None
        self.output = nn.Linear(d_model, tgt_vocab_size)
        self.dropout = nn.Dropout(dropout)
        self._init_weights()
        if tie_embeddings:
            self.output.weight = self.tgt_embedding.weight

    def _init_weights(self) -> None:
        """Xavier-uniform linear layers with zero biases, embeddings N(0, d^−½) with a zero padding
        row (as fairseq's Transformer): scaled by √d, a token embedding then has the size of its
        position encoding, so positions stay visible to the first layer."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for emb in (self.src_embedding, self.tgt_embedding):
            nn.init.normal_(emb.weight, 0.0, self.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD_ID].zero_()
        if self.positions is not None:
            nn.init.normal_(self.positions.weight, 0.0, self.d_model**-0.5)

    # --- contract attributes -------------------------------------------------------------------
    @property
    def has_attention(self) -> bool:
        return self.kind != "none"

    @property
    def n_layers(self) -> int:
        """L, decoder layers with cross-attention."""
        return self.layers

    # --- encoder ----------------------------------------------------------------------------------
    def _position(self, start: int, n: int) -> Tensor:
        """(n, d) position encodings of positions start … start + n − 1.

        Raises:
            ValueError: past ``max_positions``.
        """
        if start + n > self.max_positions:
            raise ValueError(
                f"a sequence of {start + n} tokens is longer than the model's max_positions = "
                f"{self.max_positions}; shorten the input or train with a larger "
                "model.max_positions"
            )
        if self.positions is not None:
            return self.positions.weight[start : start + n]
        return self.sinusoid[start : start + n]

    def embed(self, src: Tensor) -> Tensor:
        """Source token embeddings (B, T_x, d) of ``src`` long (B, T_x), before scaling and
        positions: what gradient importance differentiates against."""
        return self.src_embedding(src)

    def encode(
        self, src: Tensor, src_lengths: Tensor, embedded: Tensor | None = None
    ) -> tuple[TransformerMemory, Tensor]:
        """Encode and precompute every layer's cross-attention keys and values.

        Args:
            src: long (B, T_x); src_lengths: long (B,), every length ≥ 1.
            embedded: optional source embeddings (B, T_x, d) from :meth:`embed`.

        Returns:
            (memory, encoder self-attention (B, L, H, T_x, T_x)).

        Raises:
            ValueError: for bad shapes, an empty source or one past ``max_positions``.
        """
        if src.dim() != 2 or src_lengths.dim() != 1 or src.size(0) != src_lengths.size(0):
            raise ValueError(
                f"src must be (B, T_x) with src_lengths (B,), got {tuple(src.shape)} "
                f"and {tuple(src_lengths.shape)}"
            )
        if int(src_lengths.min()) < 1:
            raise ValueError("every source needs at least one token (got an empty sequence)")
        emb = self.embed(src) if embedded is None else embedded
        pad_mask = torch.arange(src.size(1), device=src.device)[None, :] >= src_lengths[:, None]
        x = self.dropout(emb * math.sqrt(self.d_model) + self._position(0, src.size(1)))
        weights = []
        for layer in self.encoder_layers:
            x, w = layer(x, pad_mask)
            weights.append(w)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        if self.kind == "none":
            keep = (~pad_mask).unsqueeze(-1).to(x.dtype)
            mean = (x * keep).sum(1) / keep.sum(1)
            memory = TransformerMemory(None, None, pad_mask, self.bridge(mean))
        else:
            kv = [layer.cross_attn.keys_values(x) for layer in self.decoder_layers]
            memory = TransformerMemory(
                torch.stack([k for k, _ in kv], 1), torch.stack([v for _, v in kv], 1), pad_mask
            )
        return memory, torch.stack(weights, 1)

    def _cross_weights(self, layer: DecoderLayer, x: Tensor, keys: Tensor, pad_mask) -> Tensor:
        """Cross-attention weights of ``layer`` for the stream ``x`` (B, T_q, d) entering it, over
        its ``keys`` (B, H, T_x, d_h): (B, H, T_q, T_x); uniform over the valid positions for the
        ``uniform`` baseline."""
        q = layer.cross_attn.queries(layer.sub.inp(1, x))
        if self.kind == "uniform":
            q = torch.zeros_like(q)
        return attend(q, keys, pad_mask[:, None, None, :])

    def embed_target(self, tgt_in: Tensor) -> Tensor:
        """Target-prefix token embeddings (B, T_y, d) of ``tgt_in`` long (B, T_y), before scaling
        and positions (as :meth:`embed` for the source): what source-vs-prefix attribution
        differentiates against (pass them back through :meth:`trace`'s ``embedded_target``)."""
        return self.tgt_embedding(tgt_in)

    def _decoder_input(
        self,
        tokens: Tensor,
        start: int,
        memory: TransformerMemory,
        embedded: Tensor | None = None,
    ) -> Tensor:
        """(B, T, d) decoder input of ``tokens`` long (B, T) at positions start … (``embedded``:
        their embeddings from :meth:`embed_target`, in place of the lookup)."""
        emb = self.tgt_embedding(tokens) if embedded is None else embedded
        x = emb * math.sqrt(self.d_model)
        x = x + self._position(start, tokens.size(1))
        if memory.summary is not None:
            x = x + memory.summary[:, None, :]
        return self.dropout(x)

    def _logits(self, x: Tensor) -> Tensor:
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return self.output(x)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T_y, V) — the training forward."""
        return self.trace(src, src_lengths, tgt_in).logits

    # --- 1. trace ------------------------------------------------------------------------------
    def trace(
        self,
        src: Tensor,
        src_lengths: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor | None = None,
        embedded: Tensor | None = None,
        detach_attention: bool = False,
        embedded_target: Tensor | None = None,
    ) -> TransformerTrace:
        """Teacher-forced pass over a given target prefix (all positions at once, causal mask).

        Args:
            src: long (B, T_x); src_lengths: long (B,).
            tgt_in: long (B, T_y), BOS followed by the prefix, PAD-padded.
            tgt_out: long (B, T_y), the prefix followed by EOS (for ``step_mask``; else
                ``tgt_in != PAD``).
            embedded: optional source embeddings (B, T_x, d) to differentiate against.
            detach_attention: stop gradients through every layer's cross-attention weights.
            embedded_target: optional target-prefix embeddings (B, T_y, d) of ``tgt_in``
                (:meth:`embed_target`) to differentiate against.

        Returns:
            :class:`TransformerTrace`, analysing the last layer.
        """
        embedded = self.embed(src) if embedded is None else embedded
        memory, enc_attn = self.encode(src, src_lengths, embedded)
        t_y = tgt_in.size(1)
        x = self._decoder_input(tgt_in, 0, memory, embedded_target)
        future = torch.ones(t_y, t_y, dtype=torch.bool, device=src.device).triu(1)
        mids, keys, values, self_w, cross_w = [], [], [], [], []
        for m, layer in enumerate(self.decoder_layers):
            a = layer.sub.inp(0, x)
            k, v = layer.self_attn.keys_values(a)
            w = attend(layer.self_attn.queries(a), k, future)
            x = layer.sub.add(0, x, layer.self_attn.output(w, v))
            keys.append(k), values.append(v), self_w.append(w), mids.append(x)
            if layer.cross_attn is not None:
                c = self._cross_weights(layer, x, memory.keys[:, m], memory.pad_mask)
                cross_w.append(c)
                used = c.detach() if detach_attention else c
                x = layer.cross_given_weights(x, used, memory.values[:, m])
            x = layer.feed_forward(x)
        step_mask = (tgt_out if tgt_out is not None else tgt_in) != PAD_ID
        if tgt_out is None:
            tgt_out = torch.cat([tgt_in[:, 1:], tgt_in.new_full((tgt_in.size(0), 1), PAD_ID)], 1)
        return TransformerTrace(
            src=src,
            src_lengths=src_lengths,
            pad_mask=memory.pad_mask,
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            step_mask=step_mask,
            logits=self._logits(x),
            cross=torch.stack(cross_w, 1) if cross_w else None,
            embedded=embedded,
            layer=self.layers - 1,
            mids=torch.stack(mids, 2),
            self_keys=torch.stack(keys, 1),
            self_values=torch.stack(values, 1),
            memory=memory,
            self_attention=torch.stack(self_w, 1),
            encoder_attention=enc_attn,
        )

    # --- 2. local intervention -----------------------------------------------------------------
    def logits_given_attention(
        self,
        trace: TransformerTrace,
        weights: Tensor,
        chunk_rows: int = 4096,
        steps: Tensor | None = None,
        plain: bool = False,
    ) -> Tensor:
        """Logits each step gives with its cross-attention rows at the analysed layer replaced.

        Position t's stream is recomputed from the analysed layer l up (from layer 0 when all
        layers are analysed at once): l's cross-attention output from the replacement rows, then
        the feed-forward, then in every layer above l position t's self-attention over the traced
        keys and values of positions < t and its own new ones, and the model's own
        cross-attention. Rows (example, replacement, step) are independent; the contexts at the
        replaced layer(s) are one matmul per example, and only the computed rows go through the
        rest, ``chunk_rows`` at a time.

        Args:
            trace: from :meth:`trace` (or a :meth:`TransformerTrace.select` of it).
            weights: replacements of the analysed rows (:attr:`Trace.attention`),
                (B, H', T_y, T_x) or (B, P, H', T_y, T_x); with one head analysed the other heads
                keep their traced rows.
            chunk_rows: rows per chunk.
            steps: optional bool (B, T_y), the steps to compute (default every real step).
            plain: the contexts per head and W^O per row, also with one layer replaced (the
                reference the folded form is tested and timed against).

        Returns:
            logits (B, T_y, V) or (B, P, T_y, V); 0 at steps not computed.

        Raises:
            ValueError: for the ``none`` model or a shape that does not match the trace.
        """
        if not self.has_attention:
            raise ValueError("the 'none' model has no attention to replace")
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
        mask = trace.step_mask if steps is None else steps & trace.step_mask
        layers = list(range(self.layers)) if trace.layer == ALL else [trace.layer]
        if len(layers) == 1 and not plain and not (self.training and self.sub_dropout > 0):
            out = self._one_layer_given_attention(trace, weights, mask, layers[0], chunk_rows)
            return out[:, 0] if single else out
        b, p, _, t_y, t_x = weights.shape
        h = self.heads
        values = trace.memory.values  # (B, L, H, T_x, d_h)
        # context of every (example, replacement, step) at each replaced layer: (B, P, T_y, H·d_h)
        contexts = {}
        for i, m in enumerate(layers):
            w = weights[:, :, i * h : (i + 1) * h]  # (B, P, H, T_y, T_x)
            flat = w.permute(0, 2, 1, 3, 4).reshape(b, h, p * t_y, t_x)
            ctx = torch.matmul(flat, values[:, m])  # (B, H, P·T_y, d_h)
            contexts[m] = ctx.transpose(1, 2).reshape(b, p, t_y, h * ctx.size(-1))
        rows = mask.unsqueeze(1).expand(b, p, t_y).nonzero(as_tuple=True)  # (bi, pi, ti)
        out = weights.new_zeros(b, p, t_y, self.output.out_features)
        first = layers[0]
        n = rows[0].numel()
        for start in range(0, n, chunk_rows):
            bi, pi, ti = (r[start : start + chunk_rows] for r in rows)
            x = trace.mids[bi, ti, first]  # (N, d), entering layer `first`'s cross-attention
            for m in range(first, self.layers):
                layer = self.decoder_layers[m]
                if m != first:
                    x = self._row_self_attention(layer, m, x, trace, bi, ti + trace.offset)
                if m in contexts:
                    ctx = layer.cross_attn.out_proj(contexts[m][bi, pi, ti])
                    x = layer.sub.add(1, x, ctx)
                else:
                    x = self._row_cross_attention(layer, m, x, trace.memory, bi)
                x = layer.feed_forward(x)
            out.index_put_((bi, pi, ti), self._logits(x))
        return out[:, 0] if single else out

    @property
    def sub_dropout(self) -> float:
        """The residual dropout of the decoder layers (0 in eval: the folded path is exact)."""
        return float(self.decoder_layers[0].sub.dropout.p) if self.layers else 0.0

    def _one_layer_given_attention(
        self, trace: TransformerTrace, weights: Tensor, mask: Tensor, first: int, chunk_rows: int
    ) -> Tensor:
        """:meth:`logits_given_attention` with one layer's rows replaced, W^O folded into the values.

        The cross-attention output is W^O [head_1; …; head_H] + b^O = Σ_hj α_hj (W^O_h v_hj) + b^O
        (Vaswani et al. 2017, eq. 1–2), linear in the rows: W^O is applied once per source position
        and head instead of once per row. Per example, the rows of its real steps (all P
        replacements) are one product α_rows @ (W^O_h v_hj) plus each step's residual stream
        x_t + b^O entering the sublayer (:func:`attnstudy.models.trace.folded_rows`), then post-LN's norm where the model has it, the feed-forward, the
        layers above (as :meth:`logits_given_attention`) and the output. Only real steps are
        computed; nothing is gathered but the attention rows themselves. Eval mode (residual
        dropout off); tested against the naive re-run and the general path.

        Args:
            weights: (B, P, H, T_y, T_x), the layer's rows. mask: bool (B, T_y). first: the layer.
            chunk_rows: rows per chunk (a chunk holds whole examples, at least one).

        Returns:
            logits (B, P, T_y, V), 0 where not computed.
        """
        b, _, h, _, t_x = weights.shape
        layer = self.decoder_layers[first]
        att = layer.cross_attn
        d = att.out_proj.out_features
        w_o = att.out_proj.weight.view(d, h, att.d_h).permute(1, 2, 0)  # (H, d_h, d)
        projected = torch.einsum("bhxk,hkd->bhxd", trace.memory.values[:, first], w_o)
        projected = projected.reshape(b, h * t_x, d)  # row h·T_x + j: W^O_h v_hj
        base = trace.mids[:, :, first] + att.out_proj.bias  # (B, T_y, d)

        def finish(x: Tensor, bi: Tensor, ti: Tensor) -> Tensor:
            if not layer.sub.pre:
                x = layer.sub.norms[1](x)
            x = layer.feed_forward_rows(x)
            for m in range(first + 1, self.layers):
                upper = self.decoder_layers[m]
                x = self._row_self_attention(upper, m, x, trace, bi, ti + trace.offset)
                x = self._row_cross_attention(upper, m, x, trace.memory, bi)
                x = upper.feed_forward_rows(x)
            return self._logits(x)

        return folded_rows(
            weights, mask, projected, base, finish, self.output.out_features, chunk_rows
        )

    def rows_given_attention(
        self, trace: TransformerTrace, b_idx: Tensor, t_idx: Tensor
    ) -> Callable[[Tensor], Tensor] | None:
        """Local intervention at N chosen (example, step) rows, prepared once and applied many
        times (the adversarial search re-evaluates the same rows every Adam iteration).

        The same function as :meth:`logits_given_attention` on those rows (its folded form
        :meth:`_one_layer_given_attention`: W^O folded into the values, Vaswani et al. 2017,
        eq. 1–2), with what every call shares computed once — each row's projected values
        W^O_h v_hj (N, H·T_x, d) and its residual stream entering the sublayer plus b^O — and no
        scatter into a (B, K, H, T_y, T_x) replacement per call: a call is one batched product
        α_rows @ (W^O_h v_hj), then post-LN's norm where the model has it, the feed-forward, the
        layers above the analysed one (the row's self-attention over the traced prefix and the
        model's own cross-attention) and the output.

        Args:
            trace: from :meth:`trace`.
            b_idx, t_idx: long (N,), batch row and decoder step of each row (real steps).

        Returns:
            ``logits(weights (N, K, H, T_x)) -> (N, K, V)`` (differentiable in ``weights``), or
            None where this form does not apply — all layers at once, one head of several
            analysed, dropout active, or per-row copies of the projected values (N × H·T_x × d
            floats) past :data:`ROW_VALUES_BUDGET` — and the caller scatters into
            :meth:`logits_given_attention` instead
            (:func:`attnstudy.analysis._chunks.rows_given_attention`).

        Raises:
            ValueError: for the ``none`` model.
        """
        if not self.has_attention:
            raise ValueError("the 'none' model has no attention to replace")
        layers = list(range(self.layers)) if trace.layer == ALL else [trace.layer]
        if len(layers) != 1 or trace.head != ALL or (self.training and self.sub_dropout > 0):
            return None
        first = layers[0]
        layer = self.decoder_layers[first]
        att = layer.cross_attn
        values = trace.memory.values[:, first]  # (B, H, T_x, d_h)
        h, t_x = values.size(1), values.size(2)
        d = att.out_proj.out_features
        if b_idx.numel() * h * t_x * d > ROW_VALUES_BUDGET:
            return None
        w_o = att.out_proj.weight.view(d, h, att.d_h).permute(1, 2, 0)  # (H, d_h, d)
        projected = torch.einsum("bhxk,hkd->bhxd", values, w_o).reshape(-1, h * t_x, d)
        projected = projected.index_select(0, b_idx)  # (N, H·T_x, d): W^O_h v_hj per row
        base = (trace.mids[b_idx, t_idx, first] + att.out_proj.bias).unsqueeze(1)  # (N, 1, d)

        def logits(weights: Tensor) -> Tensor:
            n, k = weights.shape[:2]
            x = torch.baddbmm(base, weights.reshape(n, k, h * t_x), projected).flatten(0, 1)
            if not layer.sub.pre:
                x = layer.sub.norms[1](x)
            x = layer.feed_forward(x)
            if first + 1 < self.layers:
                bi, ti = b_idx.repeat_interleave(k), t_idx.repeat_interleave(k) + trace.offset
                for m in range(first + 1, self.layers):
                    upper = self.decoder_layers[m]
                    x = self._row_self_attention(upper, m, x, trace, bi, ti)
                    x = self._row_cross_attention(upper, m, x, trace.memory, bi)
                    x = upper.feed_forward(x)
            return self._logits(x).view(n, k, self.output.out_features)

        return logits

    def _row_self_attention(
        self, layer: DecoderLayer, m: int, x: Tensor, trace: TransformerTrace, bi, t_abs
    ) -> Tensor:
        """Self-attention sublayer of layer ``m`` for rows ``x`` (N, d) at positions ``t_abs``
        (N,): over the traced keys/values of positions < t and the row's own new key/value."""
        a = layer.sub.inp(0, x)
        att = layer.self_attn
        q = att.split(att.q_proj(a)[:, None, :])  # (N, H, 1, d_h)
        k_new, v_new = att.keys_values(a[:, None, :])  # (N, H, 1, d_h)
        keys = trace.self_keys[bi, m]  # (N, H, T_full, d_h)
        vals = trace.self_values[bi, m]
        t_full = keys.size(2)
        earlier = torch.arange(t_full, device=x.device)[None, :] < t_abs[:, None]  # (N, T_full)
        scores = torch.cat([torch.matmul(q, keys.transpose(-1, -2)), (q * k_new).sum(-1, True)], -1)
        scores = scores / math.sqrt(att.d_h)
        allowed = torch.cat([earlier, earlier.new_ones(earlier.size(0), 1)], -1)
        w = torch.softmax(scores.masked_fill(~allowed[:, None, None, :], float("-inf")), -1)
        ctx = torch.matmul(w, torch.cat([vals, v_new], 2))  # (N, H, 1, d_h)
        return layer.sub.add(0, x, att.out_proj(att.merge(ctx))[:, 0])

    def _row_cross_attention(
        self, layer: DecoderLayer, m: int, x: Tensor, memory: TransformerMemory, bi
    ) -> Tensor:
        """Cross-attention sublayer of layer ``m`` (the model's own weights) for rows (N, d)."""
        keys, values = memory.keys[bi, m], memory.values[bi, m]  # (N, H, T_x, d_h)
        w = self._cross_weights(layer, x[:, None, :], keys, memory.pad_mask[bi])  # (N, H, 1, T_x)
        return layer.cross_given_weights(x[:, None, :], w, values)[:, 0]

    # --- 3. decoding (Decoding.decode / greedy / beam_search) ----------------------------------
    def begin(self, src: Tensor, src_lengths: Tensor) -> _TransformerState:
        """Encode for incremental decoding (see :mod:`attnstudy.models.decoding`)."""
        memory, _ = self.encode(src, src_lengths)
        b = src.size(0)
        empty = memory.pad_mask.new_zeros(
            (b, self.layers, self.heads, 0, self.d_model // self.heads), dtype=torch.float32
        )
        return _TransformerState(memory, empty, empty.clone())

    def advance(
        self, y: Tensor, state: _TransformerState, t: int, intervene=None, layer: int | str = ALL
    ) -> tuple[Tensor, Tensor | None, _TransformerState]:
        """One decoder step at position ``t`` from the previous token ``y`` (long (N,)), with the
        key/value cache of positions < t.

        Args:
            intervene: optional ``fn(rows (N, H, T_x)) -> rows`` replacing the cross-attention
                rows of ``layer`` (of every layer, in order, when :data:`ALL`).
            layer: the intervened layer (index, negative from the top, or :data:`ALL`).

        Returns:
            logits (N, V), the rows of the intervened layer(s) (N, H or L·H, T_x) or None, the
            next state.

        Raises:
            ValueError: for a layer out of range.
        """
        chosen = self._layers_of(layer)
        x = self._decoder_input(y[:, None], t, state.memory)  # (N, 1, d)
        keys, values, used = [], [], []
        for m, dec in enumerate(self.decoder_layers):
            a = dec.sub.inp(0, x)
            k, v = dec.self_attn.keys_values(a)
            k = torch.cat([state.keys[:, m], k], 2)
            v = torch.cat([state.values[:, m], v], 2)
            keys.append(k), values.append(v)
            w = attend(dec.self_attn.queries(a), k, None)
            x = dec.sub.add(0, x, dec.self_attn.output(w, v))
            if dec.cross_attn is not None:
                mem = state.memory
                c = self._cross_weights(dec, x, mem.keys[:, m], mem.pad_mask)[
                    :, :, 0
                ]  # (N, H, T_x)
                if m in chosen:
                    if intervene is not None:
                        c = intervene(c)
                    used.append(c)
                x = dec.cross_given_weights(x, c[:, :, None, :], state.memory.values[:, m])
            x = dec.feed_forward(x)
        nxt = _TransformerState(state.memory, torch.stack(keys, 1), torch.stack(values, 1))
        return self._logits(x)[:, 0], torch.cat(used, 1) if used else None, nxt

    def encoder_attention(self, trace: TransformerTrace) -> Tensor:
        """The encoder's self-attention of every layer, (B, L, H, T_x, T_x) (attention rollout)."""
        return trace.encoder_attention

    # --- 4. value vectors (norm-based analysis) ------------------------------------------------
    def value_vectors(self, trace: TransformerTrace) -> Tensor:
        """f_h(x_j) = W^O_h v_{h,j} per analysed head, (B, H', T_x, d), so the cross-attention
        sublayer's output at step t is Σ_h Σ_j α_thj f_h(x_j) + b^O (Kobayashi et al. 2020, eq. 4).

        Raises:
            ValueError: for the ``none`` model.
        """
        if not self.has_attention:
            raise ValueError("the 'none' model has no value vectors")
        layers = list(range(self.layers)) if trace.layer == ALL else [trace.layer]
        out = []
        for m in layers:
            proj = self.decoder_layers[m].cross_attn.out_proj.weight  # (d, H·d_h)
            blocks = proj.view(self.d_model, self.heads, -1).permute(1, 2, 0)  # (H, d_h, d)
            out.append(torch.einsum("bhxk,hkd->bhxd", trace.memory.values[:, m], blocks))
        vectors = torch.cat(out, 1)
        return vectors if trace.head == ALL else vectors[:, trace.head : trace.head + 1]
