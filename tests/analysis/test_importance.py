"""Gradient and leave-one-out importance vs attention (Jain & Wallace 2019 §3) on tiny models."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_testkit import call, target_prob_drop
from attnstudy.analysis import step_scores
from attnstudy.analysis.ablations.importance import (
    REASON_CONSTANT_ATTENTION,
    REASON_CONSTANT_IMPORTANCE,
    REASON_NO_ATTENTION,
    REASON_ONE_POSITION,
    gradient_importance,
    importance_vectors,
    loo_importance,
    loo_loop_reference,
    loo_score_vectors,
)
from attnstudy.analysis.batch import prepare_batches
from attnstudy.analysis.catalogue import AblationConfig, get_ablation
from attnstudy.analysis.divergences import kendall_tau, tvd

from attnstudy.config import ModelConfig
from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import build_model

PAIRS = [("abcd", "xy"), ("a", "x"), ("bca", "yzx"), ("ba", "zz"), ("cabd", "x")]
TAU_COLS = [
    "importance_tau_attn_grad",
    "importance_p_attn_grad",
    "importance_tau_attn_loo",
    "importance_p_attn_loo",
    "importance_tau_grad_loo",
    "importance_p_grad_loo",
]


@pytest.fixture(scope="module")
def data():
    examples = [Example(f"ex{i}", tuple(s), tuple(t)) for i, (s, t) in enumerate(PAIRS)]
    return examples, Vocab.build(e.src for e in examples), Vocab.build(e.tgt for e in examples)


def make_model(
    data, attention="additive", flow="bahdanau", heads=1, cell="gru", seed=0, dtype=torch.float32
):
    _, sv, tv = data
    torch.manual_seed(seed)
    cfg = ModelConfig(
        embedding_dim=4,
        encoder_hidden=3,
        decoder_hidden=6,
        attention=attention,
        flow=flow,
        attention_dim=4,
        heads=heads,
        cell=cell,
        dropout=0.0,
    )
    model = build_model(cfg, len(sv), len(tv))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    return model.to(dtype).eval()


def batch_of(model, data, examples=None, batch_size=8):
    ex, sv, tv = data
    return next(prepare_batches(model, examples or ex, sv, tv, "reference", batch_size))


@pytest.mark.parametrize(
    "attention,flow,cell,heads",
    [
        ("additive", "bahdanau", "gru", 1),
        ("multihead", "luong", "lstm", 2),
        ("none", "bahdanau", "gru", 1),
    ],
)
def test_loo_batched_equals_loop_reference(data, attention, flow, cell, heads):
    model = make_model(data, attention, flow, heads, cell)
    batch = batch_of(model, data)
    fast = loo_importance(model, batch, chunk_rows=7)  # 7 // 5 steps = 1 deleted source per chunk
    big = loo_importance(model, batch)
    slow = loo_loop_reference(model, batch)
    assert fast.shape == (5, 4, 4)
    assert torch.equal(fast.isnan(), slow.isnan()) and torch.equal(big.isnan(), slow.isnan())
    torch.testing.assert_close(fast.nan_to_num(), slow.nan_to_num(), atol=1e-6, rtol=0)
    torch.testing.assert_close(big.nan_to_num(), slow.nan_to_num(), atol=1e-6, rtol=0)
    # NaN exactly at padding positions, padding steps and the one-token source
    valid = batch.trace.step_mask[:, :, None] & ~batch.trace.pad_mask[:, None, :]
    valid[1] = False
    assert torch.equal(~fast.isnan(), valid)
    assert ((fast[valid] >= 0) & (fast[valid] <= 1)).all() and fast[valid].max() > 0.01


def test_loo_by_hand(data):
    """Deleting "b" from "bca" = the trace of the example "ca" with the same target prefix."""
    ex, sv, tv = data
    model = make_model(data)
    batch = batch_of(model, data)
    loo = loo_importance(model, batch)
    deleted = next(
        prepare_batches(model, [Example("ca", ("c", "a"), ex[2].tgt)], sv, tv, "reference", 1)
    )
    expected = tvd(batch.probs[2, :4], deleted.probs[0])  # 4 steps: y z x <eos>
    torch.testing.assert_close(loo[2, :4, 0], expected, atol=1e-6, rtol=0)
    assert loo[2, 4:].isnan().all() and loo[2, :, 3].isnan().all()


def test_loo_of_a_batch_equals_each_example_alone(data):
    model = make_model(data, "general", "luong")
    batch = batch_of(model, data)
    together = loo_importance(model, batch)
    for i, example in enumerate(data[0]):
        alone = loo_importance(model, batch_of(model, data, [example]))
        t_y, t_x = alone.shape[1:]
        torch.testing.assert_close(
            together[i, :t_y, :t_x].nan_to_num(), alone[0].nan_to_num(), atol=1e-6, rtol=0
        )
        assert together[i, t_y:].isnan().all() and together[i, :, t_x:].isnan().all()


def _log_p_fixed_attention(model, batch, embedded, example, step):
    """log p_step(ŷ) of one example with the attention rows held at their traced values."""
    tr = batch.trace
    fixed = tr.attention[example : example + 1] if tr.attention is not None else None
    att = model.decoder.attention
    if fixed is not None:  # test-only: replay the traced weights, step by step
        calls = iter(range(tr.tgt_in.size(1)))
        att.weights = lambda query, memory: fixed[:, :, next(calls)].unsqueeze(2)
    try:
        out = model.trace(
            tr.src[example : example + 1],
            tr.src_lengths[example : example + 1],
            tr.tgt_in[example : example + 1],
            tr.tgt_out[example : example + 1],
            embedded=embedded,
        )
    finally:
        if fixed is not None:
            del att.weights
    y = tr.tgt_out[example, step]
    return torch.log_softmax(out.logits[0, step], -1)[y]


def _log_p_free(model, batch, embedded, example, step):
    """log p_step(ŷ) of one example, attention recomputed from the embeddings."""
    tr = batch.trace
    sl = slice(example, example + 1)
    out = model.trace(
        tr.src[sl], tr.src_lengths[sl], tr.tgt_in[sl], tr.tgt_out[sl], embedded=embedded
    )
    return torch.log_softmax(out.logits[0, step], -1)[tr.tgt_out[example, step]]


@pytest.mark.parametrize(
    "attention,flow,heads",
    [("additive", "bahdanau", 1), ("multihead", "luong", 2), ("none", "bahdanau", 1)],
)
def test_gradient_times_input_equals_finite_difference(data, attention, flow, heads):
    """Σ_d ∂log p/∂e_jd · e_jd = d/dh log p(e_j (1 + h)) at h = 0, attention held fixed (float64)."""
    model = make_model(data, attention, flow, heads, dtype=torch.float64)
    batch = batch_of(model, data)
    grad = gradient_importance(model, batch)
    example, step = 2, 1
    emb = model.encoder.embedding(batch.trace.src[example : example + 1]).detach()
    h = 1e-6
    for j in range(3):
        up, down = emb.clone(), emb.clone()
        up[0, j] *= 1 + h
        down[0, j] *= 1 - h
        with torch.no_grad():
            fd = (
                _log_p_fixed_attention(model, batch, up, example, step)
                - _log_p_fixed_attention(model, batch, down, example, step)
            ) / (2 * h)
        assert math.isclose(
            float(grad[example, step, j]), abs(float(fd)), rel_tol=1e-5, abs_tol=1e-8
        )
        if (
            attention != "none"
        ):  # the attention really is detached: letting it move changes the value
            with torch.no_grad():
                free = (
                    _log_p_free(model, batch, up, example, step)
                    - _log_p_free(model, batch, down, example, step)
                ) / (2 * h)
            assert abs(float(free - fd)) > 1e-4
    assert grad[example, step, 3:].isnan().all()


def _gradient_from_stacked_logits(model, batch):
    """The plain form: every step's backward from a slice of the stacked logits (B, T_y, V)."""
    tr = batch.trace
    with torch.enable_grad():
        model.eval()
        leaf = model.embed(tr.src).detach().requires_grad_(True)
        trace = model.trace(
            tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=leaf, detach_attention=True
        )
        logp = torch.log_softmax(trace.logits, -1).gather(-1, tr.tgt_out.unsqueeze(-1))[..., 0]
        out = torch.stack(
            [
                (torch.autograd.grad(logp[:, t].sum(), leaf, retain_graph=True)[0] * leaf)
                .sum(-1)
                .abs()
                for t in range(logp.size(1))
            ],
            1,
        )
    invalid = ~tr.step_mask[:, :, None] | tr.pad_mask[:, None, :]
    return out.masked_fill(invalid, math.nan)


