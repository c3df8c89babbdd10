"""Build a model of each trained family from its config (:mod:`attnstudy.models.families` picks
the function by ``model.architecture``)."""

from __future__ import annotations

from ..config import ModelConfig, TransformerConfig
from .attention import ATTENTIONS
from .decoder import Decoder
from .encoder import RecurrentEncoder
from .seq2seq import Seq2Seq
from .transformer import Transformer


def build_transformer(
    cfg: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int
) -> Transformer:
    """An untrained :class:`Transformer` (training mode) of ``cfg``'s sizes.

    Args:
        cfg: validated Transformer config.
        src_vocab_size, tgt_vocab_size: vocabulary sizes (specials included).
    """
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


def build_rnn(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> Seq2Seq:
    """An untrained recurrent :class:`Seq2Seq` (training mode): encoder, the score and the
    decoder flow of ``cfg`` (size compatibility is checked by the config).

    Args:
        cfg: validated recurrent model config.
        src_vocab_size, tgt_vocab_size: vocabulary sizes (specials included).

    Raises:
        ValueError: for an unknown attention name.
    """
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
