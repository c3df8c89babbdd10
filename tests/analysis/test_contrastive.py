"""Contrastive questions (Yin & Neubig 2022): the foil, the contrastive gradient as the difference of
two plain gradients, and interventions that move the argmax to the foil."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from analysis_testkit import (
    VOCAB,
    LinearReadout,
    call,
    hand_batch,
    make_examples,
    one_batch,
    sharpen,
    tiny_model,
)
from attnstudy.analysis.ablations.contrastive import contrastive_gradient, foils, to_foil
from attnstudy.analysis.attribution import gradient_scores
from attnstudy.analysis.batch import AblationContext
from attnstudy.analysis.catalogue import AblationConfig


def test_the_runner_up_is_the_most_probable_other_token_and_a_named_foil_is_checked():
    probs = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]]])
    target = torch.tensor([[0, 2]])  # step 1: the emitted token is not the argmax
    assert foils(probs, target, "runner_up", VOCAB).tolist() == [[1, 1]]
    name = VOCAB.itos[2]
    assert foils(probs, target, name, VOCAB).tolist() == [[2, -1]]  # no foil where y_t is it
    with pytest.raises(ValueError, match="not a token of the target vocabulary"):
        foils(probs, target, "no-such-token", VOCAB)


def test_the_contrastive_gradient_is_the_difference_of_the_plain_gradients():
    model = sharpen(tiny_model())
    batch = one_batch(model, make_examples(), prefix="greedy")
    tr = batch.trace
    foil = torch.softmax(tr.logits, -1).scatter(-1, tr.tgt_out[..., None], -1.0).argmax(-1)
    got = contrastive_gradient(model, batch, foil)
    plain = gradient_scores(model, batch)["input_x_gradient"]
    of_foil = gradient_scores(model, dataclasses.replace(tr, tgt_out=foil))["input_x_gradient"]
    np.testing.assert_allclose(got.numpy(), (plain - of_foil).numpy(), atol=1e-5, equal_nan=True)


def test_each_step_reports_its_foil_and_moving_to_the_foil_is_a_flip():
    model = sharpen(tiny_model("multihead", "luong"), scale=6.0)  # its permutations flip
    batch = one_batch(model, make_examples(), prefix="greedy")
    cfg = AblationConfig(ablations=["contrastive"], contrastive={"n": 8})
    out = call("contrastive", model, batch, cfg)
    real = out[~out["contrastive_skipped"]]
    # the runner-up is the best other token: below y_t wherever y_t is the argmax (not at a
    # forced <eos> step of a prefix cut at the length limit)
    assert (real["contrastive_foil"] >= 0).all() and real["contrastive_log_odds"].notna().all()
    assert (real["contrastive_log_odds"] > 0).mean() > 0.5
    for name in ("uniform", "erase_max", "permutation"):
        to_foil, flip = real[f"contrastive_{name}_to_foil"], real[f"contrastive_{name}_flip"]
        assert (to_foil <= flip + 1e-12).all()  # moving to the foil changes the token
    # the permutations are the permutation ablation's (same seed and stream): the same flips
    perm = call("permutation", model, batch, AblationConfig(permutation={"n": 8}))
    merged = real.merge(perm, on=["example_id", "step"])
    np.testing.assert_allclose(
        merged["contrastive_permutation_flip"], merged["permutation_flip_rate"], atol=1e-12
    )
    assert merged["permutation_flip_rate"].sum() > 1  # not vacuous
    assert real["contrastive_tau_plain"].notna().any()


def test_uniform_and_erase_max_move_the_argmax_to_the_runner_up_by_construction():
    """Logits 10 · (α_t @ M): source 0 votes for token A, source 1 for B (weight 1.2), source 2 for
    C. α_0 = (0.8, 0.15, 0.05) emits A with runner-up B; uniform attention gives B 0.4 > A 0.33,
    erasing 0.8 leaves (0, 0.75, 0.25): B again. Both flip, and to the foil."""
    a, b, c = 4, 5, 6
    readout = torch.zeros(3, len(VOCAB))
    readout[0, a], readout[1, b], readout[2, c] = 1.0, 1.2, 1.0
    model = LinearReadout(readout)
    rows = torch.tensor([[0.8, 0.15, 0.05], [0.8, 0.15, 0.05]])
    batch = hand_batch(rows.view(1, 1, 2, 3), [3])
    tr = batch.trace
    base = torch.softmax(model.logits_given_attention(tr, tr.attention), -1)
    foil = foils(base, torch.full_like(tr.tgt_out, a), "runner_up", VOCAB)
    assert foil[0, 0] == b
    ok = torch.tensor([[True, False]])
    cols = to_foil(model, batch, base, foil, ok, 6, AblationContext())
    for name in ("uniform", "erase_max"):
        assert cols[f"contrastive_{name}_flip"][0, 0] == 1.0
        assert cols[f"contrastive_{name}_to_foil"][0, 0] == 1.0
        assert torch.isnan(cols[f"contrastive_{name}_to_foil"][0, 1])
    # a permutation flips exactly when it moves 0.8 off source 0; to B when it lands on source 1
    flip, foil_share = (
        cols["contrastive_permutation_flip"][0, 0],
        cols["contrastive_permutation_to_foil"][0, 0],
    )
    assert 0 <= foil_share <= flip <= 1 and flip > 0
