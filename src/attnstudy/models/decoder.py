"""Recurrent decoder with a choice of flow, independent of the attention score.

Flows (docs/design.md §3):

* ``bahdanau`` (Bahdanau et al. 2014, eq. 4–6 and appendix A.2.2): the query is the previous
  state s_{t−1}; the context c_t enters the RNN input, s_t = RNN([E y_{t−1}; c_t], s_{t−1});
  output p(y_t) = softmax(W_o tanh(W_r [s_t; c_t; E y_{t−1}])).
* ``luong`` (Luong et al. 2015, eq. 5–6 and §3.3): s_t = RNN([E y_{t−1}; h̃_{t−1}], s_{t−1})
  (h̃ only with input feeding); the query is s_t; attentional state h̃_t = tanh(W_c [c_t; s_t]);
  p(y_t) = softmax(W_s h̃_t).

Both split a step into "everything before the attention row" (the prefix state, saved by a
trace) and "everything after it" (:meth:`Decoder.output_given_context`), which is what makes
local interventions a batched computation over independent rows.

State: a tensor of shape (L, N, S) with S = hidden (GRU) or 2 × hidden (LSTM: [h; c]); with
Luong input feeding, the previous attentional state h̃_{t−1}, shape (N, hidden), travels beside.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .attention import Attention, Memory


@dataclass
class DecoderState:
    """Recurrent state (L, N, S) and, for Luong input feeding, h̃_{t−1} (N, hidden)."""

    rnn: Tensor
    feed: Tensor | None = None

    def index_select(self, index: Tensor) -> DecoderState:
        feed = None if self.feed is None else self.feed.index_select(0, index)
        return DecoderState(self.rnn.index_select(1, index), feed)


@dataclass
class StepOutput:
    """One decoder step for N rows.

    Attributes:
        logits: (N, V).
        weights: (N, H, T_x) attention row used, or None for the ``none`` model.
        query: (N, d_q) the query the attention saw (None without attention).
        prefix: what :meth:`Decoder.output_given_context` needs to recompute this step from
            another attention row: Bahdanau: [flattened s_{t−1} (N, L·S); E y_{t−1} (N, E)];
            Luong: s_t (N, hidden).
        state: the state after the step.
    """

    logits: Tensor
    weights: Tensor | None
    query: Tensor | None
    prefix: Tensor
    state: DecoderState


class Decoder(nn.Module):
    """GRU/LSTM decoder with ``bahdanau`` or ``luong`` flow.

    Args:
        vocab_size: target vocabulary size V.
        embedding_dim: E.
        hidden: decoder hidden size (= d_q, the query size).
        key_size: encoder state size (d_k), used by the initial-state bridge.
        attention: the score module, or None (no context: the bottleneck model).
        flow: "bahdanau" or "luong".
        cell: "gru" or "lstm".
        layers: stacked layers L.
        dropout: on embeddings and before the output layer.
        input_feeding: Luong input feeding (ignored by the Bahdanau flow).
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden: int,
        key_size: int,
        attention: Attention | None,
        flow: str = "bahdanau",
        cell: str = "gru",
        layers: int = 1,
        dropout: float = 0.0,
        input_feeding: bool = True,
        pad_id: int = 0,
    ):
        super().__init__()
        if flow not in ("bahdanau", "luong"):
            raise ValueError(f"unknown decoder flow {flow!r}; valid flows: bahdanau, luong")
        self.flow, self.cell, self.layers, self.hidden = flow, cell, layers, hidden
        self.attention = attention
        self.input_feeding = flow == "luong" and input_feeding
        ctx = attention.context_size if attention is not None else 0
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_id)
        self.bridge = nn.Linear(key_size, hidden * layers)
        if flow == "bahdanau":
            rnn_in = embedding_dim + ctx
            self.readout = nn.Linear(hidden + ctx + embedding_dim, hidden)
        else:
            rnn_in = embedding_dim + (hidden if self.input_feeding else 0)
            self.combine = nn.Linear(ctx + hidden, hidden)
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
        self.rnn = rnn(
            rnn_in,
            hidden,
            num_layers=layers,
            batch_first=True,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.output = nn.Linear(hidden, vocab_size)
        self.dropout = nn.Dropout(dropout)
        self.state_size = hidden * (2 if cell == "lstm" else 1)

    # --- state -----------------------------------------------------------------------------
    def init_state(self, summary: Tensor) -> DecoderState:
        """Initial state s_0 = tanh(W_b summary). ``summary``: (N, d_k)."""
        n = summary.size(0)
        h = torch.tanh(self.bridge(summary)).view(n, self.layers, self.hidden).transpose(0, 1)
        if self.cell == "lstm":
            h = torch.cat([h, torch.zeros_like(h)], dim=-1)
        feed = summary.new_zeros(n, self.hidden) if self.input_feeding else None
        return DecoderState(h.contiguous(), feed)

    def _run_rnn(self, x: Tensor, rnn_state: Tensor) -> tuple[Tensor, Tensor]:
        """One RNN step. ``x``: (N, in); ``rnn_state``: (L, N, S). Returns top output (N, hidden), new state."""
        if self.cell == "lstm":
            h, c = rnn_state.chunk(2, dim=-1)
            out, (h, c) = self.rnn(x.unsqueeze(1), (h.contiguous(), c.contiguous()))
            return out[:, 0], torch.cat([h, c], dim=-1)
        out, h = self.rnn(x.unsqueeze(1), rnn_state.contiguous())
        return out[:, 0], h

    def _top(self, rnn_state: Tensor) -> Tensor:
        return rnn_state[-1, :, : self.hidden]

    # --- one step ----------------------------------------------------------------------------
    def step(
        self,
        y_prev: Tensor,
        state: DecoderState,
        memory: Memory | None,
        intervene=None,
        detach_attention: bool = False,
        embedded: Tensor | None = None,
    ) -> StepOutput:
        """One decoder step.

        Args:
            y_prev: long, shape (N,), the previous target token.
            state: the state before the step.
            memory: the attention memory (None for the ``none`` model).
            intervene: optional ``fn(weights (N, H, T_x)) -> weights (N, H, T_x)`` that replaces
                the attention row before it is used (global intervention).
            detach_attention: stop gradients through the attention weights (gradient importance,
                Jain & Wallace 2019 §3).
            embedded: optional (N, E) embedding of ``y_prev`` in place of the lookup (source vs
                prefix attribution differentiates against it).

        Returns:
            StepOutput.
        """
        emb = self.dropout(self.embedding(y_prev) if embedded is None else embedded)
        weights = query = None
        if self.flow == "bahdanau":
            prefix = torch.cat([state.rnn.transpose(0, 1).reshape(emb.size(0), -1), emb], dim=-1)
            query = self._top(state.rnn)
            context, weights = self._attend(query, memory, intervene, detach_attention)
            logits, rnn_state, _ = self._bahdanau_output(prefix, context)
            return StepOutput(
                logits,
                weights,
                query if memory is not None else None,
                prefix,
                DecoderState(rnn_state),
            )
        inp = emb if state.feed is None else torch.cat([emb, state.feed], dim=-1)
        s, rnn_state = self._run_rnn(inp, state.rnn)
        context, weights = self._attend(s, memory, intervene, detach_attention)
        logits, h_tilde = self._luong_output(s, context)
        feed = h_tilde if self.input_feeding else None
        return StepOutput(
            logits, weights, s if memory is not None else None, s, DecoderState(rnn_state, feed)
        )

    def _attend(self, query: Tensor, memory: Memory | None, intervene, detach: bool):
        if self.attention is None or memory is None:
            return query.new_zeros(query.size(0), 0), None
        if detach:  # no graph for the scores at all: nothing would flow back through them
            with torch.no_grad():
                weights = self.attention.weights(query.unsqueeze(1), memory)  # (N, H, 1, T_x)
        else:
            weights = self.attention.weights(query.unsqueeze(1), memory)
        weights = weights[:, :, 0]
        if intervene is not None:
            weights = intervene(weights)
        context = self.attention.context(weights.unsqueeze(2), memory)[:, 0]
        return context, weights

    def _bahdanau_output(self, prefix: Tensor, context: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        n = prefix.size(0)
        flat_state, emb = (
            prefix[:, : self.layers * self.state_size],
            prefix[:, self.layers * self.state_size :],
        )
        rnn_state = flat_state.view(n, self.layers, self.state_size).transpose(0, 1)
        s, rnn_state = self._run_rnn(torch.cat([emb, context], dim=-1), rnn_state)
        hidden = torch.tanh(self.readout(torch.cat([s, context, emb], dim=-1)))
        return self.output(self.dropout(hidden)), rnn_state, hidden

    def _luong_output(self, s: Tensor, context: Tensor) -> tuple[Tensor, Tensor]:
        h_tilde = torch.tanh(self.combine(torch.cat([context, s], dim=-1)))
        return self.output(self.dropout(h_tilde)), h_tilde

    def output_given_context(self, prefix: Tensor, context: Tensor) -> Tensor:
        """Logits of a step recomputed from its saved prefix state and a (new) context vector.

        Args:
            prefix: (N, ·) as saved in :attr:`StepOutput.prefix`.
            context: (N, context_size).

        Returns:
            logits, shape (N, V).
        """
        if self.flow == "bahdanau":
            return self._bahdanau_output(prefix, context)[0]
        return self._luong_output(prefix, context)[0]
