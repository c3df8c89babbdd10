"""Adversarial attention (Jain & Wallace 2019 §4.2, ``AdversaryMulti``) on tiny models."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_testkit import call, target_prob_drop
from attnstudy.analysis.ablations.adversarial import (
    adversarial_loop_reference,
    adversarial_rows,
    adversarial_table,
    search_adversarial,
)
from attnstudy.analysis.batch import AblationContext, prepare_batches
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.divergences import LN2, jsd

from attnstudy.config import ModelConfig
from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab
from attnstudy.models import build_model

PAIRS = [("abc", "xy"), ("a", "x"), ("bca", "yzx"), ("ba", "zz"), ("cab", "x")]


@pytest.fixture(scope="module")
def data():
    examples = [Example(f"ex{i}", tuple(s), tuple(t)) for i, (s, t) in enumerate(PAIRS)]
    return examples, Vocab.build(e.src for e in examples), Vocab.build(e.tgt for e in examples)


def make_model(
    data,
    attention="additive",
    flow="bahdanau",
    heads=1,
    seed=0,
    blind=False,
    dtype=torch.float32,
    cell="gru",
    layers=1,
):
    """Tiny model (dims 3–6), weights scaled ×3 so outputs depend visibly on attention.

    ``blind``: zero every weight that reads the context vector, so the output ignores attention.
    """
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
        dropout=0.0,
        cell=cell,
        layers=layers,
    )
    model = build_model(cfg, len(sv), len(tv))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
        if blind:
            d, ctx = model.decoder, model.attention.context_size
            if flow == "bahdanau":  # RNN input [E y; c] and readout [s; c; E y]
                d.rnn.weight_ih_l0[:, cfg.embedding_dim : cfg.embedding_dim + ctx] = 0.0
                d.readout.weight[:, cfg.decoder_hidden : cfg.decoder_hidden + ctx] = 0.0
            else:  # combine [c; s]
                d.combine.weight[:, :ctx] = 0.0
    return model.to(dtype).eval()


def batch_of(model, data, examples=None, batch_size=8):
    ex, sv, tv = data
    return next(prepare_batches(model, examples or ex, sv, tv, "reference", batch_size))


def cfg_with(**adv) -> AblationConfig:
    """Jain & Wallace's solver (``solver = "jw"``, the reference these tests check) unless
    ``solver`` is given."""
    return AblationConfig(seed=3, adversarial={"solver": "jw", **adv})


def test_defaults_are_jain_wallace():
    """J&W's objective and solver settings; the default solver is rprop-1 (its own tests:
    tests/analysis/test_adversarial_rprop.py)."""
    a = AblationConfig(adversarial={"solver": "jw"}).params_for("adversarial")
    assert (a.k, a.steps, a.lr, a.lam, a.eps_opt, a.eps_eval, a.init_sd) == (
        5,
        500,
        0.01,
        500.0,
        0.01,
        0.05,
        3.0,
    )
    default = AblationConfig().params_for("adversarial")
    assert (default.solver, default.steps) == ("rprop-1", 80)
    assert default.model_copy(update={"solver": "jw", "steps": 500}) == a


@pytest.mark.parametrize(
    "attention,flow,heads", [("additive", "bahdanau", 1), ("multihead", "luong", 2)]
)
def test_batched_search_equals_per_step_loop(data, attention, flow, heads):
    """One batched Adam problem == one optimiser per step (rows independent, Adam element-wise)."""
    cfg = cfg_with(steps=15)
    model = make_model(data, attention, flow, heads, dtype=torch.float64)
    batch = batch_of(model, data)
    fast = search_adversarial(model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg))
    slow = adversarial_loop_reference(
        model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg)
    )
    assert fast.objective.shape == (12,)  # 14 real steps, 2 of them with a one-token source
    assert torch.equal(fast.b_idx, slow.b_idx) and torch.equal(fast.t_idx, slow.t_idx)
    torch.testing.assert_close(fast.objective, slow.objective, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.candidates, slow.candidates, atol=1e-8, rtol=0)
    torch.testing.assert_close(fast.jsd, slow.jsd, atol=1e-8, rtol=0)
    assert torch.equal(fast.best, slow.best)
    # the search moved away from the initialisation and lowered the objective
    start = search_adversarial(
        model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg), steps=1
    )
    assert (fast.objective < start.objective).all()


def test_batched_search_equals_loop_in_float32(data):
    cfg = cfg_with(steps=10)
    model = make_model(data)
    batch = batch_of(model, data)
    fast, slow = (
        search_adversarial(model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg)),
        adversarial_loop_reference(
            model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg)
        ),
    )
    # λ = 500 multiplies fp32 rounding of the TVD hinge in the objective; compare its parts
    torch.testing.assert_close(fast.candidates, slow.candidates, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.tvd, slow.tvd, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.objective, slow.objective, atol=1e-3, rtol=1e-5)


def test_rows_searched_in_chunks_equal_one_search(data):
    """A budget of a few rows per chunk (a long example's case) changes no row's result."""
    cfg = cfg_with(steps=10)
    model = make_model(data)
    batch = batch_of(model, data)
    params, ctx = cfg.params_for("adversarial"), AblationContext.of(cfg)
    whole = search_adversarial(model, batch, params, ctx)
    t_x = batch.trace.src.size(1)
    chunked = search_adversarial(model, batch, params, ctx, budget=3 * params.k**2 * t_x)
    assert len(whole.b_idx) > 3  # so the budget made several chunks
    for name in ("b_idx", "t_idx", "kept", "best"):
        assert torch.equal(getattr(chunked, name), getattr(whole, name)), name
    for name in ("candidates", "jsd", "tvd"):
        torch.testing.assert_close(getattr(chunked, name), getattr(whole, name), atol=1e-6, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "attention,flow,heads", [("additive", "bahdanau", 1), ("multihead", "luong", 2)]
)
def test_attention_blind_model_reaches_the_divergence_maximum(data, attention, flow, heads):
    """Output ignores attention → no TVD constraint → JSD(α̃, α) reaches max over the simplex.

    JSD(·, α) is convex, so its maximum over the simplex is at a vertex e_j; every candidate ends
    near a vertex (a local maximum), and on these ≤ 3-token sources the K = 5 diverse starts
    cover the best one.
    """
    cfg = cfg_with(steps=300)
    model = make_model(data, attention, flow, heads, blind=True)
    batch = batch_of(model, data)
    res = search_adversarial(model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg))
    df = adversarial_table(batch, res)
    searched = df[~df.adversarial_skipped]
    assert len(searched) == 12 and searched.adversarial_found.all()
    assert (searched.adversarial_n_kept == 5).all()
    assert float(res.tvd.max()) < 1e-6  # the output really ignores attention
    tr = batch.trace
    for r, (b, t) in enumerate(zip(res.b_idx.tolist(), res.t_idx.tolist())):
        n = int(tr.src_lengths[b])
        alpha = tr.attention[b, :, t, :n].mean(0)
        best_vertex = max(float(jsd(alpha, torch.eye(n)[j])) for j in range(n))
        assert float(res.jsd[r].max()) >= 0.9 * best_vertex
        # every candidate converged towards a vertex
        assert (res.candidates[r].mean(1)[:, :n].max(-1).values > 0.9).all()
    row = df[(df.example_id == "ex2") & (df.step == 1)].iloc[0]
    assert 0.0 < row.adversarial_max_jsd <= LN2 and row.adversarial_max_tvd < 1e-6


def test_eps_eval_zero_reports_nan_where_nothing_found(data):
    cfg = cfg_with(steps=20, eps_eval=0.0)
    model = make_model(data)
    batch = batch_of(model, data)
    df = call("adversarial", model, batch, cfg)
    assert len(df) == 14
    searched = df[~df.adversarial_skipped]
    assert not searched.adversarial_found.all()  # an output-changing model: TVD > 0 somewhere
    missing = df[~df.adversarial_found.fillna(False)]
    assert missing.adversarial_max_jsd.isna().all() and missing.adversarial_max_tvd.isna().all()
    assert (missing.adversarial_n_kept == 0).all()
    found = df[df.adversarial_found.fillna(False)]
    assert (found.adversarial_max_tvd <= 0.0).all()
    assert df.attrs["adversarial_eps_eval"] == 0.0 and df.attrs["adversarial_eps_opt"] == 0.01


def test_table_columns_and_skipped_steps(data):
    cfg = cfg_with(steps=5, eps_eval=1.0)
    model = make_model(data)
    batch = batch_of(model, data)
    df = call("adversarial", model, batch, cfg)
    assert list(df.columns[:2]) == ["example_id", "step"]
    assert {
        "adversarial_skipped",
        "adversarial_found",
        "adversarial_n_kept",
        "adversarial_max_jsd",
        "adversarial_max_tvd",
    } <= set(df.columns)
    one = df[df.example_id == "ex1"]  # source "a": one valid position
    assert one.adversarial_skipped.all() and one.adversarial_found.isna().all()
    assert one.adversarial_max_jsd.isna().all()
    rest = df[df.example_id != "ex1"]
    # ε_eval = 1 keeps every candidate (TVD ≤ 1 always)
    assert rest.adversarial_found.all() and (rest.adversarial_n_kept == 5).all()
    assert ((rest.adversarial_max_jsd >= 0) & (rest.adversarial_max_jsd <= LN2)).all()


def test_candidates_are_distributions_over_valid_positions(data):
    cfg = cfg_with(steps=5)
    model = make_model(data, "multihead", "luong", heads=2)
    batch = batch_of(model, data)
    res = search_adversarial(model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg))
    assert res.candidates.shape == (12, 5, 2, 3)
    pad = batch.trace.pad_mask[res.b_idx]  # (N, T_x)
    assert (res.candidates.masked_select(pad[:, None, None, :]) == 0).all()
    torch.testing.assert_close(res.candidates.sum(-1), torch.ones(12, 5, 2))


def test_batch_composition_does_not_change_results(data):
    cfg = cfg_with(steps=10)
    model = make_model(data)
    examples = data[0]
    together = call("adversarial", model, batch_of(model, data), cfg)
    alone = pd.concat(
        [call("adversarial", model, batch_of(model, data, [ex]), cfg) for ex in examples],
        ignore_index=True,
    )
    pd.testing.assert_frame_equal(together, alone, check_exact=False, atol=1e-5, rtol=0)


def test_mode_and_requires_grad_restored_no_param_grads(data):
    model = make_model(data).train()
    model.encoder.embedding.weight.requires_grad_(False)  # a frozen parameter stays frozen
    batch = batch_of(model, data)
    call("adversarial", model, batch, cfg_with(steps=3))
    assert model.training
    assert not model.encoder.embedding.weight.requires_grad
    assert all(
        p.requires_grad for n, p in model.named_parameters() if n != "encoder.embedding.weight"
    )
    assert all(p.grad is None for p in model.parameters())


def test_none_model_raises(data):
    model = make_model(data, "none")
    batch = batch_of(model, data)
    with pytest.raises(ValueError, match="no attention|none"):
        call("adversarial", model, batch, cfg_with(steps=2))


def test_adversarial_rows_for_a_heatmap(data):
    cfg = cfg_with(steps=10, eps_eval=0.02)
    model = make_model(data)
    batch = batch_of(model, data)
    res = search_adversarial(model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg))
    df = adversarial_table(batch, res)
    rows = adversarial_rows(batch, res, "ex2")
    assert (
        rows["original"].shape == rows["adversarial"].shape == (4, 3)
    )  # 4 steps ("yzx" + eos), 3 tokens
    np.testing.assert_allclose(rows["original"].sum(-1), 1.0, atol=1e-6)
    sub = df[df.example_id == "ex2"].sort_values("step")
    np.testing.assert_array_equal(rows["found"], sub.adversarial_found.astype(bool).to_numpy())
    for t in range(4):
        if rows["found"][t]:
            assert math.isclose(rows["adversarial"][t].sum(), 1.0, abs_tol=1e-6)
            assert math.isclose(rows["jsd"][t], sub.adversarial_max_jsd.iloc[t], abs_tol=1e-7)
            assert math.isclose(
                float(jsd(torch.tensor(rows["adversarial"][t]), torch.tensor(rows["original"][t]))),
                rows["jsd"][t],
                abs_tol=1e-6,
            )
        else:
            assert np.isnan(rows["adversarial"][t]).all()
    with pytest.raises(KeyError):
        adversarial_rows(batch, res, "nope")


def test_batch_of_one_token_sources_is_all_skipped(data):
    model = make_model(data)
    batch = batch_of(model, data, [data[0][1]])  # source "a"
    df = call("adversarial", model, batch, cfg_with(steps=3))
    assert len(df) == 2 and df.adversarial_skipped.all() and df.adversarial_found.isna().all()
    assert df.adversarial_max_jsd.isna().all()


@pytest.mark.parametrize("k", [1, 5])
def test_fused_objective_equals_the_plain_one(data, k):
    """The fused objective (one log per pair, the pairs k < k' only, fixed terms once) is the
    plain objective of the module docstring, value and gradient, to float64 rounding."""
    from attnstudy.analysis._chunks import rows_given_attention
    from attnstudy.analysis.ablations.adversarial import (
        _initial_logits,
        _row_objective,
        _row_objective_reference,
        _searched_rows,
    )

    cfg = cfg_with(k=k)
    acfg = cfg.params_for("adversarial")
    model = make_model(data, "multihead", "luong", heads=2, dtype=torch.float64)
    batch = batch_of(model, data)
    b_idx, t_idx = _searched_rows(batch)
    theta = _initial_logits(batch, b_idx, t_idx, acfg, 3, 2)
    theta = theta.masked_fill(batch.trace.pad_mask[b_idx][:, None, None, :], float("-inf"))
    logits_of = rows_given_attention(model, batch.trace, b_idx, t_idx)
    out = {}
    for name, fn in (("fused", _row_objective), ("plain", _row_objective_reference)):
        th = theta.clone().requires_grad_(True)
        loss, div, out_tvd, _ = fn(logits_of, batch, th, b_idx, t_idx, acfg)
        (grad,) = torch.autograd.grad(loss.sum(), th)
        out[name] = (loss.detach(), div.detach(), out_tvd.detach(), grad)
    for fused, plain in zip(out["fused"], out["plain"]):
        torch.testing.assert_close(fused, plain, atol=1e-10, rtol=1e-10)
    assert float(out["plain"][1].max()) > 0.05  # real divergences were compared


def test_early_stopping_keeps_each_rows_theta_from_the_iteration_it_stopped(data):
    """tol = 1 stops every row at the second check (an improvement ≤ max(1, |loss|)): the
    result is the search run for every + 1 iterations; a row that goes on follows its own
    trajectory (its result is that of a search where it alone was searched)."""
    from attnstudy.analysis.ablations.adversarial import EarlyStop

    model = make_model(data, "multihead", "luong", heads=2, dtype=torch.float64)
    batch = batch_of(model, data)
    ctx = AblationContext.of(cfg_with())

    def search(steps, early_stop=None):
        params = cfg_with(steps=steps).params_for("adversarial")
        return search_adversarial(model, batch, params, ctx, early_stop=early_stop)

    stopped = search(40, EarlyStop(tol=1.0, every=5))
    assert torch.equal(stopped.candidates, search(6).candidates)
    # a tolerance some rows meet and others do not: every row equals its own one-row search
    some = search(30, EarlyStop(tol=1e-2, every=3))
    loop = adversarial_loop_reference(
        model,
        batch,
        cfg_with(steps=30).params_for("adversarial"),
        ctx,
        early_stop=EarlyStop(tol=1e-2, every=3),
    )
    torch.testing.assert_close(some.candidates, loop.candidates, atol=1e-8, rtol=0)
    full = search(30)
    changed = (some.candidates - full.candidates).abs().amax((1, 2, 3)) > 1e-12
    assert 0 < int(changed.sum()) < len(changed)  # some rows stopped early, some did not


GRADIENT_CASES = [
    # (attention, flow, heads, cell, layers, scatter): the recurrent row forms (their written-out
    # vector–Jacobian product) for every cell, and the scatter form (autograd through the model)
    ("multihead", "luong", 2, "gru", 1, False),
    ("multihead", "luong", 2, "lstm", 2, False),
    ("multihead", "bahdanau", 1, "gru", 1, False),
    ("additive", "bahdanau", 1, "gru", 2, False),
    ("additive", "bahdanau", 1, "lstm", 1, False),
    ("multihead", "bahdanau", 2, "lstm", 2, False),
    ("additive", "bahdanau", 1, "gru", 1, True),
]


@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("attention,flow,heads,cell,layers,scatter", GRADIENT_CASES)
def test_analytic_gradient_equals_autograd_of_the_plain_objective(
    data, k, attention, flow, heads, cell, layers, scatter, monkeypatch
):
    """The fast path's loss and gradient (every derivative written out, the model's too where
    its row form has ``with_vjp``; else autograd through the model) are the plain objective's
    value and autograd gradient, to float64 rounding."""
    from attnstudy.analysis._chunks import rows_given_attention
    from attnstudy.analysis.ablations.adversarial import (
        _fixed_terms,
        _initial_logits,
        _objective_and_grad,
        _row_objective_reference,
        _searched_rows,
    )

    import attnstudy.models.seq2seq as seq2seq

    if scatter:  # past the row form's budget: the scatter form, no written-out backward
        monkeypatch.setattr(seq2seq, "ROW_VALUES_BUDGET", 0)
    acfg = cfg_with(k=k, eps_opt=0.001).params_for("adversarial")
    model = make_model(
        data, attention, flow, heads=heads, dtype=torch.float64, cell=cell, layers=layers
    )
    batch = batch_of(model, data)
    b_idx, t_idx = _searched_rows(batch)
    theta = _initial_logits(batch, b_idx, t_idx, acfg, 3, heads)
    theta = theta.masked_fill(batch.trace.pad_mask[b_idx][:, None, None, :], float("-inf"))
    logits_of = rows_given_attention(model, batch.trace, b_idx, t_idx)
    assert hasattr(logits_of, "with_vjp") == (not scatter)
    th = theta.clone().requires_grad_(True)
    loss, _, out_tvd, _ = _row_objective_reference(logits_of, batch, th, b_idx, t_idx, acfg)
    (grad,) = torch.autograd.grad(loss.sum(), th)
    fixed = _fixed_terms(batch, b_idx, t_idx)
    fast_loss, fast_grad = _objective_and_grad(logits_of, theta, fixed, acfg)
    torch.testing.assert_close(fast_loss, loss.detach(), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(fast_grad, grad, atol=1e-10, rtol=1e-10)
    valid = ~batch.trace.pad_mask[b_idx][:, None, None, :].expand_as(grad)
    assert (fast_grad[~valid] == 0).all()
    # both parts of the objective were exercised: the hinge is active somewhere, and the
    # gradient is not that of the JSD terms alone
    assert bool((out_tvd > acfg.eps_opt).any()) and float(grad[valid].abs().max()) > 1e-3


@pytest.mark.parametrize("cell,layers", [("gru", 1), ("gru", 2), ("lstm", 1)])
def test_bahdanau_search_with_the_written_out_backward_equals_the_plain_search(data, cell, layers):
    """The default search (fused objective, the GRU/LSTM row form's written-out backward,
    AMSGrad written out) finds what the plain search (plain objective under autograd,
    ``torch.optim.Adam``, one step at a time) finds: the same candidates, found steps and
    max JSD on a small seeded model."""
    cfg = cfg_with(steps=30)
    model = make_model(data, dtype=torch.float64, cell=cell, layers=layers, seed=1)
    batch = batch_of(model, data)
    params, ctx = cfg.params_for("adversarial"), AblationContext.of(cfg)
    fast = search_adversarial(model, batch, params, ctx)
    plain = adversarial_loop_reference(model, batch, params, ctx)
    torch.testing.assert_close(fast.candidates, plain.candidates, atol=1e-9, rtol=0)
    torch.testing.assert_close(fast.jsd, plain.jsd, atol=1e-9, rtol=0)
    torch.testing.assert_close(fast.tvd, plain.tvd, atol=1e-9, rtol=0)
    fast_t, plain_t = adversarial_table(batch, fast), adversarial_table(batch, plain)
    pd.testing.assert_series_equal(fast_t.adversarial_found, plain_t.adversarial_found)
    np.testing.assert_allclose(
        fast_t.adversarial_max_jsd, plain_t.adversarial_max_jsd, atol=1e-9, rtol=0
    )
    searched = fast_t[~fast_t.adversarial_skipped]
    # a real comparison: something was found, and the candidates moved far from α
    assert searched.adversarial_found.any() and searched.adversarial_max_jsd.max() > 0.05


def test_written_out_amsgrad_is_torch_adam_bit_for_bit():
    """:class:`_AmsGrad` makes the updates of ``torch.optim.Adam(amsgrad=True)`` exactly, with
    −inf entries (padding) left at −inf."""
    from attnstudy.analysis.adversarial_steps import AmsGrad as _AmsGrad

    g = torch.Generator().manual_seed(0)
    start = torch.randn(6, 5, 7, generator=g)
    start[:, :, 5:] = float("-inf")
    grads = [torch.randn(6, 5, 7, generator=g) * (~start.isinf()) for _ in range(30)]
    ref = start.clone().requires_grad_(True)
    optim = torch.optim.Adam([ref], lr=0.01, amsgrad=True)
    mine = _AmsGrad(start.clone(), 0.01)
    for grad in grads:
        ref.grad = grad.clone()
        optim.step()
        mine.step(grad)
    assert torch.equal(mine.param, ref.detach())
    assert mine.param[:, :, 5:].isneginf().all() and not torch.equal(mine.param, start)


ADVERSARIAL_COLUMNS = [
    "example_id",
    "step",
    "adversarial_skipped",
    "adversarial_found",
    "adversarial_n_kept",
    "adversarial_max_jsd",
    "adversarial_max_tvd",
]


@pytest.mark.parametrize(
    "attention,flow,heads", [("additive", "bahdanau", 1), ("multihead", "luong", 2)]
)
def test_registered_step_scores_of_the_chosen_adversary(data, attention, flow, heads):
    """``[ablation.adversarial] scores``: the chosen adversary's output scored against the
    unmodified step, by hand on every found step (its attention put into the trace, one local
    intervention), equal in the batched search and the per-step loop, NaN where nothing was
    found; a score equal to TVD gives ``adversarial_max_tvd``; the search and the default
    columns do not change."""
    from attnstudy.analysis import step_scores
    from attnstudy.analysis.catalogue import get_ablation

    tvd_fn = step_scores.get_step_score("tvd").fn
    step_scores.register_step_score("target_prob_drop", target_prob_drop, unit="probability")
    step_scores.register_step_score("tvd_again", lambda p, q, t: tvd_fn(p, q, t), unit="TVD")
    try:
        names = ["target_prob_drop", "tvd_again", "kl"]
        cfg = cfg_with(steps=15, scores=names)
        model = make_model(data, attention, flow, heads, dtype=torch.float64)
        batch = batch_of(model, data)
        params, ctx = cfg.params_for("adversarial"), AblationContext.of(cfg)
        fast = search_adversarial(model, batch, params, ctx)
        slow = adversarial_loop_reference(model, batch, params, ctx)
        df = call("adversarial", model, batch, cfg)
        stats = get_ablation("adversarial").all_stats(df.columns)  # reads the registry
    finally:
        step_scores.unregister_step_score("target_prob_drop")
        step_scores.unregister_step_score("tvd_again")
    plain_cfg = cfg_with(steps=15)
    plain = search_adversarial(
        model, batch, plain_cfg.params_for("adversarial"), AblationContext.of(plain_cfg)
    )
    assert plain.scores == {} and torch.equal(plain.candidates, fast.candidates)
    assert torch.equal(fast.best, slow.best) and set(fast.scores) == set(names)
    for name in names:
        torch.testing.assert_close(
            fast.scores[name], slow.scores[name], atol=1e-9, rtol=0, equal_nan=True
        )
        assert torch.equal(fast.scores[name].isnan(), fast.best < 0)
    tr = batch.trace
    found = (fast.best >= 0).nonzero().flatten().tolist()
    assert len(found) >= 2  # bahdanau: 12 of 12 steps found, multihead luong: 2 of 12
    for r in found:
        b, t, k = int(fast.b_idx[r]), int(fast.t_idx[r]), int(fast.best[r])
        weights = tr.attention.clone()
        weights[b, :, t] = fast.candidates[r, k]
        only = torch.zeros_like(tr.step_mask)
        only[b, t] = True
        with torch.no_grad():
            q = torch.softmax(model.logits_given_attention(tr, weights, 4096, only)[b, t], -1)
        p = torch.softmax(tr.logits[b, t], -1)
        y = int(tr.tgt_out[b, t])
        assert float(fast.scores["target_prob_drop"][r]) == pytest.approx(
            float(p[y] - q[y]), abs=1e-9
        )
        kl = float((p * (p.log() - q.log())).sum())
        assert float(fast.scores["kl"][r]) == pytest.approx(kl, abs=1e-9)
    default = adversarial_table(batch, plain)
    assert list(default.columns) == ADVERSARIAL_COLUMNS
    assert list(df.columns) == ADVERSARIAL_COLUMNS + [f"adversarial_{n}" for n in names]
    pd.testing.assert_frame_equal(df[ADVERSARIAL_COLUMNS], default)
    np.testing.assert_allclose(df.adversarial_tvd_again, df.adversarial_max_tvd, atol=1e-12)
    assert (df.adversarial_kl.isna() == df.adversarial_max_tvd.isna()).all()
    assert stats["target_prob_drop"].column == "adversarial_target_prob_drop"
    assert set(get_ablation("adversarial").all_stats(default.columns)) == {"max_jsd", "found_rate"}


def test_adversarial_scores_cannot_replace_its_columns():
    """A registered score named as one of the ablation's own columns is refused (it would
    overwrite ``adversarial_max_jsd`` and its statistic)."""
    from attnstudy.analysis import step_scores

    step_scores.register_step_score("max_jsd", target_prob_drop)
    try:
        with pytest.raises(ValueError, match="would replace column adversarial_max_jsd"):
            AblationConfig(adversarial={"scores": ["max_jsd"]})
    finally:
        step_scores.unregister_step_score("max_jsd")
    with pytest.raises(ValueError, match="tvd and flip are reported already"):
        AblationConfig(adversarial={"scores": ["tvd"]})
    assert "scores" not in AblationConfig().resolved()["adversarial"]


@pytest.mark.parametrize("rng", ["counter-1", "legacy"])
def test_initial_logits_are_each_rows_own_stream_by_hand(data, rng):
    """θ₀ of row (example, step) = log(1/L) + σ · z on its L valid positions, 0 at padding, the
    same for every head: z the stream's normals k·L … k·L + L − 1 for candidate k (counter-1,
    float64 then cast) or ``torch.randn((K, 1, L))`` of the step's generator (legacy); a batch of
    one example gives its rows the same θ₀."""
    from attnstudy.analysis import random_streams
    from attnstudy.analysis.ablations.adversarial import _initial_logits, _searched_rows
    from attnstudy.analysis.batch import step_generator

    acfg = cfg_with(k=3, init_sd=2.0).params_for("adversarial")
    model = make_model(data, "multihead", "luong", heads=2)
    batch = batch_of(model, data)
    b_idx, t_idx = _searched_rows(batch)
    theta = _initial_logits(batch, b_idx, t_idx, acfg, 3, 2, rng=rng)
    lengths = batch.trace.src_lengths
    for n in (0, len(b_idx) - 1):
        b, t = int(b_idx[n]), int(t_idx[n])
        ex, length = batch.example_ids[b], int(lengths[b])
        if rng == "counter-1":
            key = np.array([random_streams.stream_key(3, ex, t, "adversarial")], np.uint64)
            z = torch.from_numpy(random_streams.normals(key, 3 * length)[0].reshape(3, 1, length))
            want = (math.log(1.0 / length) + 2.0 * z).float()
        else:
            z = torch.randn((3, 1, length), generator=step_generator(3, ex, t, "adversarial"))
            want = math.log(1.0 / length) + z * 2.0
        assert torch.equal(theta[n, :, :, :length], want.expand(3, 2, length))
        assert (theta[n, :, :, length:] == 0).all()
    alone = next(prepare_batches(model, [data[0][b_idx[-1]]], data[1], data[2], "reference", 1))
    rows = _searched_rows(alone)
    mine = (b_idx == b_idx[-1]).nonzero()[:, 0]
    got = _initial_logits(alone, *rows, acfg, 3, 2, rng=rng)
    width = int(lengths[b_idx[-1]])
    assert torch.equal(got[..., :width], theta[mine][..., :width])
