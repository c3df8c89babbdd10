"""Value zeroing (Mohebbi et al. 2023): known answers and its equivalence with zeroing the value
tensors themselves on every family.

* With an affine readout (p_t = u + W c_t, c_t = Σ_h Σ_j α_thj v_hj) the score is the closed form
  TVD = ½ ‖W Σ_h α_thj v_hj‖₁;
* zeroing column j of the analysed rows (the entry's local intervention) equals zeroing value row j
  of the analysed layer's value tensor, on the recurrent models (h_j's term), the Transformer
  (its memory's values) and a Hugging Face Marian model (its cross-attention cache's values);
* the batched scores equal the one-row-at-a-time reference, and an example alone equals the same
  example in a batch;
* the per-step statistics by hand from given vectors.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from analysis_testkit import (
    VOCAB,
    hand_batch,
    hf_examples,
    make_examples,
    one_batch,
    sharpen,
    tiny_model,
)
from attnstudy.analysis.ablations.value_zeroing import (
    reference_scores,
    table,
    value_zeroing_scores,
    zeroed_rows,
)
from attnstudy.analysis.batch import prepare_batches
from attnstudy.analysis.divergences import tvd
from attnstudy.analysis.errors import NoAttentionError
from torch import nn

from attnstudy.models.attention import Memory


class AffineReadout(nn.Module):
    """p_t = u + W c_t with c_t = Σ_h Σ_j α_thj v_hj and 1ᵀW = 0 (so p_t sums to 1); its logits are
    log p_t, whose softmax is p_t again. The values ride in the trace's memory."""

    has_attention = True

    def __init__(self, u: torch.Tensor, w: torch.Tensor):
        super().__init__()
        self.register_buffer("u", u)  # (V,)
        self.register_buffer("w", w)  # (V, d)

    def logits_given_attention(self, trace, weights, chunk_rows=4096, steps=None):
        single = weights.dim() == 4
        a = weights.unsqueeze(1) if single else weights  # (B, P, H, T_y, T_x)
        c = torch.einsum("bphyx,bhxd->bpyd", a, trace.memory.values)
        probs = self.u + c @ self.w.T
        assert bool((probs > 0).all())  # the readout stays a distribution
        mask = trace.step_mask if steps is None else steps & trace.step_mask
        logits = probs.log() * mask[:, None, :, None]
        return logits[:, 0] if single else logits


def _affine_case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, h, t_y, t_x, d, v = 3, 2, 4, 5, 3, len(VOCAB)
    lengths = [5, 3, 1]
    pad = torch.arange(t_x)[None, :] >= torch.tensor(lengths)[:, None]
    scores = torch.randn(b, h, t_y, t_x, generator=g, dtype=torch.float64)
    att = torch.softmax(scores.masked_fill(pad[:, None, None, :], -math.inf), -1)
    values = torch.randn(b, h, t_x, d, generator=g, dtype=torch.float64)
    w = 0.004 * torch.randn(v, d, generator=g, dtype=torch.float64)
    w -= w.mean(0, keepdim=True)  # columns sum to 0
    u = torch.softmax(torch.randn(v, generator=g, dtype=torch.float64), -1)
    batch = hand_batch(att, lengths)
    tr = batch.trace
    tr = replace(tr, memory=Memory(None, values, tr.pad_mask))
    return AffineReadout(u, w), replace(batch, trace=tr), att, values, w, lengths


def test_affine_readout_gives_the_closed_form():
    model, batch, att, values, w, lengths = _affine_case()
    got = value_zeroing_scores(model, batch)["tvd"]
    # VZ_tj = ½ ‖W Σ_h α_thj v_hj‖₁, by hand
    want = torch.full_like(got, math.nan)
    for i, n in enumerate(lengths):
        for t in range(att.size(2)):
            for j in range(n):
                removed = sum(att[i, h, t, j] * values[i, h, j] for h in range(att.size(1)))
                want[i, t, j] = 0.5 * (w @ removed).abs().sum()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12, equal_nan=True)
    assert got[2, :, 1:].isnan().all() and not got[2, :, 0].isnan().any()  # padding only
    # and the plain reference agrees
    torch.testing.assert_close(
        reference_scores(model, batch), want, rtol=0, atol=1e-12, equal_nan=True
    )


def test_zeroed_rows_are_not_renormalised():
    att = torch.tensor([[[[0.5, 0.3, 0.2]]]], dtype=torch.float64)  # (1, 1, 1, 3)
    rows = zeroed_rows(att, 3)  # (1, 3, 1, 1, 3)
    assert rows[0, :, 0, 0].tolist() == [[0.0, 0.3, 0.2], [0.5, 0.0, 0.2], [0.5, 0.3, 0.0]]


