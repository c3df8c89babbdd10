"""Soft comprehensiveness and sufficiency (Zhao & Aletras 2023) of the faithfulness entry: known
answers on a model whose step t reads one embedding element, the batched form against its plain
loop, batch and stream independence, the keep probabilities, and the verdict's sentence.

The known-answer model: source token j's embedding is the one-hot vector of its id, and step t
emits softmax(8 · x_{pos(t)}) with pos(t) = min(t, n − 1) (its attention is the one-hot row at
pos(t)). So p = p_t(ŷ_t) = e⁸ / (e⁸ + V − 1), p_0 = 1/V (every embedding zeroed), and a mask
changes p only through the one element (pos(t), ŷ_t): p' = p where it is kept, p_0 where it is
zeroed. Hence Soft-NC = the share of draws that zero it under keep probability 1 − q and Soft-NS
= the share that keep it under q (Zhao & Aletras's eqs. with 1 − S_0 = p − p_0).
"""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from analysis_testkit import VOCAB, call, make_examples, one_batch, sharpen, tiny_model
from attnstudy.analysis.ablations.faithfulness import (
    FaithfulnessParams,
    normalised_scores,
    order_of,
    random_orders,
    random_scores,
    reference_soft_drops,
    soft_drops,
    soft_words,
)
from attnstudy.analysis.batch import PreparedBatch
from attnstudy.analysis.catalogue import AblationConfig

from attnstudy.models import RecurrentTrace


class _ReadsOne(torch.nn.Module):
    """Step t emits softmax(8 · x_{pos(t)}), x the one-hot embeddings (see the module docstring);
    without ``embed``: no source embeddings to mask (no ``gradients`` capability)."""

    has_attention = True

    def trace(self, src, src_lengths, tgt_in, tgt_out=None, embedded=None, detach_attention=False):
        x = torch.nn.functional.one_hot(src, len(VOCAB)).float() if embedded is None else embedded
        b, t_y = tgt_in.shape
        t_x = src.size(1)
        pad = torch.arange(t_x)[None, :] >= src_lengths[:, None]
        pos = torch.arange(t_y)[None, :].expand(b, t_y).minimum((src_lengths - 1)[:, None])
        att = torch.nn.functional.one_hot(pos, t_x).float()
        logits = 8.0 * x.gather(1, pos[..., None].expand(-1, -1, x.size(-1)))
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
            embedded=x,
        )


class _ReadsOneElement(_ReadsOne):
    """:class:`_ReadsOne` with its one-hot embeddings exposed: masks can be applied to them."""

    def embed(self, src):
        return torch.nn.functional.one_hot(src, len(VOCAB)).float()


def _copy_batch(model, n_ex: int = 6, seed: int = 0) -> PreparedBatch:
    g = torch.Generator().manual_seed(seed)
    t_x = 5
    src = torch.stack([torch.randperm(len(VOCAB) - 4, generator=g)[:t_x] + 4 for _ in range(n_ex)])
    lengths = torch.tensor([5, 3, 4, 5, 2, 5][:n_ex])
    src = src.masked_fill(torch.arange(t_x)[None, :] >= lengths[:, None], 0)
    tgt = src.clone()
    tr = model.trace(src, lengths, tgt, tgt)
    tr.step_mask = tgt != 0
    examples = [type("Ex", (), {"id": f"s/{i}"})() for i in range(n_ex)]
    return PreparedBatch(examples, tr, "reference", VOCAB, VOCAB)


def _pos_and_target(batch):
    tr = batch.trace
    b, t_y = tr.tgt_in.shape
    pos = torch.arange(t_y)[None, :].expand(b, t_y).minimum((tr.src_lengths - 1)[:, None])
    return pos, tr.tgt_out


