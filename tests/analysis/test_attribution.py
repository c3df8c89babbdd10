"""Attribution methods through Captum (analysis/attribution.py): each batched form equals Captum on
one example and one step, for the recurrent, Transformer and Hugging Face families; known answers
on a linear toy (integrated gradients = input × gradient, completeness); the step-score registry."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from analysis_testkit import make_examples, one_batch, tiny_model
from attnstudy.analysis import attribution as attr
from attnstudy.analysis import step_scores
from attnstudy.analysis.ablations.importance import gradient_importance
from torch import nn

from attnstudy.data.types import Example
from attnstudy.data.vocab import BOS_ID, PAD_ID, UNK_ID

FAMILIES = [("additive", "bahdanau"), ("multihead", "luong"), ("multihead", "transformer")]
# (method, params): every method, integrated gradients with each baseline and two approximations
CASES = [
    ("saliency", {}),
    ("input_x_gradient", {}),
    ("input_x_gradient", {"detach_attention": False}),
    ("integrated_gradients", {"n_steps": 12}),
    (
        "integrated_gradients",
        {"n_steps": 12, "baseline": "unk", "approximation": "riemann_trapezoid"},
    ),
    ("integrated_gradients", {"n_steps": 12, "baseline": "pad", "detach_attention": False}),
    ("occlusion", {}),
    ("occlusion", {"replacement": "pad"}),
]


def _assert_equals_captum(model, batch, method, params, atol=1e-5, rtol=1e-4):
    found = attr.attribution(model, batch, method, **params)
    tr = batch.trace
    checked = 0
    for row in range(tr.src.size(0)):
        n = int(tr.src_lengths[row])
        for step in range(int(tr.step_mask[row].sum())):
            ref, delta = attr.captum_reference(
                model, batch, method, row=row, step=step, **dict(params)
            )
            torch.testing.assert_close(found.scores[row, step, :n], ref, atol=atol, rtol=rtol)
            assert torch.isnan(found.scores[row, step, n:]).all()
            if delta is not None:
                torch.testing.assert_close(
                    found.delta[row, step], delta.to(found.delta.dtype), atol=atol, rtol=rtol
                )
            checked += 1
        assert torch.isnan(found.scores[row, int(tr.step_mask[row].sum()) :]).all()
    assert checked >= 8


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: "-".join(f))
@pytest.mark.parametrize(("method", "params"), CASES, ids=lambda c: str(c))
def test_the_batched_form_equals_captum_on_each_example_and_step(family, method, params):
    model = tiny_model(*family)
    batch = one_batch(model, make_examples(7), "greedy")
    _assert_equals_captum(model, batch, method, params)


def test_hand_written_gradient_x_input_equals_captum_input_x_gradient_and_layer_form():
    """importance.py's gradient × input is |Captum's InputXGradient| on the embeddings, and
    LayerGradientXActivation on the encoder's embedding layer, at every step."""
    from captum.attr import LayerGradientXActivation

    model = tiny_model("additive", "bahdanau")
    batch = one_batch(model, make_examples(6), "greedy")
    tr = batch.trace
    hand = gradient_importance(model, batch)
    for row in range(tr.src.size(0)):
        n, steps = int(tr.src_lengths[row]), int(tr.step_mask[row].sum())
        src, lengths = tr.src[row : row + 1, :n], tr.src_lengths[row : row + 1]
        tgt_in, tgt_out = tr.tgt_in[row : row + 1, :steps], tr.tgt_out[row : row + 1, :steps]
        for step in range(steps):
            ref, _ = attr.captum_reference(model, batch, "input_x_gradient", row=row, step=step)
            torch.testing.assert_close(hand[row, step, :n], ref.abs(), atol=1e-6, rtol=1e-5)

            def forward(ids, step=step, tgt_in=tgt_in, tgt_out=tgt_out, lengths=lengths):
                trace = model.trace(ids, lengths, tgt_in, tgt_out, detach_attention=True)
                logp = torch.log_softmax(trace.logits[:, step], -1)
                return logp.gather(-1, tgt_out[:, step : step + 1])[:, 0]

            layer = LayerGradientXActivation(forward, model.encoder.embedding)
            by_layer = layer.attribute(src).sum(-1)[0].detach()
            torch.testing.assert_close(hand[row, step, :n], by_layer.abs(), atol=1e-6, rtol=1e-5)


