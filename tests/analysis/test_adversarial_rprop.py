"""The rprop-1 solver of the adversarial search (:mod:`attnstudy.analysis.adversarial_rprop`,
the default): its update is torch's Rprop, its smoothed objective's gradient is the plain
form's, the batched search is the per-step loop, a row's result is its own (alone, in a batch,
in chunks), and on an attention-blind model it reaches the known optimum. J&W's solver
(``solver = "jw"``) is tested in test_adversarial.py."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from analysis_testkit import call
from attnstudy.analysis import adversarial_rprop as R
from attnstudy.analysis.ablations.adversarial import (
    AdversarialParams,
    EarlyStop,
    adversarial_loop_reference,
    adversarial_table,
    search_adversarial,
)
from attnstudy.analysis.batch import AblationContext
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.divergences import jsd
from test_adversarial import PAIRS, batch_of, make_model

from attnstudy.data.types import Example
from attnstudy.data.vocab import Vocab


@pytest.fixture(scope="module")
def data():
    """test_adversarial.py's five examples and vocabularies (its tiny models: make_model)."""
    examples = [Example(f"ex{i}", tuple(s), tuple(t)) for i, (s, t) in enumerate(PAIRS)]
    return examples, Vocab.build(e.src for e in examples), Vocab.build(e.tgt for e in examples)


def rprop_cfg(**adv) -> AblationConfig:
    return AblationConfig(seed=3, adversarial=adv)


def search(model, batch, cfg, **kw):
    return search_adversarial(
        model, batch, cfg.params_for("adversarial"), AblationContext.of(cfg), **kw
    )


def test_the_default_solver_and_its_settings():
    """rprop-1 is the default, ``steps`` is the chosen solver's iterations (80 / 500 by
    default); J&W's ``lr`` with rprop-1 is refused in one line naming the key; "jw" leaves the
    solver out of the resolved settings (its key is that of the runs stored before the
    setting), rprop-1 leaves lr out."""
    default = AblationConfig().params_for("adversarial")
    assert (default.solver, default.steps) == (R.NAME, R.STEPS) == ("rprop-1", 80)
    assert AdversarialParams().steps == R.STEPS  # the catalogue's literal default
    resolved = AblationConfig().resolved()["adversarial"]
    assert resolved["solver"] == "rprop-1" and resolved["steps"] == 80 and "lr" not in resolved
    assert AblationConfig(adversarial={"steps": 3}).params_for("adversarial").steps == 3
    jw = AblationConfig(adversarial={"solver": "jw"}).resolved()["adversarial"]
    assert jw == {
        "k": 5,
        "steps": 500,
        "lr": 0.01,
        "lam": 500.0,
        "eps_opt": 0.01,
        "eps_eval": 0.05,
        "init_sd": 3.0,
    }
    assert (
        AblationConfig(adversarial={"solver": "jw", "steps": 7}).params_for("adversarial").steps
        == 7
    )
    with pytest.raises(ValueError, match="ablation.adversarial.lr: the learning rate of solver"):
        AblationConfig(adversarial={"lr": 0.1})
    with pytest.raises(ValueError, match="unknown solver 'adam'; valid: rprop-1, jw"):
        AblationConfig(adversarial={"solver": "adam"})


def test_written_out_rprop_is_torch_rprop_bit_for_bit():
    """:class:`Rprop` makes the updates of ``torch.optim.Rprop`` with the solver's constants
    exactly (float32 and float64), −inf entries (padding) left at −inf."""
    for dtype in (torch.float32, torch.float64):
        g = torch.Generator().manual_seed(0)
        start = torch.randn(6, 5, 2, 7, generator=g, dtype=dtype)
        start[..., 5:] = float("-inf")
        # gradients with sign flips, exact zeros and repeated signs
        grads = [
            torch.randn(6, 5, 2, 7, generator=g, dtype=dtype).round() * (~start.isinf())
            for _ in range(40)
        ]
        ref = start.clone().requires_grad_(True)
        optim = R.torch_rprop(ref)
        mine = R.Rprop(start.clone())
        for grad in grads:
            ref.grad = grad.clone()
            optim.step()
            mine.step(grad)
        assert torch.equal(mine.param, ref.detach()), dtype
        assert mine.param[..., 5:].isneginf().all() and not torch.equal(mine.param, start)