def test_no_importance_perturbs_nothing_and_full_importance_everything():
    """q = 0 everywhere: comprehensiveness keeps every element (p' = p, Soft-NC = 0) and
    sufficiency zeroes every one (p' = p_0, so Soft-S = S_0 and Soft-NS = 0); q = 1 at the read
    position: comprehensiveness always zeroes it (Soft-NC = 1), sufficiency always keeps it
    (Soft-NS = 1)."""
    model = _ReadsOneElement()
    batch = _copy_batch(model)
    tr = batch.trace
    zero_q = torch.zeros(1, *tr.step_mask.shape, tr.src.size(1), dtype=torch.float64)
    got = soft_drops(model, batch, zero_q, draws=3, seed=1)
    real = tr.step_mask
    assert (got[:, 0][:, real] == 0).all()
    assert got[:, 0][:, ~real].isnan().all()
    one_q = normalised_scores(tr.attention.mean(1), tr.pad_mask)[None]  # one-hot rows
    got = soft_drops(model, batch, one_q, draws=3, seed=1)
    assert (got[:, 0][:, real] == 1).all()


def test_an_intermediate_score_gives_the_share_of_draws_by_hand():
    model = _ReadsOneElement()
    batch = _copy_batch(model)
    tr = batch.trace
    g = torch.Generator().manual_seed(3)
    q = torch.rand(2, *tr.step_mask.shape, tr.src.size(1), generator=g, dtype=torch.float64)
    q = q.masked_fill(tr.pad_mask[None, :, None, :], 0.0)
    draws = 5
    got = soft_drops(model, batch, q, draws=draws, seed=9)
    pos, y = _pos_and_target(batch)
    for i in range(tr.src.size(0)):
        n = int(tr.src_lengths[i])
        for t in tr.step_mask[i].nonzero()[:, 0].tolist():
            w = soft_words(9, batch.example_ids, [i], t, n, len(VOCAB), draws)[0]
            j, e = int(pos[i, t]), int(y[i, t])
            for o in range(2):
                keep = float(q[o, i, t, j])
                zeroed = sum(float(w[d, 0, j, e]) >= (1 - keep) * 2**32 for d in range(draws))
                kept = sum(float(w[d, 1, j, e]) < keep * 2**32 for d in range(draws))
                assert got[0, o, i, t] == pytest.approx(zeroed / draws, abs=1e-12)
                assert got[1, o, i, t] == pytest.approx(kept / draws, abs=1e-12)


def test_many_draws_approach_the_keep_probability():
    """The expected Soft-NC of the read element is q (zeroed with probability q), as Soft-NS:
    with 400 draws within 4 binomial standard deviations (≤ 0.1)."""
    model = _ReadsOneElement()
    batch = _copy_batch(model, n_ex=2)
    tr = batch.trace
    q = torch.full((1, *tr.step_mask.shape, tr.src.size(1)), 0.3, dtype=torch.float64)
    got = soft_drops(model, batch, q, draws=400, seed=2)
    real = tr.step_mask
    assert (got[:, 0][:, real] - 0.3).abs().max() < 0.1
    assert (got[:, 0][:, real] - 0.3).abs().mean() < 0.05


@pytest.mark.parametrize(
    ("attention", "flow"), [("multihead", "transformer"), ("additive", "luong")]
)
def test_batched_soft_drops_equal_the_plain_loop(attention, flow):
    model = sharpen(tiny_model(attention, flow), 3.0)
    batch = one_batch(model, make_examples(4), "greedy")
    tr = batch.trace
    q = normalised_scores(
        torch.stack([tr.attention.mean(1), torch.rand(tr.attention.mean(1).shape)]), tr.pad_mask
    )
    got = soft_drops(model, batch, q, draws=2, seed=5, chunk_rows=16)  # several chunks
    want = reference_soft_drops(model, batch, q, draws=2, seed=5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5, equal_nan=True)
    assert torch.isfinite(got).sum() >= 4  # steps whose source matters are computed