# hf_model: conftest's tiny Marian model, shared with the contract tests


def _hf_batch(model):
    texts = ["cat dog bird", "snow rain", "old red river stone"]
    examples = [
        Example(f"hf/{i}", model.source_tokens(s), model.target_tokens(s))
        for i, s in enumerate(texts)
    ]
    from attnstudy.analysis.batch import prepare_batches

    return next(prepare_batches(model, examples, model.vocab, model.vocab, "reference", 8))


@pytest.mark.parametrize(("method", "params"), CASES, ids=lambda c: str(c))
def test_the_batched_form_equals_captum_on_a_hugging_face_model(hf_model, method, params):
    _assert_equals_captum(hf_model, _hf_batch(hf_model), method, params, atol=1e-4)


def test_occlusion_replaces_with_unk_for_ours_and_pad_for_hugging_face(hf_model):
    assert attr.token_id(tiny_model(), "auto") == UNK_ID
    assert attr.token_id(hf_model, "auto") == PAD_ID
    assert attr.token_id(hf_model, "unk") == UNK_ID
    with pytest.raises(ValueError, match="unknown replacement token 'mask'"):
        attr.token_id(hf_model, "mask")


# ----------------------------------------------------------------------------- known answers


class LinearToy(nn.Module):
    """A contract model whose target log-probability is linear in the source embeddings:
    log p_t(4) = z_t = Σ_j w_t · e_j − 3 (the trace returns log-probabilities as logits, and
    log_softmax of log-probabilities is the identity), the other 4 tokens share 1 − e^z."""

    has_attention = False

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.embedding = nn.Embedding(6, 3, padding_idx=PAD_ID)
        with torch.no_grad():
            self.embedding.weight.copy_(torch.randn(6, 3, generator=g) * 0.3)
            self.embedding.weight[PAD_ID] = 0.0
        self.w = nn.Parameter(torch.randn(4, 3, generator=g) * 0.2)  # one w_t per step

    def embed(self, src):
        return self.embedding(src)

    def trace(self, src, src_lengths, tgt_in, tgt_out=None, embedded=None, detach_attention=False):
        e = self.embed(src) if embedded is None else embedded
        pad_mask = torch.arange(src.size(1))[None, :] >= src_lengths[:, None]
        e = e.masked_fill(pad_mask[..., None], 0.0)
        z = torch.einsum("bjd,td->bt", e, self.w[: tgt_in.size(1)]) - 3.0  # (B, T_y)
        rest = torch.log1p(-z.exp()) - math.log(4)
        logits = torch.stack([torch.full_like(z, -1e4), *[rest] * 3, z, rest], -1)
        return SimpleNamespace(
            src=src,
            src_lengths=src_lengths,
            pad_mask=pad_mask,
            tgt_in=tgt_in,
            tgt_out=tgt_out,
            step_mask=tgt_out != PAD_ID,
            logits=logits,
            attention=None,
        )


def _toy_trace(model):
    src = torch.tensor([[1, 2, 5, 3], [4, 2, 0, 0]])
    lengths = torch.tensor([4, 2])
    tgt_out = torch.tensor([[4, 4, 4, 4], [4, 4, 0, 0]])
    tgt_in = torch.tensor([[BOS_ID, 4, 4, 4], [BOS_ID, 4, 0, 0]])
    return model.trace(src, lengths, tgt_in, tgt_out)


