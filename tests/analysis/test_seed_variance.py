"""Seed variance (Wiegreffe & Pinter 2019): attention JSD vs output TVD between seeds."""

from __future__ import annotations

import math

import pytest
from analysis_testkit import VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.errors import NoAttentionError
from attnstudy.analysis.seed_variance import seed_variance


def test_same_model_twice_gives_zero():
    model = sharpen(tiny_model("additive"))
    out = seed_variance([model, model], make_examples(), VOCAB, VOCAB, seeds=[1, 1])
    assert out["seed_variance_attention_jsd"].abs().max() <= 1e-6
    assert out["seed_variance_output_tvd"].abs().max() <= 1e-6


def test_pairs_and_ranges():
    models = [sharpen(tiny_model("additive", seed=s)) for s in (1, 2, 3)]
    examples = make_examples()
    out = seed_variance(models, examples, VOCAB, VOCAB, seeds=[1, 2, 3], batch_size=4)
    n_steps = sum(len(ex.tgt) + 1 for ex in examples)
    assert len(out) == 3 * n_steps
    assert sorted(set(zip(out["seed_a"], out["seed_b"]))) == [(1, 2), (1, 3), (2, 3)]
    assert out["seed_variance_attention_jsd"].between(0, math.log(2)).all()
    assert out["seed_variance_output_tvd"].between(0, 1).all()
    assert out["seed_variance_output_tvd"].max() > 1e-3


def test_errors():
    with pytest.raises(ValueError, match="two models"):
        seed_variance([tiny_model()], make_examples(), VOCAB, VOCAB)
    with pytest.raises(NoAttentionError):
        seed_variance([tiny_model(), tiny_model("none")], make_examples(), VOCAB, VOCAB)