def test_soft_ns_of_several_draws_is_the_mean_of_each_draws_own(monkeypatch):
    """Soft-NS (and Soft-NC) over D draws is the mean of the values under each single mask: the
    paper's one-mask form for any D, clipped per draw, so the expectation does not depend on D
    (a mean of Soft-S clipped after averaging fell with D: 0.36 → 0.25 from D = 1 to 16 on a
    sharpened Transformer, Jensen). Each draw alone is scored by handing ``soft_drops`` that draw's
    words as a one-draw stream."""
    import attnstudy.analysis.ablations.faithfulness as faith

    model = sharpen(tiny_model("multihead", "transformer"), 3.0)
    batch = one_batch(model, make_examples(4), "greedy")
    tr = batch.trace
    q = normalised_scores(
        torch.stack([tr.attention.mean(1), torch.rand(tr.attention.mean(1).shape)]), tr.pad_mask
    )
    three = soft_drops(model, batch, q, draws=3, seed=5)
    real = soft_words

    def one_draw(d):
        def words(seed, ids, members, t, n, dim, draws, device=None):
            return real(seed, ids, members, t, n, dim, 3, device=device)[:, d : d + 1]

        return words

    singles = []
    for d in range(3):
        monkeypatch.setattr(faith, "soft_words", one_draw(d))
        singles.append(faith.soft_drops(model, batch, q, draws=1, seed=5))
    monkeypatch.setattr(faith, "soft_words", real)
    # to float32 noise: three draws traced as one batch against one at a time (bit-equal on AVX2
    # machines, up to 1.5e-6 apart on an AVX-512/AMX CPU, whose kernels depend on the batch size)
    torch.testing.assert_close(three, sum(singles) / 3, rtol=0, atol=1e-5, equal_nan=True)
    # the draws disagree somewhere (three copies of one mask would test nothing)
    ns = torch.stack([x[1] for x in singles])
    finite = torch.isfinite(ns).all(0)
    assert (ns.std(0)[finite] > 1e-3).any()  # well above the tolerance


def _soft_cfg(rankings, draws=4, **more):
    return AblationConfig(
        ablations=["faithfulness"],
        seed=11,
        faithfulness={"rankings": rankings, "soft_draws": draws, **more},
    )


def _soft(frame):
    return frame[[c for c in frame.columns if "soft" in c]]


def test_an_example_alone_equals_the_same_example_in_a_batch():
    model = _ReadsOneElement()
    batch = _copy_batch(model)
    cfg = _soft_cfg(["attention", "leave_one_out", "random"])
    whole = call("faithfulness", model, batch, cfg)
    for i in range(len(batch.examples)):
        one = PreparedBatch(
            [batch.examples[i]],
            batch.trace.select(torch.tensor([i])),
            "reference",
            VOCAB,
            VOCAB,
        )
        alone = call("faithfulness", model, one, cfg)
        mine = whole[whole["example_id"] == batch.example_ids[i]].reset_index(drop=True)
        pd.testing.assert_frame_equal(_soft(alone), _soft(mine))


def test_streams_are_each_steps_own_and_shared_by_the_rankings():
    """The words of a step come from its own stream (seed, example id, step,
    "faithfulness_soft"): the first draws do not depend on how many are drawn, two steps or two
    examples differ; a ranking's numbers do not depend on which other rankings are configured
    (every ranking reads the same words: common random numbers)."""
    ids = ["a", "b"]
    five = soft_words(4, ids, [0], 2, 3, 7, draws=5)
    assert torch.equal(soft_words(4, ids, [0], 2, 3, 7, draws=2), five[:, :2])
    assert not torch.equal(soft_words(4, ids, [0], 3, 3, 7, draws=5), five)
    assert not torch.equal(soft_words(4, ids, [1], 2, 3, 7, draws=5), five)
    assert not torch.equal(soft_words(5, ids, [0], 2, 3, 7, draws=5), five)
    model = sharpen(tiny_model("multihead", "transformer"), 3.0)
    batch = one_batch(model, make_examples(5), "greedy")
    alone = call("faithfulness", model, batch, _soft_cfg(["attention"]))
    both = call("faithfulness", model, batch, _soft_cfg(["leave_one_out", "attention"]))
    for mode in ("comprehensiveness", "sufficiency"):
        col = f"faithfulness_soft_{mode}_attention"
        pd.testing.assert_series_equal(alone[col], both[col])
        assert alone[col].notna().sum() >= 4