def test_on_a_linear_toy_integrated_gradients_equal_input_x_gradient_and_are_complete():
    model = LinearToy()
    tr = _toy_trace(model)
    ixg = attr.attribute(model, tr, "input_x_gradient")
    ig = attr.integrated_gradients(model, tr, n_steps=7)
    torch.testing.assert_close(ig.scores, ixg, atol=1e-6, rtol=0, equal_nan=True)
    # by hand: e_j · w_t
    e = model.embed(tr.src).detach()
    by_hand = torch.einsum("bjd,td->btj", e, model.w.detach())
    torch.testing.assert_close(ixg[0], by_hand[0], atol=1e-7, rtol=0)
    torch.testing.assert_close(ixg[1, :2, :2], by_hand[1, :2, :2], atol=1e-7, rtol=0)
    assert torch.isnan(ixg[1, 2:]).all() and torch.isnan(ixg[1, :, 2:]).all()
    # completeness exactly: Σ_j IG_tj = f_t(e) − f_t(0), delta 0
    real = ig.delta[tr.step_mask]
    assert real.abs().max() < 1e-6 and torch.isnan(ig.delta[~tr.step_mask]).all()
    # saliency: Σ_d |w_t,d| on every real position
    sal = attr.attribute(model, tr, "saliency")
    torch.testing.assert_close(sal[0, 1], model.w[1].abs().sum().expand(4).detach())


def test_completeness_of_integrated_gradients_on_a_recurrent_model():
    """Σ_j IG_tj ≈ f_t(e) − f_t(0) at 50 steps with the attention's gradient kept (with it
    detached, the path integrates another function and the delta says so)."""
    model = tiny_model("additive", "bahdanau")
    batch = one_batch(model, make_examples(7), "greedy")
    full = attr.integrated_gradients(model, batch, n_steps=50, detach_attention=False)
    mask = batch.trace.step_mask
    total = full.scores.nan_to_num(0.0).sum(-1)[mask].double()
    assert full.delta[mask].abs().max() < 1e-4 * max(1.0, float(total.abs().max()))
    detached = attr.integrated_gradients(model, batch, n_steps=50)
    assert detached.delta[mask].abs().max() > 10 * full.delta[mask].abs().max()


def _per_step_reference(model, batch, detach_attention):
    """Saliency and input × gradient from the plain loop: one backward per step, whole batch."""
    from attnstudy.models import eval_mode, gradients_in_eval

    tr = batch.trace
    sal = torch.full(tr.src.shape[:1] + tr.tgt_in.shape[1:] + tr.src.shape[1:], math.nan)
    ixg = sal.clone()
    with eval_mode(model), gradients_in_eval():
        e = model.embed(tr.src).detach()
        for t, g in attr._step_gradients(model, tr, e, detach_attention):
            sal[:, t], ixg[:, t] = g.abs().sum(-1), (g * e).sum(-1)
    return attr._mask(tr, sal), attr._mask(tr, ixg)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: "-".join(f))