@pytest.mark.parametrize("flow,cell", [("bahdanau", "gru"), ("luong", "lstm")])
def test_gradient_from_step_logits_equals_stacked_form(data, flow, cell):
    """The backward from each step's own logits gives exactly what the stacked form gives."""
    model = make_model(data, "general", flow, cell=cell)
    batch = batch_of(model, data)
    with torch.enable_grad():
        kept = model.trace(batch.trace.src, batch.trace.src_lengths, batch.trace.tgt_in)
    assert len(kept.step_logits) == batch.trace.tgt_in.size(1)
    assert torch.equal(torch.stack(kept.step_logits, 1), kept.logits)
    assert batch.trace.step_logits is None  # a no-grad trace keeps none
    fast, plain = gradient_importance(model, batch), _gradient_from_stacked_logits(model, batch)
    assert torch.equal(fast.isnan(), plain.isnan())
    assert torch.equal(fast.nan_to_num(), plain.nan_to_num())


def test_gradient_batched_equals_per_example(data):
    model = make_model(data, "concat", "bahdanau", cell="lstm")
    batch = batch_of(model, data)
    together = gradient_importance(model, batch)
    assert together.shape == (5, 4, 4)
    for i, example in enumerate(data[0]):
        alone = gradient_importance(model, batch_of(model, data, [example]))
        t_y, t_x = alone.shape[1:]
        torch.testing.assert_close(
            together[i, :t_y, :t_x].nan_to_num(), alone[0].nan_to_num(), atol=1e-6, rtol=1e-5
        )


