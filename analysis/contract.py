"""The model contract: what the ablations need of a model, as :class:`typing.Protocol` classes.

A model family (the recurrent :class:`~attnstudy.models.Seq2Seq`, a Transformer, a wrapped
pretrained model) satisfies the protocols of the capabilities it has, and every ablation whose
``requires`` those capabilities runs on it unchanged. Cross-attention always has a layer axis:
``(B, L, H, T_y, T_x)``, L = 1 for the recurrent family; the ablations analyse one layer at a time
(:attr:`AttentionTrace.layer`), and the tidy tables carry a ``layer`` column.

Shapes (glossary, used throughout :mod:`attnstudy.analysis`):

    B   batch size          P   replacements per step     L   layers with cross-attention
    H   attention heads     T_y decoder steps             T_x source positions (padded)
    V   output vocabulary   E   source embedding size

Capabilities (:data:`attnstudy.analysis.catalogue.CAPABILITIES`):

* ``attention`` — the trace has cross-attention (:class:`AttentionTrace`);
* ``local`` — :class:`LocallyIntervenable`: each step's logits recomputed from its own prefix
  state with replacement attention rows (permutation, uniform, erasure, adversarial);
* ``global`` — :class:`GloballyIntervenable`: decoding again with an intervention at every step;
* ``gradients`` — :class:`InputGradients`: a trace through given source embeddings
  (gradient × input and leave-one-out importance);
* ``prefix_gradients`` — :class:`PrefixGradients`: a trace through given target-prefix
  embeddings as well (source vs prefix attribution, Voita et al. 2021);
* ``values`` — :class:`ValueVectors`: the value vectors after the score's value and output
  projections, whose weighted sum is the context (norm-based analysis);
* ``self_attention`` — :class:`EncoderSelfAttention`: the encoder's self-attention of every
  layer (attention rollout).

The analysed unit: :attr:`AttentionTrace.attention` holds the rows of one layer (all heads, or one
head with ``with_head``) or of all layers at once (``with_layer("all")``: the layers' heads side by
side), and a replacement passed to ``logits_given_attention`` replaces exactly those rows. A model
with more than one layer takes ``layer=`` (and ``head=``) in ``decode``.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class AttentionTrace(Protocol):
    """A teacher-forced pass over a target prefix.

    Attributes:
        src: long (B, T_x); src_lengths: long (B,); pad_mask: bool (B, T_x), True at padding.
        tgt_in: long (B, T_y), BOS + prefix; tgt_out: long (B, T_y), prefix + EOS.
        step_mask: bool (B, T_y), True at real steps.
        logits: (B, T_y, V).
        cross_attention: (B, L, H, T_y, T_x), rows summing to 1, exactly 0 at padding; None without
            attention.
        attention: (B, H, T_y, T_x), the cross-attention of the analysed layer :attr:`layer`.
        layer: index of the analysed layer (0 ≤ layer < L).
    """

    src: Tensor
    src_lengths: Tensor
    pad_mask: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    step_mask: Tensor
    logits: Tensor
    layer: int

    @property
    def cross_attention(self) -> Tensor | None: ...

    @property
    def attention(self) -> Tensor | None: ...

    def select(self, rows: Tensor, start: int = 0, stop: int | None = None) -> AttentionTrace:
        """The trace of some batch rows (long (B',)) and a window of steps ``[start, stop)``."""
        ...

    def with_layer(self, layer: int) -> AttentionTrace:
        """The same trace analysing another layer's cross-attention."""
        ...


@runtime_checkable
class LocallyIntervenable(Protocol):
    """``logits_given_attention``: every real step's logits recomputed from its traced prefix state
    with replacement attention rows of the trace's analysed layer (the other layers keep theirs).

    ``weights``: (B, H, T_y, T_x) or (B, P, H, T_y, T_x); returns (B, T_y, V) or (B, P, T_y, V),
    0 at steps not computed (``steps``: bool (B, T_y)). Must also work under autograd.
    """

    has_attention: bool

    def logits_given_attention(
        self, trace: Any, weights: Tensor, chunk_rows: int = 4096, steps: Tensor | None = None
    ) -> Tensor: ...


@runtime_checkable
class GloballyIntervenable(Protocol):
    """``decode``: free-running (or teacher-forced) decoding with ``intervene(weights (B, H', T_x), t)``
    replacing the analysed rows at every step, so effects propagate. A multi-layer model also
    takes ``layer=`` (index or -1 for all layers, each called in turn) and ``head=`` (-1: all)."""

    def decode(
        self,
        src: Tensor,
        src_lengths: Tensor,
        max_len: int,
        prefix: Tensor | None = None,
        intervene: Any = None,
    ) -> Any: ...


@runtime_checkable
class InputGradients(Protocol):
    """``embed`` and a ``trace`` through given source embeddings (B, T_x, E), optionally with the
    attention detached (gradient importance, Jain & Wallace 2019 §3)."""

    def embed(self, src: Tensor) -> Tensor: ...

    def trace(
        self,
        src: Tensor,
        src_lengths: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor | None = None,
        embedded: Tensor | None = None,
        detach_attention: bool = False,
    ) -> Any: ...


@runtime_checkable
class PrefixGradients(Protocol):
    """``embed_target(tgt_in) -> (B, T_y, E)``, the embeddings of each step's input token
    (BOS + the prefix), and ``trace(…, embedded_target=…)`` through them (and through given
    source embeddings): the two inputs a prediction is attributed to (source vs prefix, Voita et
    al. 2021, "Analyzing the Source and Target Contributions to Predictions in NMT")."""

    def embed(self, src: Tensor) -> Tensor: ...

    def embed_target(self, tgt_in: Tensor) -> Tensor: ...

    def trace(
        self,
        src: Tensor,
        src_lengths: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor | None = None,
        embedded: Tensor | None = None,
        detach_attention: bool = False,
        embedded_target: Tensor | None = None,
    ) -> Any: ...


@runtime_checkable
class ValueVectors(Protocol):
    """``value_vectors(trace)``: f(x_j) per head, (B, H, T_x, d), such that the context of step t is
    Σ_h Σ_j α_thj f_h(x_j) (Kobayashi et al. 2020, eq. 4)."""

    def value_vectors(self, trace: Any) -> Tensor: ...


@runtime_checkable
class EncoderSelfAttention(Protocol):
    """``encoder_attention(trace)``: the encoder's self-attention, (B, L_enc, H, T_x, T_x), rows over
    source positions (attention rollout, Abnar & Zuidema 2020)."""

    def encoder_attention(self, trace: Any) -> Tensor: ...


def capabilities(model: Any) -> set[str]:
    """The capabilities of :data:`~attnstudy.analysis.catalogue.CAPABILITIES` a model has."""
    out = set()
    has_attention = bool(getattr(model, "has_attention", False))
    if has_attention:
        out.add("attention")
        if isinstance(model, LocallyIntervenable):
            out.add("local")
        if isinstance(model, GloballyIntervenable):
            out.add("global")
    if isinstance(model, InputGradients):
        out.add("gradients")
    if isinstance(model, PrefixGradients):
        out.add("prefix_gradients")
    if has_attention and isinstance(model, ValueVectors):
        out.add("values")
    if has_attention and isinstance(model, EncoderSelfAttention):
        out.add("self_attention")
    return out
