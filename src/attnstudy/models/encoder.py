"""Recurrent encoder: embedding + GRU/LSTM over packed sequences."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


class RecurrentEncoder(nn.Module):
    """Embedding + (bi)directional GRU or LSTM.

    Args:
        vocab_size: source vocabulary size.
        embedding_dim: token embedding size E.
        hidden: hidden size per direction.
        cell: "gru" or "lstm".
        bidirectional: run a backward RNN too (states concatenated).
        layers: stacked RNN layers.
        dropout: on embeddings and between layers.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int,
        hidden: int,
        cell: str = "gru",
        bidirectional: bool = True,
        layers: int = 1,
        dropout: float = 0.0,
        pad_id: int = 0,
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_id)
        rnn = {"gru": nn.GRU, "lstm": nn.LSTM}[cell]
        self.rnn = rnn(
            embedding_dim,
            hidden,
            num_layers=layers,
            batch_first=True,
            bidirectional=bidirectional,
            dropout=dropout if layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(dropout)
        self.directions = 2 if bidirectional else 1
        self.output_size = hidden * self.directions

    def forward(
        self, src: Tensor, src_lengths: Tensor, embedded: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Encode a padded batch.

        Args:
            src: long, shape (B, T_x), padded.
            src_lengths: long, shape (B,), every length ≥ 1.
            embedded: optional precomputed embeddings, shape (B, T_x, E) — gradient importance
                differentiates with respect to these.

        Returns:
            states: shape (B, T_x, hidden × directions), zeros at padding.
            summary: shape (B, hidden × directions): the last forward state and the first
                backward state of the top layer (Bahdanau et al. 2014, appendix A.2.2).
        """
        x = self.embedding(src) if embedded is None else embedded
        x = self.dropout(x)
        packed = pack_padded_sequence(x, src_lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        states, _ = pad_packed_sequence(out, batch_first=True, total_length=src.size(1))
        last = states[torch.arange(src.size(0), device=src.device), src_lengths - 1]  # (B, D)
        if self.directions == 2:
            half = states.size(-1) // 2
            summary = torch.cat([last[:, :half], states[:, 0, half:]], dim=-1)
        else:
            summary = last
        return states, summary