def test_keep_probabilities_are_min_max_normalised_scores():
    pad = torch.tensor([[False, False, False, True]])
    scores = torch.tensor([[[0.2, 0.6, 0.4, 9.0], [1.0, 1.0, 1.0, 0.0], [0.0, 5e-5, 0.0, 0.0]]])
    q = normalised_scores(scores, pad)
    torch.testing.assert_close(
        q,
        torch.tensor([[[0.0, 1.0, 0.5, 0.0], [0.0] * 4, [0.0] * 4]], dtype=torch.float64),
    )  # padding ignored and 0; a constant row and one spanning < 1e-4 rank nothing


def test_random_scores_rank_as_the_random_orders():
    model = sharpen(tiny_model("multihead", "luong"))
    batch = one_batch(model, make_examples(), "greedy")
    tr = batch.trace
    scores = random_scores(tr, 3, 4, batch.example_ids)
    orders = random_orders(tr, 3, 4, batch.example_ids)
    for i in range(3):
        got = order_of(scores[i], tr.pad_mask)
        assert torch.equal(got[tr.step_mask], orders[i][tr.step_mask])


def test_known_answers_through_the_entry_and_a_model_without_embeddings():
    """Through the entry: attention (the read position, one-hot) has Soft-NC = Soft-NS = 1 at
    every step with two or more source tokens; a model without ``embed`` has no soft numbers, with
    the reason."""
    model = _ReadsOneElement()
    batch = _copy_batch(model)
    out = call("faithfulness", model, batch, _soft_cfg(["attention", "random"], n_random=2))
    ok = ~out["faithfulness_skipped"]
    for mode in ("comprehensiveness", "sufficiency"):
        assert (out.loc[ok, f"faithfulness_soft_{mode}_attention"] == 1.0).all()
        assert out.loc[~ok, f"faithfulness_soft_{mode}_attention"].isna().all()
        rand = out.loc[ok, f"faithfulness_soft_{mode}_random"]
        assert rand.between(0, 1).all() and rand.mean() < 0.9
    plain = call("faithfulness", _ReadsOne(), batch, _soft_cfg(["attention"]))
    assert plain["faithfulness_soft_comprehensiveness_attention"].isna().all()
    assert set(plain["faithfulness_soft_reason"]) == {
        "no source embeddings to mask (the gradients capability)"
    }
    # hard deletion is computed all the same
    assert plain["faithfulness_comprehensiveness_attention"].notna().any()


def test_soft_erasure_is_on_by_default_and_soft_draws_0_keeps_the_former_settings():
    """One draw by default (the authors' one mask per instance); ``soft_draws = 0`` leaves it out
    of the resolved settings, so a study stored before soft erasure existed keeps its key."""
    assert FaithfulnessParams().model_dump()["soft_draws"] == 1
    assert "soft_draws" not in FaithfulnessParams(soft_draws=0).model_dump()
    assert FaithfulnessParams(soft_draws=3).model_dump()["soft_draws"] == 3
    on = call("faithfulness", _ReadsOneElement(), _copy_batch(_ReadsOneElement()))
    assert "faithfulness_soft_comprehensiveness_attention" in on.columns
    off = AblationConfig(ablations=["faithfulness"], faithfulness={"soft_draws": 0})
    out = call("faithfulness", _ReadsOneElement(), _copy_batch(_ReadsOneElement()), off)
    assert not any("soft" in c for c in out.columns)