def test_smoothing_goes_from_start_to_end_geometrically():
    n = 9
    got = [R.smoothing(i, n) for i in range(n)]
    assert got[0] == pytest.approx(R.SMOOTHING_START, rel=1e-12)
    assert got[-1] == pytest.approx(R.SMOOTHING_END, rel=1e-12)
    ratios = {round(got[i + 1][0] / got[i][0], 12) for i in range(n - 1)}
    assert len(ratios) == 1  # geometric
    assert R.smoothing(0, 1) == pytest.approx(R.SMOOTHING_START)


def test_the_spread_bound_keeps_padding_and_lifts_only_far_logits():
    theta = torch.tensor([[3.0, -30.0, -16.0, float("-inf")], [0.0, -25.0, 1.0, -19.5]])
    R.bound_spread_(theta, 20.0)
    assert theta.tolist() == [[3.0, -17.0, -16.0, float("-inf")], [0.0, -19.0, 1.0, -19.0]]


@pytest.mark.parametrize(
    "attention,flow,heads,scatter",
    [
        ("additive", "bahdanau", 1, False),
        ("multihead", "luong", 2, False),
        ("additive", "bahdanau", 1, True),
    ],
)
def test_smoothed_gradient_equals_autograd_of_the_plain_smoothed_objective(
    data, attention, flow, heads, scatter, monkeypatch
):
    """``_objective_and_grad(…, smoothing=(δ, τ))`` is the value and autograd gradient of the
    plain form with the same smoothing (float64), at a smoothing where the hinge is partly
    active and at the last iteration's, and the smoothed loss tends to J&W's as (δ, τ) → 0."""
    from attnstudy.analysis._chunks import rows_given_attention
    from attnstudy.analysis.ablations.adversarial import (
        _fixed_terms,
        _initial_logits,
        _objective_and_grad,
        _row_objective_reference,
        _searched_rows,
    )

    import attnstudy.models.seq2seq as seq2seq

    if scatter:
        monkeypatch.setattr(seq2seq, "ROW_VALUES_BUDGET", 0)
    acfg = rprop_cfg(eps_opt=0.001).params_for("adversarial")
    model = make_model(data, attention, flow, heads=heads, dtype=torch.float64)
    batch = batch_of(model, data)
    b_idx, t_idx = _searched_rows(batch)
    theta = _initial_logits(batch, b_idx, t_idx, acfg, 3, heads)
    theta = theta.masked_fill(batch.trace.pad_mask[b_idx][:, None, None, :], float("-inf"))
    logits_of = rows_given_attention(model, batch.trace, b_idx, t_idx)
    fixed = _fixed_terms(batch, b_idx, t_idx)
    for smoothing in (R.SMOOTHING_START, R.SMOOTHING_END, (1e-3, 2e-3)):
        th = theta.clone().requires_grad_(True)
        loss, _, out_tvd, _ = _row_objective_reference(
            logits_of, batch, th, b_idx, t_idx, acfg, smoothing=smoothing
        )
        (grad,) = torch.autograd.grad(loss.sum(), th)
        fast_loss, fast_grad = _objective_and_grad(logits_of, theta, fixed, acfg, smoothing)
        torch.testing.assert_close(fast_loss, loss.detach(), atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(fast_grad, grad, atol=1e-8, rtol=1e-8)
        assert float(grad.abs().max()) > 1e-3
    exact, _, _, _ = _row_objective_reference(logits_of, batch, theta, b_idx, t_idx, acfg)
    tiny, _, _, _ = _row_objective_reference(
        logits_of, batch, theta, b_idx, t_idx, acfg, smoothing=(1e-9, 1e-9)
    )
    torch.testing.assert_close(tiny, exact, atol=1e-4, rtol=0)  # λ · V · δ/2 at most


@pytest.mark.parametrize(
    "attention,flow,heads", [("additive", "bahdanau", 1), ("multihead", "luong", 2)]
)
def test_batched_rprop_search_equals_the_per_step_plain_loop(data, attention, flow, heads):
    """The batched fast path (fused smoothed objective, written-out Rprop) follows, row by row,
    the per-step loop of the plain smoothed objective under autograd stepped by
    ``torch.optim.Rprop`` (float64), and moves the search: found steps, far candidates."""
    cfg = rprop_cfg(steps=40)
    model = make_model(data, attention, flow, heads, dtype=torch.float64)
    batch = batch_of(model, data)
    params, ctx = cfg.params_for("adversarial"), AblationContext.of(cfg)
    fast = search_adversarial(model, batch, params, ctx)
    slow = adversarial_loop_reference(model, batch, params, ctx)
    assert fast.objective.shape == (12,)
    torch.testing.assert_close(fast.candidates, slow.candidates, atol=1e-9, rtol=0)
    torch.testing.assert_close(fast.objective, slow.objective, atol=1e-7, rtol=0)
    assert torch.equal(fast.best, slow.best)
    start = search_adversarial(model, batch, params, ctx, steps=1)
    assert float(fast.objective.mean()) < float(start.objective.mean())
    assert bool((fast.best >= 0).any()) and float(fast.jsd.max()) > 0.05


def test_a_row_alone_equals_it_in_a_batch_and_in_chunks(data):
    """Batch independence (docs/design.md §4): each example searched alone (no padding, no
    batch-mates), the whole batch, and the batch in chunks of three rows give every row the same
    result (float64: the solver is element-wise and its schedule depends on the iteration only)."""
    cfg = rprop_cfg(steps=60)
    model = make_model(data, "multihead", "luong", heads=2, dtype=torch.float64)
    examples = data[0]
    together = call("adversarial", model, batch_of(model, data), cfg)
    alone = pd.concat(
        [call("adversarial", model, batch_of(model, data, [ex]), cfg) for ex in examples],
        ignore_index=True,
    )
    pd.testing.assert_frame_equal(together, alone, check_exact=False, atol=1e-9, rtol=0)
    batch = batch_of(model, data)
    params, ctx = cfg.params_for("adversarial"), AblationContext.of(cfg)
    whole = search_adversarial(model, batch, params, ctx)
    t_x = batch.trace.src.size(1)
    chunked = search_adversarial(model, batch, params, ctx, budget=3 * params.k**2 * t_x)
    assert torch.equal(chunked.best, whole.best)
    torch.testing.assert_close(chunked.candidates, whole.candidates, atol=1e-9, rtol=0)
    assert together.adversarial_found.any()


def test_attention_blind_model_reaches_the_known_optimum(data):
    """Known answer: when the output ignores attention, every TVD is 0 and the search maximises
    JSD(α̃, α) over the simplex, a strictly convex function whose local maxima are the vertices
    e_j; in 80 iterations every candidate sits at a vertex (up to the spread bound's e^{−20}) with
    that vertex's JSD, and the best kept JSD is max_j JSD(e_j, α) wherever a start lay in that
    vertex's basin (11 of the 12 steps here; the 12th's five starts all lie in other basins).
    J&W's solver is still 10⁻³ away from the vertices after 300 iterations."""
    cfg = rprop_cfg()
    model = make_model(data, "additive", "bahdanau", 1, blind=True)
    batch = batch_of(model, data)
    res = search(model, batch, cfg)
    df = adversarial_table(batch, res)
    searched = df[~df.adversarial_skipped]
    assert len(searched) == 12 and searched.adversarial_found.all()
    assert float(res.tvd.max()) < 1e-6
    tr = batch.trace
    at_best = 0
    for r, (b, t) in enumerate(zip(res.b_idx.tolist(), res.t_idx.tolist())):
        n = int(tr.src_lengths[b])
        alpha = tr.attention[b, :, t, :n].mean(0)
        vertices = [float(jsd(alpha, torch.eye(n)[j])) for j in range(n)]
        weights = res.candidates[r, :, 0, :n]
        assert (weights.max(-1).values > 1 - 1e-6).all()
        for k, j in enumerate(weights.argmax(-1).tolist()):
            assert float(res.jsd[r, k]) == pytest.approx(vertices[j], abs=1e-6)
        at_best += abs(float(res.jsd[r].max()) - max(vertices)) < 1e-6
    assert at_best == 11
    jw = AblationConfig(seed=3, adversarial={"solver": "jw", "steps": 300})
    slow = search(model, batch, jw)
    assert float(slow.candidates.max(-1).values.min()) < 1 - 1e-3


def test_early_stopping_is_refused_with_rprop(data):
    model = make_model(data)
    batch = batch_of(model, data)
    with pytest.raises(ValueError, match="early stopping is a setting of J&W's solver"):
        search(model, batch, rprop_cfg(steps=3), early_stop=EarlyStop())


def test_jw_solver_is_amsgrad_on_the_exact_objective_bit_for_bit(data):
    """solver = "jw" is today's search unchanged: θ₀, then ``steps`` AMSGrad updates from the
    exact objective's gradient (no smoothing, no bound), equal bit for bit to a hand loop."""
    from attnstudy.analysis._chunks import rows_given_attention
    from attnstudy.analysis.ablations.adversarial import (
        _fixed_terms,
        _initial_logits,
        _objective_and_grad,
        _searched_rows,
    )
    from attnstudy.analysis.adversarial_steps import AmsGrad

    cfg = rprop_cfg(solver="jw", steps=25)
    acfg = cfg.params_for("adversarial")
    model = make_model(data, "multihead", "luong", heads=2)
    batch = batch_of(model, data)
    res = search(model, batch, cfg)
    b_idx, t_idx = _searched_rows(batch)
    theta = _initial_logits(batch, b_idx, t_idx, acfg, 3, 2)
    theta = theta.masked_fill(batch.trace.pad_mask[b_idx][:, None, None, :], float("-inf"))
    logits_of = rows_given_attention(model, batch.trace, b_idx, t_idx)
    fixed = _fixed_terms(batch, b_idx, t_idx)
    adam = AmsGrad(theta, 0.01)
    for _ in range(25):
        adam.step(_objective_and_grad(logits_of, adam.param, fixed, acfg)[1])
    assert torch.equal(res.candidates, torch.softmax(adam.param, -1))


@pytest.mark.parametrize("solver", ["rprop-1", "jw"])
def test_a_monitor_reads_the_search_without_changing_it(data, solver):
    """``_optimise(monitor=…)`` (the solver benchmark's convergence curve) is called after every
    iteration; its reading after the last one is the result's own final evaluation, and reading
    at every iteration leaves the result as it was without a monitor. With early stopping it is
    refused."""
    from attnstudy.analysis.ablations import adversarial as adv

    from attnstudy.models import eval_mode

    cfg = AblationConfig(seed=3, adversarial={"solver": solver, "steps": 12})
    model = make_model(data, "general", "luong", dtype=torch.float64)
    batch = batch_of(model, data)
    params, ctx = cfg.params_for("adversarial"), AblationContext.of(cfg)
    b_idx, t_idx = adv._searched_rows(batch)
    seen = []

    def monitor(i, evaluate):
        seen.append((i, evaluate()))

    flags = adv._requires_grad_off(model)
    try:
        with eval_mode(model):
            plain = adv._optimise(model, batch, b_idx, t_idx, params, ctx)
            read = adv._optimise(model, batch, b_idx, t_idx, params, ctx, monitor=monitor)
            with pytest.raises(ValueError, match="early stopping"):
                adv._optimise(
                    model,
                    batch,
                    b_idx,
                    t_idx,
                    params,
                    ctx,
                    monitor=monitor,
                    early_stop=EarlyStop(tol=1e-4, every=2),
                )
    finally:
        adv._restore_requires_grad(model, flags)
    assert [i for i, _ in seen] == list(range(1, 13))
    objective, jsd_last, tvd_last = seen[-1][1]
    torch.testing.assert_close(objective, read.objective, atol=0, rtol=0)
    torch.testing.assert_close(jsd_last, read.jsd, atol=0, rtol=0)
    torch.testing.assert_close(tvd_last, read.tvd, atol=0, rtol=0)
    torch.testing.assert_close(read.candidates, plain.candidates, atol=0, rtol=0)
    assert torch.equal(read.best, plain.best)
    assert float(seen[0][1][0].mean()) > float(objective.mean())  # it went somewhere


@pytest.mark.parametrize(
    "adversarial", [{"solver": "jw"}, {"solver": "jw", "lr": 0.02}, {}, {"steps": 7}]
)
def test_a_config_read_back_from_its_dump_is_the_same(adversarial):
    """A config sent to a worker (``model_dump`` → ``model_validate``: the local and Ray
    executors, ``ablate --data``) comes back with its solver: the J&W solver's name is left out
    of the key form only. It came back as rprop-1 with J&W's lr and was refused (ValidationError
    in every ablation task of a jw-pinned experiment on Ray)."""
    cfg = AblationConfig(adversarial=adversarial)
    for mode in ("json", "python"):
        back = AblationConfig.model_validate(cfg.model_dump(mode=mode))
        assert back.params_for("adversarial") == cfg.params_for("adversarial")
        assert back.resolved() == cfg.resolved()
    key = cfg.resolved()["adversarial"]
    if adversarial.get("solver") == "jw":
        assert "solver" not in key and key["lr"] == adversarial.get("lr", 0.01)
    else:
        assert key["solver"] == "rprop-1" and "lr" not in key