@pytest.mark.parametrize(
    "bounds",
    [
        (attr.CELLS_PER_PASS, attr.STEP_CELLS, attr.PADDING_SLACK),
        (1, 1, 1.0),  # a group per row, one step per backward (the plain-grad branch)
        (10**6, 40, 10.0),  # one group, steps in batched chunks of a few
    ],
    ids=["defaults", "row-by-row", "one-group-chunked-steps"],
)
@pytest.mark.parametrize("detach", [True, False], ids=["detached", "attention-kept"])
def test_grouped_batched_gradients_equal_the_per_step_reference(
    family, bounds, detach, monkeypatch
):
    """The fast path (rows grouped by length, cut to their own source and prefix, all steps from
    one vmapped backward) gives the per-step loop's numbers on every real cell."""
    cells, step_cells, slack = bounds
    monkeypatch.setattr(attr, "CELLS_PER_PASS", cells)
    monkeypatch.setattr(attr, "STEP_CELLS", step_cells)
    monkeypatch.setattr(attr, "PADDING_SLACK", slack)
    model = tiny_model(*family)
    batch = one_batch(model, make_examples(7), "greedy")
    assert len(set(batch.trace.src_lengths.tolist())) > 1  # groups of different lengths
    fast = attr.gradient_scores(model, batch, detach_attention=detach)
    ref_sal, ref_ixg = _per_step_reference(model, batch, detach)
    torch.testing.assert_close(fast["saliency"], ref_sal, atol=1e-6, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(
        fast["input_x_gradient"], ref_ixg, atol=1e-6, rtol=1e-5, equal_nan=True
    )


def test_batched_gradients_fall_back_to_one_backward_per_step_without_vmap(monkeypatch):
    """Where vmap cannot batch an operation (a RuntimeError from is_grads_batched), the steps are
    differentiated one at a time, with the same numbers."""
    model = tiny_model("additive", "bahdanau")
    batch = one_batch(model, make_examples(7), "greedy")
    expected = attr.gradient_scores(model, batch)
    grad, batched = torch.autograd.grad, []

    def no_vmap(*args, **kw):
        if kw.get("is_grads_batched"):
            batched.append(1)
            raise RuntimeError("Batching rule not implemented for aten::some_op")
        return grad(*args, **kw)

    monkeypatch.setattr(torch.autograd, "grad", no_vmap)
    found = attr.gradient_scores(model, batch)
    assert batched  # the batched backward was tried
    for method in ("saliency", "input_x_gradient"):
        torch.testing.assert_close(found[method], expected[method], equal_nan=True)


def test_integrated_gradients_are_the_same_whatever_the_grouping(monkeypatch):
    """Integrated gradients (rows: path point × example) equal their row-by-row form."""
    model = tiny_model("multihead", "transformer")
    batch = one_batch(model, make_examples(7), "greedy")
    grouped = attr.integrated_gradients(model, batch, n_steps=6, baseline="unk")
    monkeypatch.setattr(attr, "STEP_CELLS", 1)
    monkeypatch.setattr(attr, "PADDING_SLACK", 1.0)
    single = attr.integrated_gradients(model, batch, n_steps=6, baseline="unk", cells=1)
    torch.testing.assert_close(grouped.scores, single.scores, atol=1e-6, rtol=1e-5, equal_nan=True)
    torch.testing.assert_close(grouped.delta, single.delta, atol=1e-6, rtol=1e-5, equal_nan=True)


def test_the_agreement_matrix_reuses_the_methods_scores_within_a_run(monkeypatch):
    """Within a run (one context), each (batch, method, settings) is computed once: the method
    entries and attribution_agreement share it; a new batch or another model is computed anew."""
    from attnstudy.analysis.ablations import attribution_agreement
    from attnstudy.analysis.attribution_params import AgreementParams
    from attnstudy.analysis.batch import AblationContext

    model = tiny_model("additive", "bahdanau")
    batch = one_batch(model, make_examples(5), "greedy")
    params = AgreementParams.model_validate({"integrated_gradients": {"n_steps": 4}})
    plain = attribution_agreement.run(model, batch, params, AblationContext())
    calls = {"gradient_scores": 0, "integrated_gradients": 0, "occlusion": 0}
    for name in calls:
        real = getattr(attr, name)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(attr, name, counted)
    ctx = AblationContext()
    for method in ("saliency", "input_x_gradient", "integrated_gradients", "occlusion"):
        attr.run_method(method, model, batch, getattr(params, method), ctx)
    assert calls == {"gradient_scores": 1, "integrated_gradients": 1, "occlusion": 1}
    cached = attribution_agreement.run(model, batch, params, ctx)
    assert calls == {"gradient_scores": 1, "integrated_gradients": 1, "occlusion": 1}
    pd_testing = pytest.importorskip("pandas.testing")
    pd_testing.assert_frame_equal(cached, plain)
    # another batch (new trace tensors), then another model: computed again
    attribution_agreement.run(model, one_batch(model, make_examples(5), "greedy"), params, ctx)
    assert calls == {"gradient_scores": 2, "integrated_gradients": 2, "occlusion": 2}
    other = tiny_model("additive", "bahdanau")
    attr.run_method("saliency", other, batch, params.saliency, ctx)
    assert calls["gradient_scores"] == 3


def test_an_unknown_method_or_setting_is_refused():
    model = tiny_model()
    batch = one_batch(model, make_examples(3))
    with pytest.raises(ValueError, match="unknown attribution method 'lime'; valid: saliency"):
        attr.attribute(model, batch, "lime")
    with pytest.raises(ValueError, match="saliency takes detach_attention only"):
        attr.attribute(model, batch, "saliency", n_steps=3)
    with pytest.raises(ValueError, match="n_steps ≥ 2"):
        attr.attribute(model, batch, "integrated_gradients", n_steps=1)
    with pytest.raises(step_scores.UnknownStepScoreError, match="unknown step score 'nope'"):
        attr.attribute(model, batch, "occlusion", score="nope")


# ----------------------------------------------------------------------------- step scores


P = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.1, 0.2, 0.3, 0.4]])
REF = torch.tensor([[0.2, 0.4, 0.2, 0.2], [0.1, 0.2, 0.3, 0.4]])
TARGET = torch.tensor([0, 3])


