"""Comprehensiveness and sufficiency per decoder step (DeYoung et al. 2020): the batched form
against the plain per-step loop, and known answers (a model whose output ignores the source; a
copy model whose attention is the alignment)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_testkit import VOCAB, call, make_examples, one_batch, sharpen, tiny_model
from attnstudy.analysis.ablations.faithfulness import (
    drops,
    k_values,
    order_of,
    random_orders,
    reference_drops,
)
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.suite import summarize

CFG = AblationConfig(
    ablations=["faithfulness"],
    bootstrap_resamples=200,
    faithfulness={"rankings": ["attention", "input_x_gradient", "leave_one_out", "random"]},
)


def _summary(out: pd.DataFrame, cfg: AblationConfig = CFG) -> dict[str, float]:
    return summarize(
        out.assign(prefix="greedy"),
        pd.DataFrame({"example_id": out["example_id"].unique()}),
        ["faithfulness"],
        {"faithfulness": "greedy"},
        cfg,
    )


def test_k_is_a_share_of_the_source_at_least_one_token_and_leaves_one():
    assert k_values(10, (0.01, 0.05, 0.1, 0.2, 0.5)) == [1, 1, 1, 2, 5]
    assert k_values(40, (0.01, 0.05, 0.1, 0.2, 0.5)) == [1, 2, 4, 8, 20]
    assert k_values(2, (0.5, 1.0)) == [1, 1]


@pytest.mark.parametrize("flow", ["bahdanau", "transformer"])
def test_batched_drops_equal_the_per_step_reference(flow):
    model = sharpen(tiny_model("additive" if flow == "bahdanau" else "multihead", flow))
    batch = one_batch(model, make_examples(), prefix="greedy")
    tr = batch.trace
    att = order_of(tr.attention.mean(1), tr.pad_mask)
    rand = random_orders(tr, 1, 4, batch.example_ids)[0]
    ks = torch.tensor([[1, 2, 3]] * tr.src.size(0))
    ks = torch.minimum(ks, (tr.src_lengths - 1).clamp(min=1)[:, None])
    got = drops(model, batch, torch.stack([att, rand]), ks, chunk_rows=64)  # several chunks
    for o, order in enumerate((att, rand)):
        for mode_i, mode in enumerate(("comprehensiveness", "sufficiency")):
            for k_i, k in enumerate((1, 2, 3)):
                ref = reference_drops(model, batch, order, k, mode)
                np.testing.assert_allclose(
                    got[mode_i, o, :, :, k_i].numpy(),
                    ref.numpy(),
                    atol=1e-5,
                    equal_nan=True,  # float32 padding
                )
    # real steps of sources with ≥ 2 tokens are computed; the others are NaN
    ok = tr.step_mask & (tr.src_lengths >= 2)[:, None]
    assert torch.isfinite(got[..., 0].permute(2, 3, 0, 1)[ok]).all()
    assert torch.isnan(got[..., 0].permute(2, 3, 0, 1)[~ok]).all()


def test_a_model_that_ignores_the_source_has_zero_comprehensiveness_for_every_ranking():
    """The ``none`` model with the decoder's bridge from the encoder summary zeroed: its output
    cannot depend on the source, so deleting any tokens changes nothing."""
    model = sharpen(tiny_model("none", "bahdanau"))
    with torch.no_grad():
        model.decoder.bridge.weight.zero_()
    batch = one_batch(model, make_examples(), prefix="greedy")
    out = call("faithfulness", model, batch, CFG)
    real = out[~out["faithfulness_skipped"]]
    assert len(real) > 0
    # attention is not available for this model (undefined at every step); the others are 0
    attention = [c for c in out.columns if c.endswith("_attention")]
    assert len(attention) == 5 and out[attention].isna().all().all()  # 3 hard, 2 soft
    assert (out["faithfulness_attention_reason"] == "no attention").all()
    # soft erasure (on by default) is undefined at every step: the all-zero source lowers
    # p(y_t) by nothing, so 1 − S_0 = 0 leaves nothing to normalise by
    soft = [c for c in out.columns if c.startswith("faithfulness_soft_")]
    assert len(soft) == 8 and out[soft].isna().all().all()
    measured = [
        c
        for c in out.columns
        if c.startswith("faithfulness_")
        and c not in ("faithfulness_skipped", "faithfulness_attention_reason", *attention, *soft)
    ]
    assert len(measured) == 9  # input × gradient, leave-one-out, random: AOPC ×2 and k = 1
    np.testing.assert_allclose(real[measured].to_numpy(), 0.0, atol=1e-6)
    s = _summary(out)
    for r in ("input_x_gradient", "leave_one_out", "random"):
        assert s[f"ablation/faithfulness/comprehensiveness_{r}"] == pytest.approx(0.0, abs=1e-6)
        assert s[f"ablation/faithfulness/sufficiency_{r}"] == pytest.approx(0.0, abs=1e-6)


class _CopyByAttention(torch.nn.Module):
    """A copy 'model' built so that its attention is the alignment: step t attends to source t
    (one-hot) and emits that token with probability ~1; with source token t deleted, the token now
    at position t is emitted instead. Duck-types what the ablation reads (``trace``)."""

    has_attention = True

    def trace(self, src, src_lengths, tgt_in, tgt_out=None, embedded=None, detach_attention=False):
        from attnstudy.models import RecurrentTrace

        b, t_y = tgt_in.shape
        t_x = src.size(1)
        pad = torch.arange(t_x)[None, :] >= src_lengths[:, None]
        pos = torch.arange(t_y)[None, :].expand(b, t_y).minimum((src_lengths - 1)[:, None])
        att = torch.nn.functional.one_hot(pos, t_x).float()  # (B, T_y, T_x)
        emitted = src.gather(1, pos)
        logits = 8.0 * torch.nn.functional.one_hot(emitted, len(VOCAB)).float()
        return RecurrentTrace(
            src=src,
            src_lengths=src_lengths,
            pad_mask=pad,
            tgt_in=tgt_in,
            tgt_out=tgt_in if tgt_out is None else tgt_out,
            step_mask=torch.ones(b, t_y, dtype=torch.bool),
            logits=logits,
            cross=att[:, None, None],
            prefix=torch.zeros(b, t_y, 1),
            memory=None,
            embedded=torch.zeros(b, t_x, 1),
        )


def test_on_copy_attention_beats_random_at_k1_with_intervals_apart():
    from attnstudy.analysis.batch import PreparedBatch

    g = torch.Generator().manual_seed(0)
    n_ex, t_x = 40, min(8, len(VOCAB) - 4)
    # distinct symbols per source (ids 4…), so deleting the attended token changes the copied one
    src = torch.stack([torch.randperm(len(VOCAB) - 4, generator=g)[:t_x] + 4 for _ in range(n_ex)])
    lengths = torch.full((n_ex,), t_x)
    model = _CopyByAttention()
    tgt = src.clone()
    tr = model.trace(src, lengths, tgt, tgt)
    examples = [type("Ex", (), {"id": f"c/{i}"})() for i in range(n_ex)]
    batch = PreparedBatch(examples, tr, "reference", VOCAB, VOCAB)
    cfg = AblationConfig(
        ablations=["faithfulness"],
        bootstrap_resamples=500,
        faithfulness={"rankings": ["attention", "random"], "n_random": 5},
    )
    out = call("faithfulness", model, batch, cfg)
    s = _summary(out, cfg)
    a = "ablation/faithfulness/comprehensiveness_top1_attention"
    r = "ablation/faithfulness/comprehensiveness_top1_random"
    assert s[a] > 0.99  # the copied token deleted: p(y_t) from ~1 to ~0
    assert s[f"{a}_ci_low"] > s[f"{r}_ci_high"]
    assert s[r] < 0.8
    # AOPC and sufficiency: attention's kept tokens include the copied one at every k
    assert (
        s["ablation/faithfulness/comprehensiveness_attention"]
        > s["ablation/faithfulness/comprehensiveness_random"]
    )
    assert (
        s["ablation/faithfulness/sufficiency_attention"]
        < s["ablation/faithfulness/sufficiency_random"]
    )
    assert not math.isnan(s["ablation/faithfulness/sufficiency_random"])


def test_the_figure_draws_each_ranking_with_intervals():
    from attnstudy.analysis.figures import FIGURE_KINDS, FigureInput

    model = sharpen(tiny_model())
    batch = one_batch(model, make_examples(), prefix="greedy")
    out = call("faithfulness", model, batch, CFG).assign(variant="copy additive", prefix="greedy")
    fig = FIGURE_KINDS["faithfulness"](FigureInput(out, out, {"copy additive": (0, 0, 1)}), "")
    comp, suff = fig.axes[:2]
    labels = [t.get_text() for t in comp.get_yticklabels()]
    assert labels == ["attention", "input × gradient", "leave-one-out", "random"]
    assert len(comp.patches) == 4 and len(suff.patches) == 4
    assert len(comp.lines) >= 4  # an interval per bar (and the zero line)


def test_the_verdict_names_the_most_faithful_ranking_with_its_interval():
    from attnstudy.analysis.catalogue import verdict_roles

    from attnstudy.verdict.findings import Estimate, ModelFacts, verdict

    def facts(attention_low: float) -> ModelFacts:
        key = "ablation/faithfulness/comprehensiveness_"
        return ModelFacts(
            "copy additive",
            "additive",
            roles=verdict_roles(["faithfulness"]),  # each ranking named by its verdict role
            stats={
                f"{key}attention": Estimate(0.4, attention_low, 0.5),
                f"{key}leave_one_out": Estimate(0.2, 0.1, 0.3),
                f"{key}random": Estimate(0.1, 0.05, 0.15),
                f"{key}top1_attention": Estimate(0.9, 0.8, 1.0),  # k = 1: not an AOPC
            },
        )

    text = verdict(facts(0.35)).text
    assert (
        "The most faithful ranking is attention: deleting the source tokens attention ranks "
        "first lowers p(y_t) by 0.4 [0.35, 0.5] (comprehensiveness AOPC), against 0.2 [0.1, 0.3] "
        "for leave-one-out and 0.1 [0.05, 0.15] for random orders." in text
    )
    assert "No ranking is clearly the most faithful" in verdict(facts(0.25)).text
    assert "faithful" not in verdict(ModelFacts("m", "additive")).text  # not measured: silent


@pytest.mark.parametrize("rng", ["counter-1", "legacy"])
def test_random_orders_are_each_steps_own_stream(rng):
    """Random order i of step (b, t): its valid positions in the order of row i of the stream
    (seed, example id, t, "faithfulness") — the stable argsort of the row's words (counter-1) or
    the step generator's uniforms sorted descending (legacy) — then padding; a batch of one
    example draws the same orders."""
    from attnstudy.analysis import random_streams
    from attnstudy.analysis.batch import step_generator

    model = sharpen(tiny_model("multihead", "luong"))
    examples = make_examples()
    batch = one_batch(model, examples, prefix="greedy")
    tr = batch.trace
    got = random_orders(tr, 3, 4, batch.example_ids, rng)
    b = int(tr.src_lengths.argmin())  # a source with padding
    n, t_x = int(tr.src_lengths[b]), tr.src.size(1)
    assert n < t_x
    for t in range(int(tr.step_mask[b].sum())):
        if rng == "counter-1":
            key = random_streams.stream_key(4, batch.example_ids[b], t, "faithfulness")
            w = random_streams.words(np.array([key], np.uint64), 3 * n)[0].reshape(3, n)
            want = np.argsort(w, axis=-1, kind="stable")
        else:
            u = torch.rand(
                3,
                n,
                generator=step_generator(4, batch.example_ids[b], t, "faithfulness"),
                dtype=torch.float64,
            )
            want = torch.sort(-u, dim=-1, stable=True).indices.numpy()
        for i in range(3):
            assert got[i][b, t, :n].tolist() == want[i].tolist()
            assert got[i][b, t, n:].tolist() == list(range(n, t_x))
    alone = one_batch(model, [examples[b]], prefix="greedy")
    mine = random_orders(alone.trace, 3, 4, alone.example_ids, rng)
    steps = int(tr.step_mask[b].sum())
    for i in range(3):
        assert torch.equal(mine[i][0, :steps, :n], got[i][b, :steps, :n])