def test_table_values_match_kendall_on_the_vectors(data):
    model = make_model(data)
    batch = batch_of(model, data)
    vec = importance_vectors(model, batch)
    df = call("importance", model, batch, AblationConfig())
    assert list(df.columns[:2]) == ["example_id", "step"] and len(df) == 14
    assert set(TAU_COLS) <= set(df.columns)
    row = df[(df.example_id == "ex0") & (df.step == 1)].iloc[0]
    a, g, lo = (
        vec.attention[0, 1, :4].numpy(),
        vec.gradient[0, 1, :4].numpy(),
        vec.loo[0, 1, :4].numpy(),
    )
    assert (row.importance_tau_attn_grad, row.importance_p_attn_grad) == pytest.approx(
        kendall_tau(a, g)
    )
    assert (row.importance_tau_attn_loo, row.importance_p_attn_loo) == pytest.approx(
        kendall_tau(a, lo)
    )
    assert (row.importance_tau_grad_loo, row.importance_p_grad_loo) == pytest.approx(
        kendall_tau(g, lo)
    )
    one = df[df.example_id == "ex1"]  # source "a"
    assert one.importance_skipped.all() and one[TAU_COLS].isna().all().all()
    assert (one.importance_attn_reason == REASON_ONE_POSITION).all()
    rest = df[df.example_id != "ex1"]
    assert not rest.importance_skipped.any()
    assert (
        rest.importance_tau_grad_loo.notna().all() and rest.importance_tau_attn_grad.notna().all()
    )
    assert rest.importance_attn_reason.isna().all()


def test_uniform_attention_gives_undefined_attention_tau(data):
    model = make_model(data, "uniform")
    batch = batch_of(model, data)
    df = call("importance", model, batch, AblationConfig())
    rest = df[~df.importance_skipped]
    assert rest[["importance_tau_attn_grad", "importance_tau_attn_loo"]].isna().all().all()
    assert (rest.importance_attn_reason == REASON_CONSTANT_ATTENTION).all()
    assert rest.importance_tau_grad_loo.notna().all()


def test_none_model_keeps_gradient_loo_tau(data):
    model = make_model(data, "none")
    batch = batch_of(model, data)
    vec = importance_vectors(model, batch)
    assert vec.attention is None
    df = call("importance", model, batch, AblationConfig())
    assert df[["importance_tau_attn_grad", "importance_tau_attn_loo"]].isna().all().all()
    assert (df.importance_attn_reason == REASON_NO_ATTENTION).all()
    assert df[~df.importance_skipped].importance_tau_grad_loo.notna().all()


def test_source_blind_model_has_zero_importance(data):
    """Output independent of the source (bridge and context weights zeroed): LOO = grad = 0.

    LOO is 0 up to fp32 rounding (the deletions run in batches of another shape, so the matmuls
    reduce in another order: a few ulps of each probability, 1.2e-7 measured on an AVX-512 Xeon,
    where the old bound of 1e-7 failed; 1e-6 is about 8 ulps of 1.0); the gradient is exactly 0,
    so every τ involving it is undefined.
    """
    model = make_model(data)
    with torch.no_grad():
        model.decoder.bridge.weight.zero_()
        model.decoder.rnn.weight_ih_l0[:, 4:] = 0.0
        model.decoder.readout.weight[:, 6:12] = 0.0
    batch = batch_of(model, data)
    vec = importance_vectors(model, batch)
    valid = ~vec.loo.isnan()
    assert (vec.loo[valid] < 1e-6).all() and (vec.gradient[valid] == 0).all()
    df = call("importance", model, batch, AblationConfig())
    rest = df[~df.importance_skipped]
    cols = [
        "importance_tau_attn_grad",
        "importance_p_attn_grad",
        "importance_tau_grad_loo",
        "importance_p_grad_loo",
    ]
    assert rest[cols].isna().all().all()
    assert (rest.importance_attn_reason == REASON_CONSTANT_IMPORTANCE).all()
    assert (rest.importance_grad_loo_reason == REASON_CONSTANT_IMPORTANCE).all()


