"""Encoder-decoder models with attention and their analysis contract."""

from .attention import ATTENTIONS, Attention, Memory, masked_softmax
from .build import build_model
from .seq2seq import Decoded, Seq2Seq, Trace, eval_mode

__all__ = [
    "ATTENTIONS",
    "Attention",
    "Decoded",
    "Memory",
    "Seq2Seq",
    "Trace",
    "build_model",
    "eval_mode",
    "masked_softmax",
]