def test_built_in_step_scores_have_their_known_values():
    def score(name):
        return step_scores.step_score(name, P, REF, TARGET)

    torch.testing.assert_close(score("probability"), torch.tensor([0.5, 0.4]))
    torch.testing.assert_close(score("log_probability"), torch.tensor([0.5, 0.4]).log())
    torch.testing.assert_close(
        score("log_probability_drop"), torch.tensor([math.log(0.2 / 0.5), 0.0])
    )
    torch.testing.assert_close(score("tvd"), torch.tensor([0.35, 0.0]))
    torch.testing.assert_close(
        score("entropy"), torch.tensor([1.5 * math.log(2), -(P[1] * P[1].log()).sum().item()])
    )
    # KL(ref ‖ p) with p = 0 where ref > 0: clamped at the smallest float, large and finite
    kl = score("kl")
    assert kl[1] == 0.0 and 15 < kl[0] < 25
    torch.testing.assert_close(score("flip"), torch.tensor([1.0, 0.0]))
    assert score("jsd")[1] == 0.0 and 0 < score("jsd")[0] < math.log(2)
    with pytest.raises(ValueError, match="pass target="):
        step_scores.step_score("probability", P, REF)


def test_a_registered_step_score_is_usable_by_occlusion_and_can_be_removed():
    def top_prob_drop(probs, reference, target):
        """Drop of the unmodified step's top probability."""
        top = reference.argmax(-1, keepdim=True).expand(*probs.shape[:-1], 1)
        return (reference.expand_as(probs).gather(-1, top) - probs.gather(-1, top)).squeeze(-1)

    s = step_scores.register_step_score("top_prob_drop", top_prob_drop, unit="probability")
    try:
        assert s.description == "Drop of the unmodified step's top probability."
        assert "| `top_prob_drop` | probability |" in step_scores.markdown_table()
        with pytest.raises(ValueError, match="already registered"):
            step_scores.register_step_score("top_prob_drop", top_prob_drop)
        model = tiny_model()
        batch = one_batch(model, make_examples(5))
        found = attr.attribute(model, batch, "occlusion", score="top_prob_drop")
        tvd = attr.attribute(model, batch, "occlusion", score="tvd")
        valid = ~torch.isnan(found)
        assert valid.sum() > 10 and torch.equal(valid, ~torch.isnan(tvd))
        assert (found[valid] <= tvd[valid] + 1e-6).all()  # a probability's drop ≤ the TVD
    finally:
        step_scores.unregister_step_score("top_prob_drop")
    assert "top_prob_drop" not in step_scores.list_step_scores()
    with pytest.raises(ValueError, match="built in"):
        step_scores.unregister_step_score("tvd")
    with pytest.raises(ValueError, match="'tvd' is built in; register yours under another name"):
        step_scores.register_step_score("tvd", top_prob_drop, overwrite=True)
    with pytest.raises(ValueError, match="lower-case identifier"):
        step_scores.register_step_score("Top", top_prob_drop)