def test_batch_size_does_not_change_the_table(data):
    model = make_model(data, "dot", "luong")
    examples = data[0]
    together = call("importance", model, batch_of(model, data), AblationConfig())
    pairs = pd.concat(
        [
            call("importance", model, batch_of(model, data, examples[i : i + 2]), AblationConfig())
            for i in range(0, len(examples), 2)
        ],
        ignore_index=True,
    )
    pd.testing.assert_frame_equal(together, pairs, check_exact=False, atol=1e-6, rtol=1e-5)


def test_mode_restored_and_no_parameter_gradients(data):
    model = make_model(data).train()
    batch = batch_of(model, data)
    call("importance", model, batch, AblationConfig())
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert all(p.requires_grad for p in model.parameters())


def test_kendall_between_attention_and_loo_is_defined_under_ties_in_importance(data):
    # sanity of the τ-b convention used: ties give a finite τ, a constant vector gives NaN
    assert not math.isnan(kendall_tau([0.1, 0.2, 0.7], [0.0, 0.0, 1.0])[0])
    assert math.isnan(kendall_tau(np.full(3, 1 / 3), [0.1, 0.5, 0.2])[0])


def test_greedy_prefix_and_one_token_batch(data):
    ex, sv, tv = data
    model = make_model(data)
    batch = next(prepare_batches(model, ex, sv, tv, "greedy", 8))
    df = call("importance", model, batch, AblationConfig())
    assert len(df) == int(batch.trace.step_mask.sum())
    assert df[~df.importance_skipped].importance_tau_grad_loo.notna().any()
    alone = call("importance", model, batch_of(model, data, [ex[1]]), AblationConfig())
    assert alone.importance_skipped.all() and alone[TAU_COLS].isna().all().all()


def test_values_equal_up_to_rounding_are_ties_in_kendall_tau():
    """Two deletions of equal adjacent tokens give one LOO value in exact arithmetic; batched with
    other examples they differed in the last bits, and τ changed with the batch size (0.74 vs 0.95)."""
    exact = kendall_tau([0.1, 0.5, 0.5, 0.9], [1.0, 2.0, 3.0, 4.0])
    noisy = kendall_tau([0.1, 0.5, 0.5 + 3e-9, 0.9], [1.0, 2.0, 3.0, 4.0])
    assert noisy == exact and exact[0] == pytest.approx(0.9128709, abs=1e-6)  # τ-b with one tie
    assert kendall_tau([0.1, 0.5, 0.5001, 0.9], [1, 2, 3, 4])[0] == pytest.approx(
        1.0
    )  # a real difference


DEFAULT_COLUMNS = [
    "example_id",
    "step",
    "importance_skipped",
    *TAU_COLS,
    "importance_attn_reason",
    "importance_grad_loo_reason",
]


@pytest.fixture
def user_score():
    step_scores.register_step_score("target_prob_drop", target_prob_drop, unit="probability")
    yield "target_prob_drop"
    step_scores.unregister_step_score("target_prob_drop")


@pytest.mark.parametrize(
    "attention,flow,cell,heads",
    [("additive", "bahdanau", "gru", 1), ("multihead", "luong", "lstm", 2)],
)
def test_loo_scores_batched_equal_loop_reference(data, user_score, attention, flow, cell, heads):
    """Every score's deletion vector from the batched pass (one deleted source per chunk, and all
    at once) equals the one-deletion-at-a-time reference; its TVD is loo_importance's, exactly."""
    model = make_model(data, attention, flow, heads, cell)
    batch = batch_of(model, data)
    names = ("tvd", "kl", "probability", user_score)
    fast = loo_score_vectors(model, batch, names, chunk_rows=7)
    big = loo_score_vectors(model, batch, names)
    for vectors, rows in ((fast, 7), (big, 4096)):  # the same chunks: bit-identical
        assert torch.equal(
            vectors["tvd"].nan_to_num(-1), loo_importance(model, batch, rows).nan_to_num(-1)
        )
    for name in names:
        slow = loo_loop_reference(model, batch, name)
        assert torch.equal(fast[name].isnan(), slow.isnan()), name
        assert torch.equal(big[name].isnan(), slow.isnan()), name
        torch.testing.assert_close(fast[name].nan_to_num(), slow.nan_to_num(), atol=1e-6, rtol=0)
        torch.testing.assert_close(big[name].nan_to_num(), slow.nan_to_num(), atol=1e-6, rtol=0)
    valid = ~fast["probability"].isnan()
    assert valid.sum() > 20 and (fast["kl"][valid] >= 0).all() and fast["kl"][valid].max() > 0.01
    assert fast[user_score][valid].abs().max() > 0.01


