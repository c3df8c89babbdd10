"""Build a model from its config — a readable if/else, no plugins."""

from __future__ import annotations

from ..config import ModelConfig, TransformerConfig
from .attention import ATTENTIONS
from .decoder import Decoder
from .encoder import RecurrentEncoder
from .seq2seq import Seq2Seq
from .transformer import Transformer


def build_model(
    cfg: ModelConfig | TransformerConfig, src_vocab_size: int, tgt_vocab_size: int
) -> Seq2Seq | Transformer:
    """Instantiate the model described by ``cfg``.

    Args:
        cfg: validated model config of either architecture (size compatibility is checked there).
        src_vocab_size: size of the source vocabulary (specials included).
        tgt_vocab_size: size of the target vocabulary (specials included).

    Returns:
        An untrained :class:`Seq2Seq` or :class:`Transformer` in training mode.

    Raises:
        ValueError: for an unknown attention name.
    """
    if cfg.architecture == "transformer":
        return Transformer(
            src_vocab_size,
            tgt_vocab_size,
            d_model=cfg.d_model,
            heads=cfg.heads,
            d_ff=cfg.d_ff,
            layers=cfg.layers,
            dropout=cfg.dropout,
            layer_norm=cfg.layer_norm,
            positions=cfg.positions,
            max_positions=cfg.max_positions,
            tie_embeddings=cfg.tie_embeddings,
            attention=cfg.attention,
        )
    if cfg.attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {cfg.attention!r}; valid: {', '.join(ATTENTIONS)}")
    encoder = RecurrentEncoder(
        src_vocab_size,
        cfg.embedding_dim,
        cfg.encoder_hidden,
        cfg.cell,
        cfg.bidirectional,
        cfg.layers,
        cfg.dropout,
    )
    attention = ATTENTIONS[cfg.attention](cfg.decoder_hidden, encoder.output_size, cfg)
    decoder = Decoder(
        tgt_vocab_size,
        cfg.embedding_dim,
        cfg.decoder_hidden,
        encoder.output_size,
        attention,
        cfg.flow,
        cfg.cell,
        cfg.layers,
        cfg.dropout,
        cfg.input_feeding,
    )
    return Seq2Seq(encoder, decoder)