def test_the_verdict_says_where_soft_erasure_orders_the_rankings_otherwise():
    from attnstudy.analysis.catalogue import verdict_roles

    from attnstudy.verdict.findings import Estimate, ModelFacts, verdict

    key = "ablation/faithfulness/"

    def facts(soft_attention: float) -> ModelFacts:
        return ModelFacts(
            "copy additive",
            "additive",
            roles=verdict_roles(["faithfulness"]),
            stats={
                f"{key}comprehensiveness_attention": Estimate(0.4, 0.35, 0.5),
                f"{key}comprehensiveness_leave_one_out": Estimate(0.2, 0.1, 0.3),
                f"{key}comprehensiveness_random": Estimate(0.1, 0.05, 0.15),
                f"{key}soft_comprehensiveness_attention": Estimate(soft_attention, 0.2, 0.6),
                f"{key}soft_comprehensiveness_leave_one_out": Estimate(0.5, 0.45, 0.55),
                f"{key}soft_comprehensiveness_random": Estimate(0.1, 0.05, 0.15),
            },
        )

    text = verdict(facts(0.3)).text
    assert "The most faithful ranking is attention" in text  # deletion's sentence, unchanged
    assert (
        "By soft erasure, the rankings' order is leave-one-out 0.5 [0.45, 0.55], attention 0.3 "
        "[0.2, 0.6], random 0.1 [0.05, 0.15]; the order by deletion differs for leave-one-out "
        "and attention (deletion puts attention higher; the intervals overlap)." in text
    )
    same = verdict(facts(0.58)).text  # 0.58 > 0.5: attention first again
    assert (
        "By soft erasure, the rankings' order is attention 0.58 [0.2, 0.6], leave-one-out 0.5 "
        "[0.45, 0.55], random 0.1 [0.05, 0.15], the same order as by deletion." in same
    )


def test_the_verdict_compares_soft_sufficiency_with_deletions_sufficiency():
    """A constructed table of each model's estimates: deletion's sufficiency is a drop (lower is
    more faithful), soft sufficiency higher is more faithful; the sentence says where their
    orders differ (here attention and input × gradient swap, the intervals apart in both), and
    that they agree where they do. Deletion's sufficiency gives no sentence of its own."""
    from attnstudy.analysis.catalogue import verdict_roles

    from attnstudy.verdict.findings import Estimate, ModelFacts, verdict

    key = "ablation/faithfulness/"

    def facts(soft_gradient: Estimate) -> ModelFacts:
        return ModelFacts(
            "g2p additive",
            "additive",
            roles=verdict_roles(["faithfulness"]),
            stats={
                # deletion: attention keeps most of p(y_t) (the smallest drop), random least
                f"{key}sufficiency_attention": Estimate(0.338, 0.313, 0.361),
                f"{key}sufficiency_input_x_gradient": Estimate(0.399, 0.375, 0.421),
                f"{key}sufficiency_random": Estimate(0.633, 0.615, 0.65),
                f"{key}soft_sufficiency_attention": Estimate(0.547, 0.508, 0.593),
                f"{key}soft_sufficiency_input_x_gradient": soft_gradient,
                f"{key}soft_sufficiency_random": Estimate(0.513, 0.488, 0.54),
            },
        )

    text = verdict(facts(Estimate(0.641, 0.605, 0.678))).text
    assert (
        "By soft erasure (sufficiency), the rankings' order is input × gradient 0.641 [0.605, "
        "0.678], attention 0.547 [0.508, 0.593], random 0.513 [0.488, 0.54]; the order by "
        "deletion (sufficiency) differs for input × gradient and attention (deletion "
        "(sufficiency) ranks attention as more faithful; the intervals are apart in both)."
    ) in text
    assert "By deletion (sufficiency)" not in text  # the reference says nothing of its own
    same = verdict(facts(Estimate(0.53, 0.5, 0.56))).text  # between attention and random
    assert (
        "By soft erasure (sufficiency), the rankings' order is attention 0.547 [0.508, 0.593], "
        "input × gradient 0.53 [0.5, 0.56], random 0.513 [0.488, 0.54], the same order as by "
        "deletion (sufficiency)."
    ) in same