def test_ablations_compute_their_output_change_through_the_registry(monkeypatch):
    """permutation, uniform and erase_max read TVD and flip from the registry: a score replaced
    there changes their numbers (and the golden report, tests/report, shows that routing through
    it changed none)."""
    from analysis_testkit import call, sharpen

    model = sharpen(tiny_model(), 3.0)
    batch = one_batch(model, make_examples(5))
    before = call("uniform", model, batch)
    original = step_scores.get_step_score("tvd")
    doubled = step_scores.StepScore("tvd", lambda p, q, t: 2 * original.fn(p, q, t))
    monkeypatch.setitem(step_scores._REGISTRY, "tvd", doubled)
    after = call("uniform", model, batch)
    monkeypatch.undo()
    torch.testing.assert_close(
        torch.tensor(after["uniform_tvd"].values),
        2 * torch.tensor(before["uniform_tvd"].values),
        equal_nan=True,
    )
    assert before["uniform_tvd"].notna().sum() > 5


@pytest.mark.slow
def test_the_attribution_benchmark_runs_in_smoke_mode(tmp_path):
    """benchmarks/bench_attribution.py (integrated gradients vs gradient × input, one long example
    in a child process) runs and appends its tables; no timing is asserted."""
    pytest.importorskip("benchmarks.bench_attribution")
    from benchmarks import bench_attribution

    before = torch.get_num_threads()
    try:
        out = bench_attribution.main(["--smoke", "--results", str(tmp_path / "RESULTS.md")])
    finally:
        torch.set_num_threads(before)
    assert out["ratio"] > 0 and len(out["long"]) == 3
    text = (tmp_path / "RESULTS.md").read_text(encoding="utf-8")
    assert "integrated gradients (4 points) / one gradient × input pass" in text
    assert "peak RSS at L = 12" in text


