"""What the attention lessons ask for: multi-head Luong attention (one head is ``general``) and
keys untied from values with d_k ≠ d_v (the query/key/value lesson's d_k = 3, d_v = 7)."""

from __future__ import annotations

import pytest
import torch

from attnstudy.config import ConfigError, ModelConfig
from attnstudy.experiment import parse_experiment
from attnstudy.models import build_model
from attnstudy.models.attention import (
    GeneralAttention,
    MultiHeadAttention,
    MultiHeadGeneralAttention,
)


def states(seed=0, b=2, t_x=5, d_k=6):
    g = torch.Generator().manual_seed(seed)
    enc = torch.randn(b, t_x, d_k, generator=g)
    pad = torch.tensor([[False] * t_x, [False] * 3 + [True] * (t_x - 3)])
    return enc, pad


def test_one_head_of_multihead_general_is_general():
    torch.manual_seed(0)
    general = GeneralAttention(8, 6)
    mh = MultiHeadGeneralAttention(8, 6, heads=1)
    with torch.no_grad():
        mh.key_proj.copy_(general.key_proj.weight[None])  # W_1 = W
    enc, pad = states()
    q = torch.randn(2, 3, 8)
    a, b = general.memory(enc, pad), mh.memory(enc, pad)
    assert (general.scores(q, a) - mh.scores(q, b)).abs().max() <= 1e-6
    w = general.weights(q, a)
    assert (w - mh.weights(q, b)).abs().max() <= 1e-6
    assert (general.context(w, a) - mh.context(w, b)).abs().max() <= 1e-6


def test_multihead_general_scores_each_head_on_its_own_groups():
    """Head h sees only its group of the query and of the key: changing the other half of the
    key moves head 0's scores not at all and head 1's."""
    torch.manual_seed(1)
    mh = MultiHeadGeneralAttention(8, 6, heads=2)
    enc, pad = states()
    q = torch.randn(2, 3, 8)
    base = mh.scores(q, mh.memory(enc, pad))
    moved = enc.clone()
    moved[..., 3:] += 1.0  # head 1's group of every key
    other = mh.scores(q, mh.memory(moved, pad))
    assert torch.equal(base[:, 0], other[:, 0]) and (base[:, 1] - other[:, 1]).abs().max() > 1e-3
    # per head by hand: q_h^T W_h k_h
    h = 1
    by_hand = torch.einsum(
        "btq,qk,bxk->btx", q[..., 4:], mh.key_proj[h], enc[..., 3:]
    )  # (B, T_q, T_x)
    assert (base[:, h] - by_hand).abs().max() <= 1e-5
    assert mh.context(torch.softmax(base, -1), mh.memory(enc, pad)).shape == (2, 3, 6)


def test_values_never_move_the_attention_map_and_keys_do():
    torch.manual_seed(2)
    att = MultiHeadAttention(8, 6, attention_dim=8, heads=2, key_dim=3, value_dim=7)
    enc, pad = states()
    q = torch.randn(2, 4, 8)
    w = att.weights(q, att.memory(enc, pad))
    with torch.no_grad():
        att.v_proj.weight.normal_()
    assert torch.equal(att.weights(q, att.memory(enc, pad)), w)  # bit-identical
    with torch.no_grad():
        att.k_proj.weight.normal_()
    assert (att.weights(q, att.memory(enc, pad)) - w).abs().max() > 1e-3
    # the output size follows d_v: H · d_v = 14, keys (B, H, T_x, 3), values (B, H, T_x, 7)
    mem = att.memory(enc, pad)
    assert mem.keys.shape == (2, 2, 5, 3) and mem.values.shape == (2, 2, 5, 7)
    assert att.context(w, mem).shape == (2, 4, 14) and att.context_size == 14


def test_untied_sizes_through_the_config_and_a_whole_model():
    cfg = ModelConfig(
        attention="multihead",
        heads=2,
        attention_key_dim=3,
        attention_value_dim=7,
        embedding_dim=4,
        encoder_hidden=3,
        decoder_hidden=5,
    )
    model = build_model(cfg, 9, 9).eval()
    src = torch.tensor([[4, 5, 6]])
    tr = model.trace(src, torch.tensor([3]), torch.tensor([[1, 4, 5]]))
    assert tr.attention.shape == (1, 2, 3, 3) and model.attention.context_size == 14
    got = model.logits_given_attention(tr, tr.attention)
    assert (got - tr.logits).abs().max() <= 1e-5
    with pytest.raises(ConfigError, match="attention_key_dim applies to the scaled_dot and"):
        parse_experiment({"models": [{"model": {"attention": "additive", "attention_key_dim": 3}}]})


def test_multihead_general_needs_divisible_sizes():
    with pytest.raises(ConfigError, match="decoder_hidden .* divisible by heads"):
        parse_experiment(
            {"models": [{"model": {"attention": "multihead_general", "heads": 3}}]},
        )