def test_registered_step_score_of_each_deletion_by_hand(data, user_score):
    """``[ablation.importance] scores``: the deleted-source output scored against the unmodified
    step (checked by hand on the example "bca" without "b"), its τ against attention in the
    table, and its statistic through the catalogue's more_stats; the default table is unchanged."""
    ex, sv, tv = data
    model = make_model(data)
    batch = batch_of(model, data)
    vec = importance_vectors(model, batch, scores=(user_score, "kl"))
    assert set(vec.loo_scores) == {user_score, "kl"}
    deleted = next(
        prepare_batches(model, [Example("ca", ("c", "a"), ex[2].tgt)], sv, tv, "reference", 1)
    )
    p, q = batch.probs[2, :4], deleted.probs[0]  # 4 steps: y z x <eos>
    tgt = batch.trace.tgt_out[2, :4, None]
    drop = (p.gather(-1, tgt) - q.gather(-1, tgt)).squeeze(-1)
    torch.testing.assert_close(vec.loo_scores[user_score][2, :4, 0], drop, atol=1e-6, rtol=0)
    kl = (p * (p.log() - q.log())).sum(-1)
    torch.testing.assert_close(vec.loo_scores["kl"][2, :4, 0], kl, atol=1e-6, rtol=0)
    assert vec.loo_scores[user_score][2, 4:].isnan().all()
    assert vec.loo_scores[user_score][1].isnan().all()  # the one-token source

    cfg = AblationConfig(importance={"scores": [user_score, "kl"]})
    df = call("importance", model, batch, cfg)
    plain = call("importance", model, batch, AblationConfig())
    assert list(plain.columns) == DEFAULT_COLUMNS
    mine = [f"importance_{k}_attn_loo_{n}" for n in (user_score, "kl") for k in ("tau", "p")]
    assert list(df.columns) == DEFAULT_COLUMNS[:-2] + mine + DEFAULT_COLUMNS[-2:]
    pd.testing.assert_frame_equal(df[DEFAULT_COLUMNS], plain)
    row = df[(df.example_id == "ex2") & (df.step == 1)].iloc[0]
    a = vec.attention[2, 1, :3].numpy()
    for name in (user_score, "kl"):
        expected = kendall_tau(a, vec.loo_scores[name][2, 1, :3].numpy())
        got = (row[f"importance_tau_attn_loo_{name}"], row[f"importance_p_attn_loo_{name}"])
        assert got == pytest.approx(expected)
    assert df[df.example_id == "ex1"][mine].isna().all().all()
    assert df[df.example_id != "ex1"][mine[0]].notna().sum() >= 8
    stats = get_ablation("importance").all_stats(df.columns)
    assert stats[f"tau_attn_loo_{user_score}"].column == f"importance_tau_attn_loo_{user_score}"
    assert stats["tau_attn_loo_kl"].unit == "Kendall τ-b"
    assert set(get_ablation("importance").all_stats(plain.columns)) == {
        "tau_attn_grad",
        "tau_attn_loo",
        "tau_grad_loo",
    }


def test_loo_scores_of_the_none_model_have_no_attention_tau(data):
    model = make_model(data, "none")
    batch = batch_of(model, data)
    df = call("importance", model, batch, AblationConfig(importance={"scores": ["jsd"]}))
    assert df[["importance_tau_attn_loo_jsd", "importance_p_attn_loo_jsd"]].isna().all().all()


def test_a_single_score_name_is_refused_not_read_letter_by_letter(data):
    from attnstudy.analysis.ablations.importance import importance_vectors, loo_score_vectors

    model = make_model(data, "additive")
    batch = batch_of(model, data)
    with pytest.raises(TypeError, match=r"scores is a list of step score names, e\.g\. \['kl'\]"):
        importance_vectors(model, batch, scores="kl")
    with pytest.raises(TypeError, match="scores is a list"):
        loo_score_vectors(model, batch, "kl")
    assert set(importance_vectors(model, batch, scores=["kl"]).loo_scores) == {"kl"}