def _literal(model, tr, j: int):
    """The trace with value row j of the analysed layer zeroed in every head (the family's own
    value tensor), for the recurrent models, the Transformer and a Hugging Face model."""
    if hasattr(tr, "cross_values"):  # Hugging Face: the cross-attention cache's values
        v = tr.cross_values.clone()
        v[:, tr.layer, :, j] = 0.0
        return replace(tr, cross_values=v)
    v = tr.memory.values.clone()
    if v.dim() == 5:  # the Transformer: (B, L, H, T_x, d_h)
        v[:, tr.layer, :, j] = 0.0
    else:  # recurrent: (B, H, T_x, d), h_j (multihead: each head's block)
        v[:, :, j] = 0.0
    return replace(tr, memory=replace(tr.memory, values=v))


def _check_literal(model, batch, atol):
    tr = batch.trace
    got = value_zeroing_scores(model, batch)["tvd"]
    with torch.no_grad():
        base = torch.softmax(model.logits_given_attention(tr, tr.attention).double(), -1)
        checked = 0
        for j in range(tr.src.size(1)):
            probs = torch.softmax(
                model.logits_given_attention(_literal(model, tr, j), tr.attention).double(), -1
            )
            want = tvd(probs, base)  # (B, T_y)
            real = tr.step_mask & (tr.src_lengths > j)[:, None]
            torch.testing.assert_close(got[..., j][real], want[real], rtol=0, atol=atol)
            checked += int(real.sum())
    assert checked >= 10 and float(got.nan_to_num().max()) > 1e-3  # values that move the output


@pytest.mark.parametrize(
    ("attention", "flow"),
    [("additive", "bahdanau"), ("multihead", "luong"), ("multihead", "transformer")],
)
def test_equals_zeroing_the_value_tensor(attention, flow):
    model = sharpen(tiny_model(attention, flow), 3.0)
    _check_literal(model, one_batch(model, make_examples(7), "greedy"), 1e-5)


def test_equals_zeroing_the_value_tensor_of_a_hugging_face_model(hf_model):
    vocab = hf_model.vocab
    batch = next(prepare_batches(hf_model, hf_examples(hf_model, 5), vocab, vocab, "greedy", 5))
    _check_literal(hf_model, batch, 1e-5)


@pytest.mark.parametrize(
    ("attention", "flow"), [("multihead", "luong"), ("multihead", "transformer")]
)
def test_batched_scores_equal_the_reference_and_an_example_alone(attention, flow):
    model = sharpen(tiny_model(attention, flow), 3.0)
    examples = make_examples(7)
    batch = one_batch(model, examples, "greedy")
    got = value_zeroing_scores(model, batch)["tvd"]
    torch.testing.assert_close(
        got, reference_scores(model, batch), rtol=0, atol=1e-5, equal_nan=True
    )
    for i, ex in enumerate(examples):
        alone = value_zeroing_scores(model, one_batch(model, [ex], "greedy"))["tvd"][0]
        n, t = int(batch.trace.src_lengths[i]), alone.size(0)
        # float32 noise of a batch of 7 against 1 (other matmul kernels: up to 1.2e-5 on an
        # AVX-512/AMX CPU)
        torch.testing.assert_close(got[i, :t, :n], alone[:, :n], rtol=0, atol=1e-4, equal_nan=True)


def test_the_none_model_is_refused():
    model = tiny_model("none")
    with pytest.raises(NoAttentionError, match="value_zeroing"):
        value_zeroing_scores(model, one_batch(model, make_examples(3)))


def test_per_step_statistics_by_hand():
    att = torch.tensor([[[[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]]]])  # (1, 1, 2, 3)
    batch = hand_batch(att, [3])
    vz = torch.tensor([[[0.05, 0.20, 0.01], [0.0, 0.4, 0.1]]], dtype=torch.float64)
    loo = torch.tensor([[[0.3, 0.2, 0.1], [0.1, 0.2, 0.3]]], dtype=torch.float64)
    frame = table(batch, {"attn": att.mean(1), "vz_tvd": vz, "loo": loo, "ixg": None})
    # step 0: attention's argmax is position 0, value zeroing's position 1
    assert frame["value_zeroing_argmax_agrees"].tolist() == [0.0, 1.0]
    assert frame["value_zeroing_tvd_top"].tolist() == [0.05, 0.4]
    # τ-b by hand: step 0 attention (0.6, 0.3, 0.1) against VZ (0.05, 0.2, 0.01): pairs (0,1)
    # discordant, (0,2) and (1,2) concordant → τ = 1/3; step 1 the same orders → τ = 1
    np.testing.assert_allclose(frame["value_zeroing_tau_attn"], [1 / 3, 1.0])
    np.testing.assert_allclose(frame["value_zeroing_tau_vz_loo"], [1 / 3, 1 / 3])
    # no input gradients: undefined, with the reason
    assert frame["value_zeroing_tau_vz_ixg"].isna().all()
    assert set(frame["value_zeroing_ixg_reason"]) == {"no input gradients"}
