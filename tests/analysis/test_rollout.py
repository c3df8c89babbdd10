"""Attention rollout (Abnar & Zuidema 2020): the rollout by hand, and the ablation on a Transformer
and a recurrent model."""

from __future__ import annotations

import torch
from analysis_testkit import VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.ablations.rollout import encoder_rollout
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.suite import run_suite


def test_rollout_of_two_layers_by_hand():
    a1 = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
    a2 = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    att = torch.stack([a1, a2])[None, :, None]  # (1, 2, 1, 2, 2)
    eye = torch.eye(2)
    expect = (0.5 * a2 + 0.5 * eye) @ (0.5 * a1 + 0.5 * eye)
    got = encoder_rollout(att)[0]
    assert torch.allclose(got, expect) and torch.allclose(got.sum(-1), torch.ones(2))
    assert torch.allclose(expect, torch.tensor([[0.75, 0.25], [0.28125, 0.71875]]))


def test_rollout_runs_on_a_transformer_and_is_skipped_with_a_reason_on_an_rnn():
    cfg = AblationConfig(ablations=["rollout"], bootstrap_resamples=20)
    tf = sharpen(tiny_model("multihead", "transformer"), 2.0)
    res = run_suite(tf, make_examples(6), VOCAB, VOCAB, cfg, progress=False)
    assert res.skipped == {}
    col = res.table["rollout_tau_attn_rollout"]
    defined = col.dropna()
    assert len(defined) > 0 and defined.between(-1, 1).all()
    assert 0 <= res.summary["ablation/rollout/argmax_agrees"] <= 1
    rnn = tiny_model("additive", "bahdanau")
    res = run_suite(rnn, make_examples(3), VOCAB, VOCAB, cfg, progress=False)
    assert "self_attention" in res.skipped["rollout"]
