"""The encoder-decoder and the analysis contract (docs/design.md §3).

1. :meth:`Seq2Seq.trace` — a teacher-forced pass over a given target prefix returning per-step
   logits, attention and the per-step prefix state.
2. :meth:`Seq2Seq.logits_given_attention` — local intervention: the logits every real step
   would have produced from the SAME prefix state with a replacement attention row, for P
   replacements at once, computing non-padding rows only, in chunks.
3. :meth:`Seq2Seq.decode` — global intervention: decode again (teacher-forced or greedy) with an
   intervention applied at every step, so effects propagate.
4. Both work with autograd (adversarial search optimises replacement weights; gradient
   importance differentiates w.r.t. source embeddings with attention detached).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .attention import Memory
from .decoder import Decoder, DecoderState
from .decoding import BOS_ID, EOS_ID, PAD_ID, Decoding
from .encoder import RecurrentEncoder
from .trace import ALL, ROW_VALUES_BUDGET, Decoded, Trace, eval_mode, folded_rows

_sigmoid_backward = torch.ops.aten.sigmoid_backward
_tanh_backward = torch.ops.aten.tanh_backward

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "Decoded", "RecurrentTrace", "Seq2Seq", "eval_mode"]


@dataclass(kw_only=True)
class RecurrentTrace(Trace):
    """A teacher-forced pass of the recurrent family: :class:`~attnstudy.models.trace.Trace` (L = 1)
    plus what its local intervention needs.

    Attributes:
        prefix: (B, T_y, ·) per-step prefix state for :meth:`Seq2Seq.logits_given_attention`.
        memory: the attention memory (keys/values), or None.
    """

    prefix: Tensor
    memory: Memory | None

    def select(self, rows: Tensor, start: int = 0, stop: int | None = None) -> RecurrentTrace:
        """The trace of a subset of batch rows (long (B',)) and a window of decoder steps.

        Every step's local intervention needs only its own prefix state and the encoder memory,
        so a window ``[start, stop)`` of steps is a valid trace for local interventions.
        """
        t = self._window(start, stop)
        return RecurrentTrace(
            **self._pick(rows, t),
            prefix=self.prefix.index_select(0, rows)[:, t],
            memory=None if self.memory is None else self.memory.index_select(rows),
        )


@dataclass
class _RecurrentState:
    """Decoding state: the decoder state and the (per-row) attention memory."""

    decoder: DecoderState
    memory: Memory | None

    def index_select(self, index: Tensor) -> _RecurrentState:
        memory = None if self.memory is None else self.memory.index_select(index)
        return _RecurrentState(self.decoder.index_select(index), memory)


class RowLogits:
    """Logits of N prepared (example, step) rows as a function of their attention rows, with the
    vector–Jacobian product written out (what the adversarial search differentiates every Adam
    iteration).

    ``forward(weights (N, K, H, T_x)) -> (logits (N, K, V), saved)`` is one computation used both
    ways: called (``row_logits(weights)``) under autograd as any differentiable function, or by
    :meth:`with_vjp` without a graph, its intermediate values ``saved`` kept for
    ``backward(g (N, K, V), saved) -> ∂⟨g, logits⟩/∂weights (N, K, H·T_x)``, the chain rule
    written out (no autograd).
    """

    def __init__(self, forward, backward):
        self._forward, self._backward = forward, backward

    def __call__(self, weights: Tensor) -> Tensor:
        """Logits (N, K, V) of replacement rows ``weights`` (N, K, H, T_x), differentiable."""
        return self._forward(weights)[0]

    def with_vjp(self, weights: Tensor) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
        """Logits (N, K, V) of ``weights`` (N, K, H, T_x), computed without autograd, and their
        vector–Jacobian product: ``vjp(g (N, K, V)) -> Σ_v g_v ∂logits_v/∂weights``, shaped as
        ``weights``. Equal to autograd's gradient of ``(g · row_logits(weights)).sum()`` up to
        float rounding (``tests/models/test_local_rows.py``)."""
        with torch.no_grad():
            logits, saved = self._forward(weights)

        def vjp(g: Tensor) -> Tensor:
            with torch.no_grad():
                return self._backward(g, saved).view(weights.shape)

        return logits, vjp


class Seq2Seq(Decoding, nn.Module):
    """Encoder + attention + recurrent decoder (decoding through :class:`~attnstudy.models.decoding.Decoding`)."""

    def __init__(self, encoder: RecurrentEncoder, decoder: Decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    @property
    def attention(self):
        return self.decoder.attention

    @property
    def has_attention(self) -> bool:
        return self.decoder.attention is not None

    @property
    def n_layers(self) -> int:
        """Layers with cross-attention: one (the recurrent decoder attends once per step)."""
        return 1

    def value_vectors(self, trace: RecurrentTrace) -> Tensor:
        """f(x_j) per analysed head, (B, H', T_x, d), such that the context of step t is
        Σ_h Σ_j α_thj f_h(x_j) (Kobayashi et al. 2020, eq. 4): the attention memory's values after
        the score's output projection (multihead: each head's block of W^O; the other scores have
        none), so Σ over heads and positions is the context.

        Raises:
            ValueError: for the ``none`` model.
        """
        if not self.has_attention or trace.memory is None:
            raise ValueError("the 'none' model has no value vectors")
        values = trace.memory.values  # (B, H, T_x, d_v)
        out_proj = getattr(self.attention, "out_proj", None)
        if out_proj is not None:
            h, d = values.size(1), values.size(-1)
            blocks = out_proj.weight.view(out_proj.out_features, h, d).permute(1, 2, 0)  # (H, d, A)
            values = torch.einsum("bhxd,hda->bhxa", values, blocks)
        return values if trace.head == ALL else values[:, trace.head : trace.head + 1]

    def embed(self, src: Tensor) -> Tensor:
        """Source embeddings (B, T_x, E) of ``src`` long (B, T_x): what gradient importance
        differentiates against (pass them back through :meth:`trace`'s ``embedded``)."""
        return self.encoder.embedding(src)

    def embed_target(self, tgt_in: Tensor) -> Tensor:
        """Target-prefix embeddings (B, T_y, E) of ``tgt_in`` long (B, T_y), each step's input
        y_{t-1}: what source-vs-prefix attribution differentiates against (pass them back through
        :meth:`trace`'s ``embedded_target``)."""
        return self.decoder.embedding(tgt_in)

    def encode(
        self, src: Tensor, src_lengths: Tensor, embedded: Tensor | None = None
    ) -> tuple[Memory | None, DecoderState, Tensor]:
        """Encode. Returns (memory or None, initial decoder state, pad_mask (B, T_x))."""
        if src.dim() != 2 or src_lengths.dim() != 1 or src.size(0) != src_lengths.size(0):
            raise ValueError(
                f"src must be (B, T_x) with src_lengths (B,), got {tuple(src.shape)} "
                f"and {tuple(src_lengths.shape)}"
            )
        if int(src_lengths.min()) < 1:
            raise ValueError("every source needs at least one token (got an empty sequence)")
        states, summary = self.encoder(src, src_lengths, embedded)
        pad_mask = torch.arange(src.size(1), device=src.device)[None, :] >= src_lengths[:, None]
        memory = self.attention.memory(states, pad_mask) if self.has_attention else None
        return memory, self.decoder.init_state(summary), pad_mask

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
    ) -> RecurrentTrace:
        """Teacher-forced pass over a given target prefix.

        Args:
            src: long (B, T_x); src_lengths: long (B,).
            tgt_in: long (B, T_y), BOS followed by the prefix, PAD-padded.
            tgt_out: long (B, T_y), the prefix followed by EOS (optional; used for ``step_mask``,
                else the mask is ``tgt_in != PAD``).
            embedded: optional source embeddings (B, T_x, E) to differentiate against.
            detach_attention: stop gradients through the attention weights.
            embedded_target: optional target-prefix embeddings (B, T_y, E) of ``tgt_in``
                (:meth:`embed_target`) to differentiate against.

        Returns:
            :class:`RecurrentTrace` (cross-attention (B, 1, H, T_y, T_x)).
        """
        if embedded is None:
            embedded = self.encoder.embedding(src)
        memory, state, pad_mask = self.encode(src, src_lengths, embedded)
        logits, weights, prefixes = [], [], []
        for t in range(tgt_in.size(1)):
            out = self.decoder.step(
                tgt_in[:, t],
                state,
                memory,
                detach_attention=detach_attention,
                embedded=None if embedded_target is None else embedded_target[:, t],
            )
            state = out.state
            logits.append(out.logits)
            prefixes.append(out.prefix)
            if out.weights is not None:
                weights.append(out.weights)
        step_mask = (tgt_out if tgt_out is not None else tgt_in) != PAD_ID
        if tgt_out is None:
            tgt_out = torch.cat(
                [tgt_in[:, 1:], tgt_in.new_full((tgt_in.size(0), 1), PAD_ID)], dim=1
            )
        return RecurrentTrace(
            src=src,
            src_lengths=src_lengths,
            pad_mask=pad_mask,
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            step_mask=step_mask,
            logits=torch.stack(logits, 1),
            cross=torch.stack(weights, 2).unsqueeze(1) if weights else None,
            prefix=torch.stack(prefixes, 1),
            memory=memory,
            embedded=embedded,
            step_logits=tuple(logits) if torch.is_grad_enabled() else None,
        )

    # --- 2. local intervention -----------------------------------------------------------------
    def logits_given_attention(
        self,
        trace: RecurrentTrace,
        weights: Tensor,
        chunk_rows: int = 4096,
        steps: Tensor | None = None,
        plain: bool = False,
    ) -> Tensor:
        """Logits each step would give from its traced prefix state with replacement attention.

        Rows (example, replacement, step) are independent: the context is one batched matmul per
        example, then only real steps go through the output layers, ``chunk_rows`` at a time.

        Args:
            trace: from :meth:`trace`.
            weights: replacement rows of the trace's analysed rows (:attr:`Trace.attention`),
                (B, H', T_y, T_x) or (B, P, H', T_y, T_x); rows of padding steps are ignored. With
                one head analysed, the other heads keep their traced rows.
            chunk_rows: rows per output-layer call (sized for the cache).
            steps: optional bool (B, T_y) restricting which steps are computed (default: all real
                steps, ``trace.step_mask``).
            plain: every row through the context and :meth:`Decoder.output_given_context`, also
                for the Luong flow (the reference its folded form is tested and timed against).

        Returns:
            logits, (B, T_y, V) or (B, P, T_y, V); 0 at steps not computed.

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
        weights = trace.expand_heads(weights)
        b, p, h, t_y, t_x = weights.shape
        mask = trace.step_mask if steps is None else steps & trace.step_mask
        folded = not plain and not (self.training and self.decoder.dropout.p > 0)
        if self.decoder.flow == "luong" and folded:
            return self._luong_given_attention(trace, weights, mask, chunk_rows, single)
        # context for every (example, replacement, step): one matmul per example and head
        flat = weights.permute(0, 2, 1, 3, 4).reshape(b, h, p * t_y, t_x)
        context = self.attention.context(flat, trace.memory).view(b, p, t_y, -1)
        rows = mask.unsqueeze(1).expand(b, p, t_y).nonzero(as_tuple=True)  # (bi, pi, ti)
        out = context.new_zeros(b, p, t_y, self.decoder.output.out_features)
        n = rows[0].numel()
        for start in range(0, n, chunk_rows):
            bi, pi, ti = (r[start : start + chunk_rows] for r in rows)
            logits = self.decoder.output_given_context(trace.prefix[bi, ti], context[bi, pi, ti])
            out.index_put_((bi, pi, ti), logits)
        return out[:, 0] if single else out

    def value_contributions(self, memory: Memory) -> Tensor:
        """What each (head, source position) adds to the context per unit of attention.

        The context is linear in the attention rows (no score has a bias after the weighted sum):
        c = Σ_h Σ_j α_hj g_hj, with g_hj = ``attention.context`` of a one-hot row at (h, j) — the
        value v_hj placed in head h's block of the concatenated context (and through W^O when
        the score has one).

        Args:
            memory: the attention memory, values (B, H, T_x, d_v).

        Returns:
            g, shape (B, H·T_x, context_size), row h·T_x + j for (head h, position j).
        """
        b, h, t_x, _ = memory.values.shape
        values = memory.values
        parts = []
        for head in range(h):  # one head at a time: B·H·T_x² basis entries, not B·H²·T_x²
            basis = values.new_zeros(h, t_x, t_x)
            basis[head] = torch.eye(t_x, dtype=values.dtype, device=values.device)
            parts.append(self.attention.context(basis.expand(b, -1, -1, -1), memory))
        return torch.cat(parts, 1)  # (B, H·T_x, context)

    def _luong_split(self) -> tuple[Tensor, Tensor]:
        """W_c = [W_ctx W_s] of Luong et al. (2015), eq. 5: (hidden, context) and (hidden, hidden)."""
        dec = self.decoder
        w_ctx, w_state = dec.combine.weight.split([self.attention.context_size, dec.hidden], 1)
        return w_ctx, w_state

    def _luong_given_attention(
        self, trace: RecurrentTrace, weights: Tensor, mask: Tensor, chunk_rows: int, single: bool
    ) -> Tensor:
        """:meth:`logits_given_attention` of the Luong flow, with W_c folded into the values.

        h̃_t = tanh(W_c [c_t; s_t] + b_c) (Luong et al. 2015, eq. 5). The state term W_s s_t + b_c
        is the same for every replacement of step t (computed once per step, not once per row),
        and W_ctx c_t = Σ_hj α_hj (W_ctx g_hj) is linear in α, so W_ctx is applied once per source
        position instead of once per row (:meth:`value_contributions`). Per example, the rows of
        its real steps (all P replacements) are one product α_rows @ (W_ctx g) plus each step's
        state term W_s s + b (:func:`attnstudy.models.trace.folded_rows`), then the tanh and the output layer (eq. 6). Only real steps are computed; nothing is gathered but the attention rows themselves. The same function as
        :meth:`Decoder.output_given_context` on the context (the per-step loop references compute
        it that way), up to float rounding; in training mode with dropout the plain form is used.

        Args:
            weights: (B, P, H, T_y, T_x), every head's rows. mask: bool (B, T_y), rows computed.
            chunk_rows: rows per output-layer call (a chunk holds whole examples, at least one).

        Returns:
            logits (B, P, T_y, V) (or (B, T_y, V) when ``single``); 0 where not computed.
        """
        dec = self.decoder
        b, t_y = weights.size(0), weights.size(3)
        w_ctx, w_state = self._luong_split()
        projected = self.value_contributions(trace.memory) @ w_ctx.T  # (B, H·T_x, hidden)
        state = torch.addmm(dec.combine.bias, trace.prefix.flatten(0, 1), w_state.T)
        state = state.view(b, t_y, -1)
        out = folded_rows(
            weights,
            mask,
            projected,
            state,
            lambda x, bi, ti: dec.output(torch.tanh_(x)),  # h̃ (rows, hidden) → logits
            dec.output.out_features,
            chunk_rows,
        )
        return out[:, 0] if single else out

    def rows_given_attention(
        self, trace: RecurrentTrace, b_idx: Tensor, t_idx: Tensor
    ) -> Callable[[Tensor], Tensor] | None:
        """Local intervention at N chosen (example, step) rows, prepared once and applied many
        times (the adversarial search re-evaluates the same rows every Adam iteration).

        The same function as :meth:`logits_given_attention` on those rows, with what every call
        shares computed once — the rows' projected values and state term (Luong, as in
        :meth:`_luong_given_attention`) or their value contributions and prefix states
        (Bahdanau) — and no scatter into a (B, K, H, T_y, T_x) replacement per call.

        Args:
            trace: from :meth:`trace`.
            b_idx, t_idx: long (N,), batch row and decoder step of each row (real steps).

        Returns:
            ``logits(weights (N, K, H, T_x)) -> (N, K, V)`` (differentiable in ``weights``) — in
            eval mode a :class:`RowLogits`, whose ``with_vjp`` also gives the gradient with the
            chain rule written out (the Luong flow's output layers; the Bahdanau flow's GRU/LSTM
            cells, readout and output layer: :meth:`_bahdanau_rows`) — or
            None where this form does not apply — one head of several analysed, or per-row
            copies of the values (N × H·T_x × size floats) past :data:`ROW_VALUES_BUDGET` (a long
            example) — and the caller scatters into :meth:`logits_given_attention` instead
            (:func:`attnstudy.analysis._chunks.rows_given_attention`).

        Raises:
            ValueError: for the ``none`` model.
        """
        if not self.has_attention:
            raise ValueError("the 'none' model has no attention to replace")
        if trace.head != ALL:
            return None
        dec = self.decoder
        h_tx = trace.memory.values.size(1) * trace.memory.values.size(2)
        if b_idx.numel() * h_tx * max(self.attention.context_size, dec.hidden) > ROW_VALUES_BUDGET:
            return None
        g = self.value_contributions(trace.memory)  # (B, H·T_x, context)
        if dec.flow == "luong" and not (self.training and dec.dropout.p > 0):
            w_ctx, w_state = self._luong_split()
            projected = (g @ w_ctx.T).index_select(0, b_idx)  # (N, H·T_x, hidden)
            state = torch.addmm(dec.combine.bias, trace.prefix[b_idx, t_idx], w_state.T)

            def forward(weights: Tensor) -> tuple[Tensor, Tensor]:
                n, k, h, t_x = weights.shape
                pre = torch.baddbmm(state.unsqueeze(1), weights.reshape(n, k, h * t_x), projected)
                h_tilde = pre.tanh_()  # (N, K, hidden); baddbmm's backward keeps no output
                return dec.output(h_tilde), h_tilde

            def backward(g: Tensor, h_tilde: Tensor) -> Tensor:
                # logits = W_o h̃ + b, h̃ = tanh(pre), pre = s_term + α (W_ctx g)
                g_pre = _tanh_backward(g @ dec.output.weight, h_tilde)
                return torch.bmm(g_pre, projected.mT)  # (N, K, H·T_x)

            return RowLogits(forward, backward)
        prefix = trace.prefix[b_idx, t_idx]  # (N, ·)
        gates = (4 if dec.cell == "lstm" else 3) * dec.hidden
        small = b_idx.numel() * h_tx * (gates + dec.hidden) <= ROW_VALUES_BUDGET
        if not (self.training and dec.dropout.p > 0) and small:
            return self._bahdanau_rows(g, b_idx, prefix)
        g_rows = g.index_select(0, b_idx)  # (N, H·T_x, context)

        def logits(weights: Tensor) -> Tensor:
            n, k, h, t_x = weights.shape
            context = torch.bmm(weights.reshape(n, k, h * t_x), g_rows).flatten(0, 1)
            out = dec.output_given_context(prefix.repeat_interleave(k, 0), context)
            return out.view(n, k, dec.output.out_features)

        return logits

    def _bahdanau_rows(self, g: Tensor, b_idx: Tensor, prefix: Tensor) -> RowLogits:
        """:meth:`rows_given_attention` of the Bahdanau flow with the context folded into the
        first RNN layer's input weights and the readout (eval mode).

        The step is s = RNN([e; c], s_{t−1}), h = tanh(W_r [s; c; e] + b_r), logits = W_o h
        (Bahdanau et al. 2015, appendix A), with c = Σ_hj α_hj g_hj linear in α. Per row, what
        does not depend on α is computed once — the recurrent terms W_hh s_{t−1} + b_hh of every
        layer (added to the first layer's input terms wherever the cell adds them: every gate
        but the GRU's candidate, where r multiplies them), the embedding's terms W_ie e + b_ih
        and W_re e + b_r — and W_ic c = α (g W_icᵀ), W_rc c = α (g W_rcᵀ) are batched products
        with the rows' projected values, one per gate (r, z, n; LSTM i, f, g, o) and one for the
        readout, each ``hidden`` columns wide. The cells are PyTorch's GRU/LSTM
        equations (``torch.nn.GRU``, ``torch.nn.LSTM``) written out; the same function as
        :meth:`Decoder.output_given_context` up to float rounding
        (``tests/models/test_local_rows.py``).

        The vector–Jacobian product (:meth:`RowLogits.with_vjp`) is the chain rule written out
        backwards through the same equations, from g = ∂/∂logits: ∂/∂h = gᵀ W_o, ∂/∂pre =
        ∂/∂h ⊙ (1 − h²) (h = tanh(pre), pre = W_rs s + [W_rc c + W_re e + b_r]), ∂/∂s = ∂/∂pre W_rs;
        through each layer's cell from the top: GRU (r = σ(a_r), z = σ(a_z), n = tanh(a_n + r ⊙
        (W_hn s_{t−1} + b_hn)), s = n + z ⊙ (s_{t−1} − n)): ∂/∂a_n = ∂/∂s ⊙ (1 − z) ⊙ (1 − n²),
        ∂/∂a_r = ∂/∂a_n ⊙ (W_hn s_{t−1} + b_hn) ⊙ r (1 − r), ∂/∂a_z = ∂/∂s ⊙ (s_{t−1} − n) ⊙ z (1 −
        z); LSTM (c = f ⊙ c_{t−1} + i ⊙ g, s = o ⊙ tanh c): ∂/∂c = ∂/∂s ⊙ o (1 − tanh² c), then
        i, f, g, o through σ' and tanh'; a layer above the first passes ∂/∂a W_ih to the layer
        below. Last, ∂/∂α = Σ_gates ∂/∂a_gate (g W_gateᵀ)ᵀ + ∂/∂pre (g W_rcᵀ)ᵀ, the batched
        products with the rows' projected values again.

        Args:
            g: (B, H·T_x, context) the value contributions (:meth:`value_contributions`).
            b_idx: long (N,), each row's example.
            prefix: (N, ·) the rows' prefix states (:attr:`StepOutput.prefix`).

        Returns:
            :class:`RowLogits`: ``logits(weights (N, K, H, T_x)) -> (N, K, V)``, differentiable in
            ``weights``, and its ``with_vjp``.
        """
        return _BahdanauRows(self, g, b_idx, prefix).row_logits()

    # --- 3. decoding and global intervention (Decoding.decode / greedy / beam_search) -------
    def begin(self, src: Tensor, src_lengths: Tensor) -> _RecurrentState:
        """Encode for decoding (see :mod:`attnstudy.models.decoding`)."""
        memory, state, _ = self.encode(src, src_lengths)
        return _RecurrentState(state, memory)

    def advance(
        self, y: Tensor, state: _RecurrentState, t: int, intervene=None, layer: int | str = ALL
    ) -> tuple[Tensor, Tensor | None, _RecurrentState]:
        """One decoder step from the previous token ``y`` (long (N,)).

        Args:
            y: long (N,); state: from :meth:`begin` or the previous step; t: the step (unused:
                the recurrent state carries the position).
            intervene: optional ``fn(rows (N, H, T_x)) -> rows`` replacing the attention row.
            layer: 0, -1 or :data:`~attnstudy.models.trace.ALL` (the one layer).

        Returns:
            logits (N, V), the attention rows used (N, H, T_x) or None, the next state.

        Raises:
            ValueError: for a layer other than the one this family has.
        """
        if layer not in (0, -1, ALL):
            raise ValueError(f"layer {layer} out of range: the model has 1 layer(s) of attention")
        out = self.decoder.step(y, state.decoder, state.memory, intervene=intervene)
        return out.logits, out.weights, _RecurrentState(out.state, state.memory)


def _affine(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    return x @ w.T if b is None else torch.addmm(b, x, w.T)


class _BahdanauRows:
    """What :meth:`Seq2Seq._bahdanau_rows` computes once per set of rows (the α-independent
    terms, the rows' projected values), and the logits and vector–Jacobian product from it (the
    equations: that method's docstring)."""

    def __init__(self, model: Seq2Seq, g: Tensor, b_idx: Tensor, prefix: Tensor):
        dec, rnn = model.decoder, model.decoder.rnn
        self.dec, self.rnn = dec, rnn
        n, hid, ctx_size = prefix.size(0), dec.hidden, model.attention.context_size
        emb_size = dec.embedding.embedding_dim
        states = prefix[:, : dec.layers * dec.state_size].view(n, dec.layers, dec.state_size)
        emb = prefix[:, dec.layers * dec.state_size :]
        self.hid, self.lstm = hid, dec.cell == "lstm"
        w_ie, w_ic = rnn.weight_ih_l0.split([emb_size, ctx_size], 1)  # input [e; c]
        self.w_rs, w_rc, w_re = dec.readout.weight.split([hid, ctx_size, emb_size], 1)
        self.w_ih = [getattr(rnn, f"weight_ih_l{layer}") for layer in range(dec.layers)]
        # per layer; recurrent: W_hh s + b_hh, one per gate
        self.recurrent, self.cells, self.hs = [], [], []
        for layer in range(dec.layers):
            h = states[:, layer, :hid]
            self.hs.append(h.unsqueeze(1))
            self.cells.append(states[:, layer, hid:].unsqueeze(1) if self.lstm else None)
            w_hh = getattr(rnn, f"weight_hh_l{layer}")
            full = _affine(h, w_hh, self.bias("bias_hh", layer)).unsqueeze(1)  # (N, 1, gates·hid)
            self.recurrent.append([q.contiguous() for q in full.split(hid, -1)])
        # the first layer's gates and the readout, one block each: the α-independent part of
        # the pre-activation (N, 1, hidden) and the projected values (N, H·T_x, hidden)
        first = _affine(emb, w_ie, self.bias("bias_ih", 0)).unsqueeze(1).split(hid, -1)
        self.fixed = [
            q.contiguous() if not self.lstm and gate == 2 else q + self.recurrent[0][gate]
            for gate, q in enumerate(first)  # GRU's n: r ⊙ ·
        ]
        self.fixed.append(_affine(emb, w_re, dec.readout.bias).unsqueeze(1))  # W_re e + b_r
        # W_ic c and W_rc c as α (g Wᵀ), one batched product per gate and for the readout: each
        # result is its gate's own contiguous tensor, and on the CPU a product `hidden` columns
        # wide took less time per column than one over all of them (quickstart sizes)
        self.projected = [(g @ w.T).index_select(0, b_idx) for w in (*w_ic.split(hid), w_rc)]

    def bias(self, name: str, layer: int) -> Tensor | None:
        """A bias of the decoder's RNN (None where it has none)."""
        return getattr(self.rnn, f"{name}_l{layer}", None)

    def row_logits(self) -> RowLogits:
        """:class:`RowLogits` of :meth:`forward` and :meth:`backward`."""
        return RowLogits(self.forward, self.backward)

    def cell(self, a: list[Tensor], layer: int) -> tuple[Tensor, tuple]:
        """One layer's cell from its gates' pre-activations (fresh tensors, overwritten)."""
        if self.lstm:
            i, f, g_, o = a[0].sigmoid_(), a[1].sigmoid_(), a[2].tanh_(), a[3].sigmoid_()
            tanh_c = torch.addcmul(f * self.cells[layer], i, g_).tanh_()
            return o * tanh_c, (i, f, g_, o, tanh_c)
        r, z = a[0].sigmoid_(), a[1].sigmoid_()
        cand = torch.addcmul(a[2], r, self.recurrent[layer][2]).tanh_()
        step = self.hs[layer] - cand
        return torch.addcmul(cand, z, step), (r, z, cand, step)  # (1 − z) n + z h

    def forward(self, weights: Tensor) -> tuple[Tensor, tuple]:
        """The logits of the rows given attention ``weights`` (N, K, H, T_x), and what the
        vector–Jacobian product needs."""
        hid, lstm, w_ih = self.hid, self.lstm, self.w_ih
        rows = weights.flatten(2)  # (N, K, H·T_x)
        # in place only on fresh results whose op keeps no output for autograd
        pre = [torch.baddbmm(f, rows, p) for f, p in zip(self.fixed, self.projected)]
        x, saved = None, []
        for layer in range(self.dec.layers):
            if layer:
                b_ih = self.bias("bias_ih", layer)
                gi = x @ w_ih[layer].T if b_ih is None else torch.add(x @ w_ih[layer].T, b_ih)
                gi = gi.split(hid, -1)
                a = [
                    q if not lstm and gate == 2 else q + self.recurrent[layer][gate]
                    for gate, q in enumerate(gi)
                ]
            else:
                a = pre[:-1]
            x, kept = self.cell(a, layer)
            saved.append(kept)
        read = pre[-1]
        top = torch.addmm(read.flatten(0, 1), x.flatten(0, 1), self.w_rs.T).view_as(read).tanh_()
        return self.dec.output(top), (saved, top)

    def backward(self, g_logits: Tensor, saved: tuple) -> Tensor:
        """∂/∂weights from ``g_logits`` = ∂/∂logits (the chain rule through :meth:`forward`)."""
        # _tanh_backward(g, y) = g (1 − y²) and _sigmoid_backward(g, y) = g y (1 − y): the
        # derivatives of y = tanh(a) and y = σ(a) from their outputs, one kernel each
        per_layer, top = saved
        g_pre = _tanh_backward(g_logits @ self.dec.output.weight, top)  # (N, K, hidden)
        g_x = g_pre @ self.w_rs
        for layer in reversed(range(self.dec.layers)):
            if self.lstm:
                i, f, g_, o, tanh_c = per_layer[layer]
                g_c = _tanh_backward(g_x * o, tanh_c)
                g_a = [
                    _sigmoid_backward(g_c * g_, i),
                    _sigmoid_backward(g_c * self.cells[layer], f),
                    _tanh_backward(g_c * i, g_),
                    _sigmoid_backward(g_x * tanh_c, o),
                ]
            else:
                r, z, cand, step = per_layer[layer]
                g_an = _tanh_backward(torch.addcmul(g_x, g_x, z, value=-1), cand)
                g_a = [
                    _sigmoid_backward(g_an * self.recurrent[layer][2], r),
                    _sigmoid_backward(g_x * step, z),
                    g_an,
                ]
            if layer:
                g_x = torch.cat(g_a, -1) @ self.w_ih[layer]
        out = torch.bmm(g_pre, self.projected[-1].mT)  # (N, K, H·T_x)
        for g_gate, p in zip(g_a, self.projected):
            out.baddbmm_(g_gate, p.mT)
        return out