def test_a_score_in_the_users_own_module_file_reaches_workers_by_value(tmp_path, monkeypatch):
    """A score defined in a module file of the user's (imported by their script) travels by value:
    a worker without that file (a Ray node) still gets it; an installed or attnstudy module's
    function stays a reference, and cloudpickle's registry is left as it was."""
    import pickle
    import sys

    import cloudpickle

    (tmp_path / "my_scores_61.py").write_text(
        "def gap(probs, reference, target):\n"
        "    return reference.max(-1).values - probs.max(-1).values\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_scores_61

    step_scores.register_step_score("my_gap_61", my_scores_61.gap)
    try:
        blob = step_scores.user_scores_payload()
    finally:
        step_scores.unregister_step_score("my_gap_61")
    assert "my_scores_61" not in cloudpickle.list_registry_pickle_by_value()
    # the worker: neither the module nor its file
    monkeypatch.delitem(sys.modules, "my_scores_61")
    (tmp_path / "my_scores_61.py").unlink()
    got = pickle.loads(blob)["my_gap_61"]
    probs, ref = torch.tensor([[0.5, 0.5]]), torch.tensor([[0.9, 0.1]])
    assert torch.allclose(got.fn(probs, ref, torch.tensor([0])), torch.tensor([0.4]))
    assert step_scores._own_module(torch.nn.functional.softmax) is None  # installed
    assert step_scores._own_module(step_scores.register_step_score) is None  # attnstudy


def test_ablations_report_registered_step_scores_named_in_their_settings():
    """``[ablation.<name>] scores``: permutation (median over permutations), uniform and erase_max
    report any registered score beside their TVD; a score equal to TVD gives their TVD exactly,
    and the default settings (no scores) resolve as before, so no key changes."""
    from analysis_testkit import VOCAB, sharpen
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.suite import run_suite

    assert AblationConfig().resolved()["uniform"] == {}
    assert AblationConfig().resolved()["permutation"] == {"n": 100}
    assert not any("scores" in k for k in AblationConfig().flat())
    tvd = step_scores.get_step_score("tvd").fn
    step_scores.register_step_score("tvd_again", lambda p, q, t: tvd(p, q, t), unit="TVD")
    try:
        cfg = AblationConfig(
            ablations=["permutation", "uniform", "erase_max"],
            seed=2,
            bootstrap_resamples=20,
            permutation={"n": 6, "scores": ["tvd_again", "entropy"]},
            uniform={"scores": ["tvd_again"]},
            erase_max={"scores": ["tvd_again"]},
        )
        res = run_suite(
            sharpen(tiny_model(), 3.0), make_examples(7), VOCAB, VOCAB, cfg, progress=False
        )
    finally:
        step_scores.unregister_step_score("tvd_again")
    t = res.table
    for mine, theirs in (
        ("permutation_median_tvd_again", "permutation_median_tvd"),
        ("uniform_tvd_again", "uniform_tvd"),
        ("erase_max_tvd_again", "erase_max_tvd"),
    ):
        assert t[theirs].notna().sum() >= 8
        assert t[mine].equals(t[theirs]), mine
    assert res.summary["ablation/uniform/tvd_again"] == res.summary["ablation/uniform/tvd"]
    assert res.summary["ablation/permutation/median_entropy"] > 0
    with pytest.raises(ValueError, match="tvd and flip are reported already"):
        AblationConfig(uniform={"scores": ["flip"]})
    with pytest.raises(
        ValueError, match='scores is a list of step score names, e.g. scores = \\["kl"\\]'
    ):
        AblationConfig(uniform={"scores": "kl"})
    # a user score named "skipped" would replace the ablation's own <ablation>_skipped column (it
    # passed the config and failed the ablation: "Need to pass bool-like values")
    step_scores.register_step_score("skipped", lambda p, q, t: tvd(p, q, t))
    try:
        for name in ("uniform", "erase_max", "permutation", "importance", "adversarial"):
            with pytest.raises(ValueError, match="'skipped' would replace the ablation's own"):
                AblationConfig(**{name: {"scores": ["skipped"]}})
    finally:
        step_scores.unregister_step_score("skipped")


def test_leave_one_out_and_adversarial_report_registered_step_scores_in_the_suite():
    """``[ablation.importance] scores`` and ``[ablation.adversarial] scores`` through the suite:
    the per-step columns reach the table and their statistics (the catalogue's more_stats) the
    logged summary, as the mean over the steps where they are defined; the adversary's score
    equal to TVD is its ``adversarial_max_tvd``."""
    import pandas as pd
    from analysis_testkit import VOCAB, sharpen
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.suite import run_suite

    tvd = step_scores.get_step_score("tvd").fn
    step_scores.register_step_score("tvd_again", lambda p, q, t: tvd(p, q, t), unit="TVD")
    try:
        cfg = AblationConfig(
            ablations=["importance", "adversarial"],
            seed=2,
            bootstrap_resamples=20,
            importance={"scores": ["tvd_again", "log_probability_drop"]},
            adversarial={"steps": 10, "scores": ["tvd_again", "kl"]},
        )
        res = run_suite(
            sharpen(tiny_model(), 3.0), make_examples(7), VOCAB, VOCAB, cfg, progress=False
        )
    finally:
        step_scores.unregister_step_score("tvd_again")
    t, summary = res.table, res.summary
    # a score equal to TVD ranks the deletions as TVD: the same τ
    assert t["importance_tau_attn_loo"].notna().sum() >= 8
    assert t["importance_tau_attn_loo_tvd_again"].equals(t["importance_tau_attn_loo"])
    assert summary["ablation/importance/tau_attn_loo_tvd_again"] == pytest.approx(
        summary["ablation/importance/tau_attn_loo"]
    )
    col = t["importance_tau_attn_loo_log_probability_drop"]
    assert col.notna().sum() >= 8
    assert summary["ablation/importance/tau_attn_loo_log_probability_drop"] == pytest.approx(
        col.mean()
    )
    assert t["adversarial_max_tvd"].notna().sum() >= 8
    pd.testing.assert_series_equal(
        t["adversarial_tvd_again"], t["adversarial_max_tvd"], check_names=False, atol=1e-7
    )
    assert summary["ablation/adversarial/kl"] == pytest.approx(t["adversarial_kl"].mean())
    assert summary["ablation/adversarial/kl"] > 0
