"""Permutation (local, loop reference, global) and uniform attention: known answers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_testkit import VOCAB, call, make_examples, one_batch, sharpen, tiny_model
from attnstudy.analysis.ablations.permutation import (
    permutation_loop_reference,
)
from attnstudy.analysis.batch import AblationContext
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.errors import NoAttentionError

from attnstudy.data.types import Example


@pytest.mark.parametrize("rng", ["counter-1", "legacy"])
@pytest.mark.parametrize("prefix", ["reference", "greedy"])
def test_local_equals_loop_reference(model, examples, cfg, prefix, rng):
    cfg = cfg.model_copy(update={"rng": rng})
    batch = one_batch(model, examples, prefix)
    fast = call("permutation", model, batch, cfg)
    slow = permutation_loop_reference(
        model, batch, cfg.params_for("permutation"), AblationContext.of(cfg)
    )
    pd.testing.assert_frame_equal(fast, slow, atol=1e-6, rtol=0)
    assert (
        fast["permutation_median_tvd"].max() > 1e-4
    )  # the model is sensitive: not a vacuous check
    assert fast["permutation_n_identity"].sum() > 0  # two-position sources draw the identity


def test_uniform_attention_model_has_zero_permutation_effect(examples, cfg):
    model = sharpen(tiny_model("uniform"))
    batch = one_batch(model, examples, "greedy")
    out = call("permutation", model, batch, cfg)
    done = out[~out["permutation_skipped"]]
    assert len(done) > 10
    assert done["permutation_median_tvd"].max() <= 1e-6
    assert (done["permutation_flip_rate"] == 0).all()
    uni = call("uniform", model, batch, cfg)
    assert uni["uniform_tvd"].max() <= 1e-6 and (uni["uniform_flip"].dropna() == 0).all()


def _constant_value_model(attention: str, flow: str):
    """Keys vary with the source, values are all 0: the context ignores the attention."""
    model = sharpen(tiny_model(attention, flow))
    with torch.no_grad():
        model.attention.v_proj.weight.zero_()
    return model


@pytest.mark.parametrize("attention, flow", [("multihead", "luong"), ("scaled_dot", "bahdanau")])
def test_identical_values_make_every_intervention_a_no_op(examples, cfg, attention, flow):
    model = _constant_value_model(attention, flow)
    batch = one_batch(model, examples, "greedy")
    att = batch.trace.attention
    assert (att.max(-1).values - att.min(-1).values).max() > 0.01 or att.size(
        -1
    ) > 1  # attention not uniform
    perm = call("permutation", model, batch, cfg)
    assert perm["permutation_median_tvd"].max() <= 1e-6 and perm["permutation_flip_rate"].max() == 0
    uni = call("uniform", model, batch, cfg)
    assert uni["uniform_tvd"].max() <= 1e-6
    em = call("erase_max", model, batch, cfg)
    assert em["erase_max_tvd"].max() <= 1e-6 and em["erase_max_flip"].max() == 0
    euf = call("erase_until_flip", model, batch, cfg)
    done = euf[~euf["erase_until_flip_skipped"]]
    assert len(done) > 0
    for r in ("attn_desc", "attn_asc", "random", "grad_desc", "grad_attn_desc"):
        assert (done[f"erase_{r}_never_flipped"] == 1).all()
        assert done[f"erase_{r}_frac_positions"].isna().all()


def test_sensitive_model_does_react(examples, cfg):
    """The contrast of the two known-answer tests above: the same checks on a normal model fail."""
    model = sharpen(tiny_model("multihead", "luong"))
    batch = one_batch(model, examples, "reference")
    assert call("uniform", model, batch, cfg)["uniform_tvd"].max() > 1e-3
    assert call("permutation", model, batch, cfg)["permutation_median_tvd"].max() > 1e-3


def test_same_seed_same_numbers_other_seed_other_numbers(examples, cfg):
    model = sharpen(tiny_model("additive"))
    batch = one_batch(model, examples, "reference")
    a = call("permutation", model, batch, cfg)
    b = call("permutation", model, batch, cfg)
    c = call("permutation", model, batch, cfg.model_copy(update={"seed": cfg.seed + 1}))
    pd.testing.assert_frame_equal(a, b, atol=0, rtol=0)
    assert not np.allclose(
        a["permutation_median_tvd"].fillna(0), c["permutation_median_tvd"].fillna(0)
    )


def test_batch_composition_changes_nothing(examples, cfg):
    model = sharpen(tiny_model("multihead", "luong"))
    whole = call("permutation", model, one_batch(model, examples), cfg)
    parts = pd.concat(
        [call("permutation", model, one_batch(model, [ex]), cfg) for ex in examples],
        ignore_index=True,
    )
    pd.testing.assert_frame_equal(whole, parts, atol=1e-6, rtol=0)


def test_single_position_steps_are_skipped(examples, cfg):
    model = sharpen(tiny_model("additive"))
    out = call("permutation", model, one_batch(model, examples), cfg)
    one = out["example_id"].isin([ex.id for ex in examples if len(ex.src) == 1])
    assert one.any() and out.loc[one, "permutation_skipped"].all()
    assert out.loc[one, "permutation_median_tvd"].isna().all()
    assert (out.loc[~one, "permutation_median_tvd"].notna()).all()


def test_small_chunks_change_nothing(examples, cfg, monkeypatch):
    model = sharpen(tiny_model("additive"))
    batch = one_batch(model, examples)
    a = call("permutation", model, batch, cfg)
    import attnstudy.analysis._chunks as local

    monkeypatch.setattr(local, "ELEMENT_BUDGET", 1)  # one step of one example per chunk
    b = call("permutation", model, batch, cfg.model_copy(update={"chunk_rows": 3}))
    pd.testing.assert_frame_equal(a, b, atol=1e-6, rtol=0)
    chunks = list(local.trace_chunks(batch.trace, cfg.params_for("permutation").n, budget=1))
    assert all(len(c.rows) == 1 and c.stop - c.start == 1 for c in chunks)
    assert len(chunks) == int(batch.trace.step_mask.sum())


def test_global_permutation(examples, cfg):
    model = sharpen(tiny_model("multihead", "luong"), 4.0)
    batch = one_batch(model, examples, "greedy")
    out = call("permutation_global", model, batch, cfg)
    assert list(out.columns) == [
        "example_id",
        "permutation_global_changed",
        "permutation_global_edit_distance",
        "permutation_global_exact_original",
        "permutation_global_exact_permuted",
    ]
    assert (
        out["permutation_global_changed"] == (out["permutation_global_edit_distance"] > 0)
    ).all()
    # the original output is the model's greedy output
    hyps = model.greedy(
        batch.trace.src, batch.trace.src_lengths, 2 * int(batch.trace.src_lengths.max()) + 2
    )
    exact = [tuple(VOCAB.itos[i] for i in h) in ex.references for h, ex in zip(hyps, examples)]
    assert out["permutation_global_exact_original"].tolist() == exact
    assert out["permutation_global_changed"].any()  # the untrained model's outputs react
    # batch composition does not matter
    single = pd.concat(
        [
            call("permutation_global", model, one_batch(model, [ex], "greedy"), cfg)
            for ex in examples
        ],
        ignore_index=True,
    )
    pd.testing.assert_frame_equal(out, single)


def test_global_permutation_of_uniform_attention_changes_nothing(examples, cfg):
    model = sharpen(tiny_model("uniform"), 4.0)
    out = call("permutation_global", model, one_batch(model, examples, "greedy"), cfg)
    assert not out["permutation_global_changed"].any()


def test_none_model_raises(examples, cfg):
    model = tiny_model("none")
    batch = one_batch(model, examples)
    for name in ("permutation", "uniform", "permutation_global", "erase_max", "erase_until_flip"):
        with pytest.raises(NoAttentionError, match="none"):
            call(name, model, batch, cfg)
    with pytest.raises(NoAttentionError, match="none"):
        permutation_loop_reference(
            model, batch, cfg.params_for("permutation"), AblationContext.of(cfg)
        )


def test_train_mode_is_restored_and_eval_is_used():
    examples = make_examples(4)
    cfg = AblationConfig(n_permutations=5)
    model = sharpen(tiny_model("additive", dropout=0.5))
    batch = one_batch(model, examples)
    expected = call("permutation", model, batch, cfg)  # model is in eval mode
    model.train()
    got = call("permutation", model, batch, cfg)
    assert model.training
    pd.testing.assert_frame_equal(expected, got)


def test_one_long_example_is_cut_into_step_windows_within_the_budget(monkeypatch):
    """A 5,000-token example once made the permutation build a B×P×H×T_y×T_x index (250 GB).
    Chunks now cut a long example into windows of steps, each inside the element budget, and the
    numbers do not depend on the windows."""
    import attnstudy.analysis._chunks as local
    from analysis_testkit import NAMES

    g = torch.Generator().manual_seed(1)
    src = tuple(NAMES[i] for i in torch.randint(0, len(NAMES), (1000,), generator=g))
    model = sharpen(tiny_model("additive"))
    batch = one_batch(model, [Example("long/0", src, src)])
    p = 100
    chunks = list(local.trace_chunks(batch.trace, p))
    width = max(batch.trace.attention.size(1) * 1000, batch.trace.logits.size(-1))
    assert len(chunks) > 1
    assert all(len(c.rows) * p * (c.stop - c.start) * width <= local.ELEMENT_BUDGET for c in chunks)
    assert (
        sum(c.stop - c.start for c in chunks) == 1001
    )  # every real step once (the <eos> step too)
    short = Example("long/1", src[:120], src[:120])
    small = one_batch(model, [short])
    cfg = AblationConfig(n_permutations=5)
    whole = call("permutation", model, small, cfg)
    monkeypatch.setattr(local, "ELEMENT_BUDGET", 5 * 120 * 7)  # windows of 7 steps
    windows = call("permutation", model, small, cfg)
    pd.testing.assert_frame_equal(whole, windows, atol=1e-6, rtol=0)
