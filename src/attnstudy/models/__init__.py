"""Encoder-decoder models with attention and their analysis contract."""

from .attention import ATTENTIONS, Attention, Memory, masked_softmax
from .families import build_model
from .seq2seq import RecurrentTrace, Seq2Seq
from .trace import ALL, Decoded, Trace, eval_mode, gradients_in_eval
from .transformer import Transformer, TransformerTrace

__all__ = [
    "ALL",
    "ATTENTIONS",
    "Attention",
    "Decoded",
    "Memory",
    "RecurrentTrace",
    "Seq2Seq",
    "Trace",
    "Transformer",
    "TransformerTrace",
    "build_model",
    "eval_mode",
    "gradients_in_eval",
    "masked_softmax",
]
