"""Erasure (Serrano & Smith 2019) on a hand-made readout whose answers are computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_testkit import VOCAB, LinearReadout, call, hand_batch, one_batch, sharpen, tiny_model
from attnstudy.analysis import interventions, random_streams
from attnstudy.analysis.ablations import erase_until_flip as eflip
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


def _random_order(rng: str, seed: int, example_id: str, step: int, i: int, n: int, k: int):
    """Random erasure order i of a step's k valid items, drawn by hand: the stable argsort of
    words i·k … i·k + k − 1 of the step's "erase_random" Philox stream (counter-1), or
    ``torch.randperm`` from the legacy generator of "erase_random/i"."""
    if rng == "legacy":
        return torch.randperm(
            k, generator=step_generator(seed, example_id, step, f"erase_random/{i}")
        ).tolist()
    key = random_streams.stream_key(seed, example_id, step, "erase_random")
    words = random_streams.words(np.array([key], np.uint64), n * k)[0].reshape(n, k)
    return np.argsort(words[i], kind="stable").tolist()


@pytest.mark.parametrize("rng", ["counter-1", "legacy"])
def test_erase_until_flip_by_hand(rng):
    cfg = CFG.model_copy(update={"rng": rng})
    out = call("erase_until_flip", _readout(), _batch(), cfg).set_index("example_id")
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
    n = CFG.params_for("erase_until_flip").n_random_orders
    for i in range(n):
        order = _random_order(rng, CFG.seed, "h/0", 0, i, n, 4)
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


def _erase_models():
    return {
        "bahdanau": sharpen(tiny_model("additive", "bahdanau")),
        "luong": sharpen(tiny_model("multihead", "luong")),
        "transformer": sharpen(tiny_model("multihead", "transformer")),
    }


@pytest.mark.parametrize("rng", ["counter-1", "legacy"])
@pytest.mark.parametrize("flow", ["luong", "transformer"])
def test_random_orders_are_the_per_step_loops(examples, flow, rng):
    model = _erase_models()[flow]
    tr = one_batch(model, examples).trace
    valid = ~tr.pad_mask
    assert not bool(valid.all()) and bool((valid.sum(-1) < 2).any())  # padding, a 1-item source
    ids = [ex.id for ex in examples]
    fast = eflip.random_orders(valid, tr.step_mask, ids, seed=11, n=3, rng=rng)
    slow = eflip.random_orders_loop(valid, tr.step_mask, ids, seed=11, n=3, rng=rng)
    assert len(fast) == len(slow) == 3
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
    # each real step's order: its valid positions (drawn), then its padding in order
    b, t = tr.step_mask.nonzero()[0].tolist()
    nv = int(valid[b].sum())
    row = fast[0][b, t]
    assert sorted(row[:nv].tolist()) == valid[b].nonzero()[:, 0].tolist()
    assert row[nv:].tolist() == (~valid[b]).nonzero()[:, 0].tolist()
    drawn = torch.tensor(_random_order(rng, 11, ids[b], t, 0, 3, nv))
    assert row[:nv].tolist() == valid[b].nonzero()[:, 0][drawn].tolist()
    assert not torch.equal(fast[0], fast[1])  # the orders differ


@pytest.mark.parametrize("rng", ["counter-1", "legacy"])
def test_random_orders_with_padding_inside_the_source(rng):
    valid = torch.tensor([[True, False, True, True, False], [False, True, True, False, True]])
    steps = torch.tensor([[True, True, False], [True, False, False]])
    fast = eflip.random_orders(valid, steps, ["a", "b"], seed=2, n=4, rng=rng)
    slow = eflip.random_orders_loop(valid, steps, ["a", "b"], seed=2, n=4, rng=rng)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)
    assert fast[0][0, 0, 3:].tolist() == [1, 4] and fast[0][1, 0, 3:].tolist() == [0, 3]
    assert fast[0][0, 2].tolist() == [0, 1, 2, 3, 4]  # not a real step


@pytest.mark.parametrize("budget", [None, 2_000])
@pytest.mark.parametrize("flow", ["bahdanau", "luong", "transformer"])
def test_one_pass_over_all_orders_is_bit_identical(examples, monkeypatch, flow, budget):
    """run's table with every order in one erase_until_flip pass and the random orders drawn at
    once equals, bit for bit, the table of one pass per order with the per-step random loop
    (a small element budget cuts examples into windows of steps)."""
    import attnstudy.analysis._chunks as chunks

    if budget is not None:
        monkeypatch.setattr(chunks, "ELEMENT_BUDGET", budget)
    model = _erase_models()[flow]
    batch = one_batch(model, examples)
    cfg = AblationConfig(n_random_orders=5, seed=3)
    new = call("erase_until_flip", model, batch, cfg)
    one_pass = eflip.erase_until_flip

    def per_order(model, trace, order, pred, steps, chunk_rows=4096):
        assert order.dim() == 4 and order.size(0) == 4 + 5  # run hands over all orders at once
        return torch.stack([one_pass(model, trace, o, pred, steps, chunk_rows) for o in order])

    monkeypatch.setattr(eflip, "erase_until_flip", per_order)
    monkeypatch.setattr(eflip, "random_orders", eflip.random_orders_loop)
    old = call("erase_until_flip", model, batch, cfg)
    pd.testing.assert_frame_equal(new, old, check_exact=True)
    assert (new["erase_attn_desc_never_flipped"] == 0).any()  # some steps do flip
    assert new["erase_random_frac_positions"].notna().any()


def _renormalise_four_passes(weights):
    """renormalise as it was (divide, zeros, where): the reference of the two-pass version."""
    total = weights.sum(-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    return torch.where(total > 0, weights / safe, torch.zeros_like(weights)), total[..., 0] <= 0


def test_erase_ranked_rows_are_those_of_the_four_pass_renormalise():
    g = torch.Generator().manual_seed(0)
    att = torch.softmax(torch.randn(3, 2, 4, 6, generator=g) * 3, -1)  # (B, H, T_y, T_x)
    att[1, :, :, 4:] = 0.0  # padding
    att[2, 0, 1] = float("nan")
    order = torch.argsort(torch.rand(3, 4, 6, generator=g), -1)
    k = torch.arange(1, 7).view(1, 6, 1, 1)  # up to erasing every position: empty rows
    weights = att.unsqueeze(1).expand(3, 6, 2, 4, 6)
    got = interventions.erase_ranked(weights, order[:, None, None], k)
    erased = interventions.ranks_of(order[:, None, None]) < k.unsqueeze(-1)
    want, empty = _renormalise_four_passes(weights.masked_fill(erased, 0.0))
    assert torch.equal(got.weights, want) and torch.equal(got.empty, empty)
    assert bool(got.empty.any()) and not bool(got.empty.all())
    assert not bool(got.weights.isnan().any())  # the NaN row is zeroed, as before
    assert not bool(got.empty[2, 0, 0, 1])  # ... and not flagged empty (NaN <= 0), as before
    assert torch.equal(got.weights.signbit(), want.signbit())  # no −0 where there was +0
