"""Erasure (Serrano & Smith 2019) on a hand-made readout whose answers are computed by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from analysis_testkit import VOCAB, LinearReadout, call, hand_batch, one_batch, sharpen, tiny_model
from attnstudy.analysis.ablations.erase_until_flip import (
    attention_gradient,
)
from attnstudy.analysis.batch import step_generator
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.errors import NoAttentionError

A, B = 4, 5  # token ids


def _readout() -> LinearReadout:
    """logits = 10 · α @ M: position 3 votes 10 for A; positions 0–2 vote 1 for B."""
    m = torch.zeros(4, len(VOCAB))
    m[3, A] = 10.0
    m[0:3, B] = 1.0
    return LinearReadout(m, scale=10.0)


def _batch():
    att = torch.tensor(
        [
            [
                0.4,
                0.3,
                0.2,
                0.1,
            ],  # A = 10, B = 9 → predicts A; flips exactly when position 3 is erased
            [0.7, 0.3, 0.0, 0.0],  # 2 valid: predicts B, erasing one item never flips
            [1.0, 0.0, 0.0, 0.0],  # 1 valid: skipped
        ]
    ).view(3, 1, 1, 4)
    return hand_batch(att, [4, 2, 1])


CFG = AblationConfig(n_random_orders=4, seed=7)


def test_erase_until_flip_by_hand():
    out = call("erase_until_flip", _readout(), _batch(), CFG).set_index("example_id")
    r0 = out.loc["h/0"]
    # attention ↓ erases 0, 1, 2 and never reaches position 3 (n_valid − 1 = 3 items at most)
    assert r0["erase_attn_desc_never_flipped"] == 1.0 and math.isnan(
        r0["erase_attn_desc_frac_positions"]
    )
    # attention ↑, gradient ↓ and gradient × attention ↓ all erase position 3 first
    for r in ("attn_asc", "grad_desc", "grad_attn_desc"):
        assert r0[f"erase_{r}_never_flipped"] == 0.0
        assert r0[f"erase_{r}_frac_positions"] == pytest.approx(0.25)
        assert r0[f"erase_{r}_frac_mass"] == pytest.approx(0.1)
    # random: flips when position 3 is erased, if it is not last
    fracs, masses, never = [], [], []
    for i in range(CFG.params_for("erase_until_flip").n_random_orders):
        order = torch.randperm(
            4, generator=step_generator(CFG.seed, "h/0", 0, f"erase_random/{i}")
        ).tolist()
        rank = order.index(3)
        if rank == 3:
            never.append(1.0)
            continue
        never.append(0.0)
        fracs.append((rank + 1) / 4)
        masses.append(sum([0.4, 0.3, 0.2, 0.1][j] for j in order[: rank + 1]))
    assert r0["erase_random_never_flipped"] == pytest.approx(sum(never) / len(never))
    if fracs:
        assert r0["erase_random_frac_positions"] == pytest.approx(sum(fracs) / len(fracs))
        assert r0["erase_random_frac_mass"] == pytest.approx(sum(masses) / len(masses))
    r1 = out.loc["h/1"]
    for r in ("attn_desc", "attn_asc", "random", "grad_desc", "grad_attn_desc"):
        assert r1[f"erase_{r}_never_flipped"] == 1.0 and math.isnan(r1[f"erase_{r}_frac_positions"])
    r2 = out.loc["h/2"]
    assert r2["erase_until_flip_skipped"] and math.isnan(r2["erase_attn_desc_never_flipped"])


def test_attention_gradient_by_hand():
    model, batch = _readout(), _batch()
    pred = torch.tensor([[A], [B], [B]])
    g = attention_gradient(model, batch.trace, pred)[0, 0, 0]
    # d log p_A / d α_j = 10 (M[j, A] − Σ_v p_v M[j, v]) with p over the 9-token vocabulary
    logits = torch.zeros(len(VOCAB))
    logits[A], logits[B] = 10.0, 9.0
    p = torch.softmax(logits, -1)
    m = model.readout
    expected = 10 * (m[:, A] - (m * p).sum(-1))
    torch.testing.assert_close(g, expected)


def test_erase_max_by_hand():
    out = call("erase_max", _readout(), _batch(), CFG).set_index("example_id")

    # row 0 without position 0: α = (.3, .2, .1)/.6 → A = 100·(1/6), B = 10·(5/6)
    def probs(a, b):
        logits = torch.zeros(len(VOCAB))
        logits[A], logits[B] = a, b
        return torch.softmax(logits, -1)

    expected = 0.5 * (probs(10.0, 9.0) - probs(100 / 6, 50 / 6)).abs().sum()
    assert out.loc["h/0", "erase_max_tvd"] == pytest.approx(float(expected), abs=1e-6)
    assert out.loc["h/0", "erase_max_flip"] == 0.0
    # row 1: erase 0.7 → all on position 1 → still B; same B vote, so p unchanged
    assert out.loc["h/1", "erase_max_tvd"] == pytest.approx(0.0, abs=1e-6)
    assert out.loc["h/2", "erase_max_skipped"] and math.isnan(out.loc["h/2", "erase_max_tvd"])


def test_erase_until_flip_batch_independent_and_seeded(examples):
    model = sharpen(tiny_model("multihead", "luong"))
    cfg = AblationConfig(n_random_orders=3, seed=1)
    whole = call("erase_until_flip", model, one_batch(model, examples), cfg)
    parts = pd.concat(
        [call("erase_until_flip", model, one_batch(model, [ex]), cfg) for ex in examples],
        ignore_index=True,
    )
    pd.testing.assert_frame_equal(whole, parts, atol=1e-6, rtol=0)
    assert (whole["erase_attn_desc_never_flipped"] == 0).any()  # some steps do flip
    done = whole[~whole["erase_until_flip_skipped"]]
    assert done["erase_attn_desc_frac_positions"].dropna().between(0, 1).all()
    assert done["erase_attn_desc_frac_mass"].dropna().between(0, 1).all()


def test_none_model_raises(examples):
    model = tiny_model("none")
    with pytest.raises(NoAttentionError):
        call("erase_until_flip", model, one_batch(model, examples), CFG)
