"""Norm-based analysis (Kobayashi et al. 2020): ‖α_j f(x_j)‖ beside α_j, checked by hand."""

from __future__ import annotations

import torch
from analysis_testkit import call, make_examples, one_batch, sharpen, tiny_model
from attnstudy.analysis.ablations.norm import norm_weights
from attnstudy.analysis.catalogue import AblationConfig, get_ablation, list_ablations


def test_norm_ablation_is_registered_but_not_in_the_default_battery():
    assert "norm" in list_ablations() and "norm" not in list_ablations(default_only=True)
    assert get_ablation("norm").requires == ("attention", "values")


def test_weighted_value_vectors_sum_to_the_context():
    """Σ_j α_tj f(x_j) over positions (and heads) is the context the model computes: f is right."""
    for attention in ("additive", "general", "multihead", "scaled_dot"):
        model = sharpen(tiny_model(attention, "luong"))
        batch = one_batch(model, make_examples(5))
        tr = batch.trace
        values = model.value_vectors(tr)  # (B, H, T_x, d)
        summed = torch.einsum("bhyx,bhxd->byd", tr.attention, values)
        context = model.attention.context(tr.attention, tr.memory)  # (B, T_y, C)
        torch.testing.assert_close(summed, context, atol=1e-6, rtol=0)


def test_norm_weights_by_hand():
    model = sharpen(tiny_model("additive"))
    batch = one_batch(model, make_examples(4))
    tr = batch.trace
    norms = norm_weights(model, batch)
    b, t = 2, 1
    n = int(tr.src_lengths[b])
    by_hand = torch.stack(
        [(tr.attention[b, 0, t, j] * tr.memory.values[b, 0, j]).norm() for j in range(n)]
    )
    torch.testing.assert_close(norms[b, t, :n], by_hand, atol=1e-6, rtol=0)
    assert (norms[b, t, n:] == 0).all()


def test_norm_table_taus_are_defined_and_bounded():
    model = sharpen(tiny_model("multihead", "luong"))
    batch = one_batch(model, [ex for ex in make_examples(9) if len(ex.src) >= 3])
    out = call("norm", model, batch, AblationConfig(ablations=["norm"]))
    assert {
        "norm_tau_attn_norm",
        "norm_tau_norm_loo",
        "norm_tau_attn_loo",
        "norm_argmax_agrees",
    } <= set(out.columns)
    tau = out["norm_tau_attn_norm"].dropna()
    assert len(tau) > 0 and tau.between(-1, 1).all()
    assert set(out["norm_argmax_agrees"].dropna().unique()) <= {0.0, 1.0}
    none = tiny_model("none")
    from attnstudy.analysis.contract import capabilities

    assert "values" not in capabilities(none) and "values" in capabilities(model)
