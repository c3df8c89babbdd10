"""Attention score functions: one small class per score, one registry keyed by config name.

Shapes (glossary):
    B   batch size
    H   attention heads (1 for single-head scores)
    T_q number of queries (decoder steps computed at once)
    T_x source length (padded)
    d_q query size (decoder state), d_k key size (encoder state)

Every score precomputes what depends only on the encoder once per batch
(:meth:`Attention.memory`, like JoeyNMT's ``compute_proj_keys``); each decoder step only
projects its query. Weights always carry a head axis: ``(B, H, T_q, T_x)``. Padding gets
exactly zero weight (:func:`masked_softmax`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class Memory:
    """Encoder-side tensors, computed once per batch.

    Attributes:
        keys: projected keys; shape depends on the score (see each class).
        values: shape (B, H, T_x, d_v).
        pad_mask: bool, shape (B, T_x), True at padding.
    """

    keys: Tensor | None
    values: Tensor
    pad_mask: Tensor

    def index_select(self, index: Tensor) -> Memory:
        """Rows of the batch, e.g. for beam search. ``index``: long, shape (N,)."""
        keys = None if self.keys is None else self.keys.index_select(0, index)
        return Memory(
            keys, self.values.index_select(0, index), self.pad_mask.index_select(0, index)
        )


def masked_softmax(scores: Tensor, pad_mask: Tensor) -> Tensor:
    """Softmax over the last axis that gives exactly 0 at padding.

    Args:
        scores: shape (B, H, T_q, T_x).
        pad_mask: bool, shape (B, T_x), True at padding. Every row needs one valid position.

    Returns:
        Weights, shape (B, H, T_q, T_x), rows summing to 1, 0.0 exactly where ``pad_mask``.
    """
    scores = scores.masked_fill(pad_mask[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1)


class Attention(nn.Module):
    """Base class. Subclasses define :meth:`memory` and :meth:`scores`.

    Attributes:
        heads: number of heads H.
        context_size: size of the context vector returned by :meth:`context`.
    """

    heads: int = 1
    context_size: int

    def __init__(self, query_size: int, key_size: int):
        super().__init__()
        self.query_size = query_size
        self.key_size = key_size
        self.context_size = key_size

    def memory(self, encoder_states: Tensor, pad_mask: Tensor) -> Memory:
        """Precompute keys and values. ``encoder_states``: (B, T_x, d_k); ``pad_mask``: (B, T_x)."""
        return Memory(encoder_states, encoder_states.unsqueeze(1), pad_mask)

    def scores(self, query: Tensor, memory: Memory) -> Tensor:
        """Unnormalised scores. ``query``: (B, T_q, d_q). Returns (B, H, T_q, T_x)."""
        raise NotImplementedError

    def weights(self, query: Tensor, memory: Memory) -> Tensor:
        """Attention weights, (B, H, T_q, T_x); exactly 0 at padding."""
        if query.dim() != 3 or query.size(-1) != self.query_size:
            raise ValueError(f"query must be (B, T_q, {self.query_size}), got {tuple(query.shape)}")
        return masked_softmax(self.scores(query, memory), memory.pad_mask)

    def context(self, weights: Tensor, memory: Memory) -> Tensor:
        """Context vectors c = Σ_j α_j v_j, heads concatenated.

        Args:
            weights: shape (B, H, T_q, T_x).
            memory: values of shape (B, H, T_x, d_v).

        Returns:
            shape (B, T_q, context_size).
        """
        ctx = torch.matmul(weights, memory.values)  # (B, H, T_q, d_v)
        b, h, t, d = ctx.shape
        return ctx.transpose(1, 2).reshape(b, t, h * d)


class AdditiveAttention(Attention):
    r"""Bahdanau et al. (2014), eq. (6): :math:`e_{tj} = v^\top \tanh(W q_t + U k_j)`.

    ``memory.keys`` holds :math:`U k_j`, shape (B, T_x, attention_dim).
    """

    def __init__(self, query_size: int, key_size: int, attention_dim: int):
        super().__init__(query_size, key_size)
        self.query_proj = nn.Linear(query_size, attention_dim, bias=False)
        self.key_proj = nn.Linear(key_size, attention_dim, bias=False)
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def memory(self, encoder_states: Tensor, pad_mask: Tensor) -> Memory:
        return Memory(self.key_proj(encoder_states), encoder_states.unsqueeze(1), pad_mask)

    def scores(self, query: Tensor, memory: Memory) -> Tensor:
        hidden = torch.tanh(
            self.query_proj(query).unsqueeze(2) + memory.keys.unsqueeze(1)
        )  # (B,T_q,T_x,A)
        return self.v(hidden).squeeze(-1).unsqueeze(1)


class DotAttention(Attention):
    r"""Luong et al. (2015), eq. (8) "dot": :math:`e_{tj} = q_t^\top k_j` (needs d_q = d_k)."""

    def scores(self, query: Tensor, memory: Memory) -> Tensor:
        return torch.matmul(query, memory.keys.transpose(1, 2)).unsqueeze(1)


class GeneralAttention(Attention):
    r"""Luong et al. (2015), eq. (8) "general": :math:`e_{tj} = q_t^\top W k_j`.

    ``memory.keys`` holds :math:`W k_j`, shape (B, T_x, d_q).
    """

    def __init__(self, query_size: int, key_size: int):
        super().__init__(query_size, key_size)
        self.key_proj = nn.Linear(key_size, query_size, bias=False)

    def memory(self, encoder_states: Tensor, pad_mask: Tensor) -> Memory:
        return Memory(self.key_proj(encoder_states), encoder_states.unsqueeze(1), pad_mask)

    def scores(self, query: Tensor, memory: Memory) -> Tensor:
        return torch.matmul(query, memory.keys.transpose(1, 2)).unsqueeze(1)


class ConcatAttention(Attention):
    r"""Luong et al. (2015), eq. (8) "concat": :math:`e_{tj} = v^\top \tanh(W [q_t; k_j])`.

    One matrix W over the concatenation; its key half is applied once per batch.
    """

    def __init__(self, query_size: int, key_size: int, attention_dim: int):
        super().__init__(query_size, key_size)
        self.proj = nn.Linear(query_size + key_size, attention_dim)
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def memory(self, encoder_states: Tensor, pad_mask: Tensor) -> Memory:
        w_k = self.proj.weight[:, self.query_size :]
        return Memory(
            encoder_states @ w_k.T + self.proj.bias, encoder_states.unsqueeze(1), pad_mask
        )

    def scores(self, query: Tensor, memory: Memory) -> Tensor:
        q = query @ self.proj.weight[:, : self.query_size].T
        hidden = torch.tanh(q.unsqueeze(2) + memory.keys.unsqueeze(1))
        return self.v(hidden).squeeze(-1).unsqueeze(1)


class MultiHeadAttention(Attention):
    r"""Vaswani et al. (2017), eq. (1)–(2): scaled dot-product attention with h heads,

    :math:`\mathrm{head}_i = \mathrm{softmax}(Q W_i^Q (K W_i^K)^\top / \sqrt{d_k}) V W_i^V`,
    context :math:`= [\mathrm{head}_1; …; \mathrm{head}_h] W^O` (no W^O when h = 1, the
    ``scaled_dot`` score). Queries and keys have d_k per head, values d_v per head (untied: the
    query/key/value lesson's d_k = 3, d_v = 7); both default to ``attention_dim // heads``.
    ``memory.keys``: (B, H, T_x, d_k); values (B, H, T_x, d_v); the context has H·d_v entries.
    """

    def __init__(
        self,
        query_size: int,
        key_size: int,
        attention_dim: int,
        heads: int = 1,
        key_dim: int | None = None,
        value_dim: int | None = None,
    ):
        super().__init__(query_size, key_size)
        if (key_dim is None or value_dim is None) and attention_dim % heads:
            raise ValueError(f"attention_dim {attention_dim} is not divisible by heads {heads}")
        self.heads = heads
        self.d_k = key_dim or attention_dim // heads
        self.d_v = value_dim or attention_dim // heads
        self.q_proj = nn.Linear(query_size, heads * self.d_k, bias=False)
        self.k_proj = nn.Linear(key_size, heads * self.d_k, bias=False)
        self.v_proj = nn.Linear(key_size, heads * self.d_v, bias=False)
        out = heads * self.d_v
        self.out_proj = nn.Linear(out, out, bias=False) if heads > 1 else None
        self.context_size = out

    def _split(self, x: Tensor) -> Tensor:  # (B, T, H·d) -> (B, H, T, d)
        b, t, _ = x.shape
        return x.view(b, t, self.heads, -1).transpose(1, 2)

    def memory(self, encoder_states: Tensor, pad_mask: Tensor) -> Memory:
        return Memory(
            self._split(self.k_proj(encoder_states)),
            self._split(self.v_proj(encoder_states)),
            pad_mask,
        )

    def scores(self, query: Tensor, memory: Memory) -> Tensor:
        q = self._split(self.q_proj(query))
        return torch.matmul(q, memory.keys.transpose(-1, -2)) / math.sqrt(self.d_k)

    def context(self, weights: Tensor, memory: Memory) -> Tensor:
        ctx = super().context(weights, memory)
        return self.out_proj(ctx) if self.out_proj is not None else ctx


class MultiHeadGeneralAttention(Attention):
    r"""Luong's ``general`` score per head (the multi-head exercise of the Bahdanau/Luong lesson):
    the query q_t and each key k_j are split into H equal groups, head h scores
    :math:`e_{thj} = q_{t,h}^\top W_h k_{j,h}` (:math:`W_h`: (d_q/H) × (d_k/H)), and its context is
    :math:`\sum_j α_{thj} k_{j,h}`; the heads' contexts are concatenated (d_k in all). With one
    head this is exactly ``general`` (W_1 = W).

    ``memory.keys``: (B, H, T_x, d_q/H) = W_h k_{j,h}; values (B, H, T_x, d_k/H).
    """

    def __init__(self, query_size: int, key_size: int, heads: int):
        super().__init__(query_size, key_size)
        if query_size % heads or key_size % heads:
            raise ValueError(
                f"multihead_general needs the query size ({query_size}) and the key size "
                f"({key_size}) divisible by heads ({heads})"
            )
        self.heads = heads
        self.key_proj = nn.Parameter(
            # built on the CPU like every parameter; the model moves with Module.to(device)
            torch.empty(heads, query_size // heads, key_size // heads, device="cpu").uniform_(
                -1 / math.sqrt(key_size // heads), 1 / math.sqrt(key_size // heads)
            )
        )

    def _split(self, x: Tensor) -> Tensor:  # (B, T, H·d) -> (B, H, T, d)
        b, t, _ = x.shape
        return x.view(b, t, self.heads, -1).transpose(1, 2)

    def memory(self, encoder_states: Tensor, pad_mask: Tensor) -> Memory:
        values = self._split(encoder_states)  # (B, H, T_x, d_k/H)
        keys = torch.einsum("bhxk,hqk->bhxq", values, self.key_proj)
        return Memory(keys, values, pad_mask)

    def scores(self, query: Tensor, memory: Memory) -> Tensor:
        return torch.matmul(self._split(query), memory.keys.transpose(-1, -2))


class UniformAttention(Attention):
    """Baseline: fixed weights 1/T_x over valid positions (Wiegreffe & Pinter 2019, §3)."""

    def scores(self, query: Tensor, memory: Memory) -> Tensor:
        b, t = query.shape[:2]
        return query.new_zeros(b, 1, t, memory.pad_mask.size(1))


@dataclass(frozen=True)
class Score:
    """An attention score's registry entry: how it is built and which model settings it reads.

    ``uses`` and ``heads`` are literals in :data:`ATTENTIONS`: the config reads them from this
    file's source without importing it (:data:`attnstudy.config.models.SCORE_FIELDS`; config
    validation stays torch-free), so a score with its own size or heads needs no edit there.

    Attributes:
        build: ``fn(query_size, key_size, model_config) -> Attention | None``.
        uses: the recurrent model's fields it reads beyond the core (``attention_dim``,
            ``heads``, ``attention_key_dim``, ``attention_value_dim``): they enter the model key
            and may be set; another of those fields, set, is refused as unused.
        heads: the field giving its number of heads (``ModelConfig.n_heads``); None: one head.
    """

    build: Callable[..., Attention | None]
    uses: tuple[str, ...] = ()
    heads: str | None = None

    def __call__(self, query_size: int, key_size: int, cfg) -> Attention | None:
        return self.build(query_size, key_size, cfg)


ATTENTIONS: dict[str, Score] = {
    "additive": Score(
        lambda q, k, cfg: AdditiveAttention(q, k, cfg.attention_dim), uses=("attention_dim",)
    ),
    "dot": Score(lambda q, k, cfg: DotAttention(q, k)),
    "general": Score(lambda q, k, cfg: GeneralAttention(q, k)),
    "concat": Score(
        lambda q, k, cfg: ConcatAttention(q, k, cfg.attention_dim), uses=("attention_dim",)
    ),
    "scaled_dot": Score(
        lambda q, k, cfg: MultiHeadAttention(
            q, k, cfg.attention_dim, 1, cfg.attention_key_dim, cfg.attention_value_dim
        ),
        uses=("attention_dim", "attention_key_dim", "attention_value_dim"),
    ),
    "multihead": Score(
        lambda q, k, cfg: MultiHeadAttention(
            q, k, cfg.attention_dim, cfg.heads, cfg.attention_key_dim, cfg.attention_value_dim
        ),
        uses=("attention_dim", "heads", "attention_key_dim", "attention_value_dim"),
        heads="heads",
    ),
    "multihead_general": Score(
        lambda q, k, cfg: MultiHeadGeneralAttention(q, k, cfg.heads),
        uses=("heads",),
        heads="heads",
    ),
    "uniform": Score(lambda q, k, cfg: UniformAttention(q, k)),
    "none": Score(lambda q, k, cfg: None),
}
"""Registry: config name → :class:`Score` (called as ``fn(query_size, key_size, model_config)
-> Attention | None``)."""


def register_attention(name: str, score: Score, overwrite: bool = False) -> Score:
    """Add an attention score from your own code (a test, a notebook): the recurrent config
    accepts ``attention = name`` and keys it by the fields the score ``uses``.

    Raises:
        ValueError: the name is taken (unless ``overwrite``) or is not a lower-case identifier.
    """
    from attnstudy.config.models import register_score_fields

    if name in ATTENTIONS and not overwrite:
        raise ValueError(f"an attention score named {name!r} is already registered")
    register_score_fields(name, score.uses, score.heads, overwrite=overwrite)
    ATTENTIONS[name] = score
    return score


def unregister_attention(name: str) -> None:
    """Remove a score added with :func:`register_attention` (a built-in one stays)."""
    from attnstudy.config.models import ATTENTIONS as BUILT_IN
    from attnstudy.config.models import unregister_score_fields

    if name in BUILT_IN:
        return
    ATTENTIONS.pop(name, None)
    unregister_score_fields(name)
