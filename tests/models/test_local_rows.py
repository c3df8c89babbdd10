"""The recurrent family's fast local-intervention forms against their plain references:

* the Luong flow's ``logits_given_attention`` (W_c folded into the values, the state term once per
  step) against the context + ``Decoder.output_given_context`` of every row, one at a time;
* ``rows_given_attention`` (the adversarial search's row form) against the scatter form over
  ``logits_given_attention``, for both flows, with all heads and with one head analysed.
"""

import itertools

import pytest
import torch
from attnstudy.analysis._chunks import rows_given_attention
from test_contract import SRC, SRC_LEN, TGT_IN, TGT_OUT, tiny

import attnstudy.models.seq2seq as seq2seq
from attnstudy.config import ATTENTIONS

SCORES = [a for a in ATTENTIONS if a != "none"]


def _random_rows(tr, p, seed=0):
    """P random attention distributions per real step over the valid positions, (B, P, H, T_y, T_x)."""
    g = torch.Generator().manual_seed(seed)
    b, h, t_y, t_x = tr.attention.shape
    w = torch.rand(b, p, h, t_y, t_x, generator=g) * (~tr.pad_mask)[:, None, None, None, :]
    return w / w.sum(-1, keepdim=True)


def _context_reference(model, tr, weights):
    """Every row on its own: context = Σ α v, then the flow's output layers on that context."""
    b, p, _, t_y, _ = weights.shape
    out = torch.zeros(b, p, t_y, model.decoder.output.out_features)
    for bi, pi, ti in itertools.product(range(b), range(p), range(t_y)):
        if not tr.step_mask[bi, ti]:
            continue
        memory = tr.memory.index_select(torch.tensor([bi]))
        ctx = model.attention.context(weights[bi : bi + 1, pi, :, ti : ti + 1], memory)[:, 0]
        out[bi, pi, ti] = model.decoder.output_given_context(tr.prefix[bi : bi + 1, ti], ctx)[0]
    return out


@pytest.mark.parametrize("attention,cell", list(itertools.product(SCORES, ["gru", "lstm"])))
def test_luong_folded_kernel_equals_the_context_then_output_reference(attention, cell):
    model = tiny(attention, "luong", cell, layers=2)
    with torch.no_grad():
        tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
        weights = _random_rows(tr, p=4)
        fast = model.logits_given_attention(tr, weights, chunk_rows=5)
        ref = _context_reference(model, tr, weights)
    assert (fast - ref).abs().max() <= 1e-6
    assert fast.abs().max() > 0.05  # real logits were compared, not two zero tensors


CASES = [
    (attention, flow, head)
    for attention, flow in itertools.product(
        ["general", "additive", "multihead"], ["luong", "bahdanau"]
    )
    for head in ([-1, 1] if attention == "multihead" else [-1])
]


@pytest.mark.parametrize("attention,flow,head", CASES)
def test_row_form_equals_the_scatter_form(attention, flow, head, monkeypatch):
    model = tiny(attention, flow)
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    if head >= 0:
        tr = tr.with_head(head)  # one head of two: the scatter form fills in the other
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    weights = _random_rows(tr, p=3, seed=1).permute(0, 3, 1, 2, 4)[b_idx, t_idx]  # (N, K, H', T_x)
    weights.requires_grad_(True)
    fast = rows_given_attention(model, tr, b_idx, t_idx)(weights)
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), weights)
    monkeypatch.setattr(seq2seq, "ROW_VALUES_BUDGET", 0)  # past the budget: the scatter form
    slow = rows_given_attention(model, tr, b_idx, t_idx)(weights)
    (grad_slow,) = torch.autograd.grad(slow.square().sum(), weights)
    assert fast.shape == (len(b_idx), 3, model.decoder.output.out_features)
    assert (fast - slow).abs().max() <= 1e-6
    assert (grad_fast - grad_slow).abs().max() <= 1e-5
    assert fast.abs().max() > 0.05


@pytest.mark.parametrize("cell,layers", [("gru", 2), ("lstm", 1), ("lstm", 2)])
def test_bahdanau_folded_row_form_equals_the_scatter_form(cell, layers, monkeypatch):
    """The Bahdanau row form (context folded into the first layer's input weights and the
    readout, the cells written out) against the scatter form through ``nn.GRU``/``nn.LSTM``."""
    model = tiny("multihead", "bahdanau", cell, layers=layers)
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    weights = _random_rows(tr, p=3, seed=2).permute(0, 3, 1, 2, 4)[b_idx, t_idx]
    weights.requires_grad_(True)
    fast = rows_given_attention(model, tr, b_idx, t_idx)(weights)
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), weights)
    monkeypatch.setattr(seq2seq, "ROW_VALUES_BUDGET", 0)
    slow = rows_given_attention(model, tr, b_idx, t_idx)(weights)
    (grad_slow,) = torch.autograd.grad(slow.square().sum(), weights)
    assert (fast - slow).abs().max() <= 1e-6
    assert (grad_fast - grad_slow).abs().max() <= 1e-5
    assert fast.abs().max() > 0.05


def test_row_form_applies_only_where_it_is_exact_and_small():
    model = tiny("multihead", "luong")
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    assert model.rows_given_attention(tr, b_idx, t_idx) is not None
    assert model.rows_given_attention(tr.with_head(0), b_idx, t_idx) is None
    with pytest.raises(ValueError, match="'none' model"):
        tiny("none", "luong").rows_given_attention(tr, b_idx, t_idx)


@pytest.mark.parametrize("attention", ["general", "multihead"])
def test_the_plain_form_is_the_reference_of_the_folded_one(attention):
    model = tiny(attention, "luong", layers=2)
    with torch.no_grad():
        tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
        weights = _random_rows(tr, p=3, seed=2)
        folded = model.logits_given_attention(tr, weights)
        plain = model.logits_given_attention(tr, weights, plain=True)
    assert (folded - plain).abs().max() <= 1e-6 and plain.abs().max() > 0.05


VJP_CASES = [
    (attention, flow, cell, layers)
    for attention, flow in itertools.product(["additive", "multihead"], ["bahdanau", "luong"])
    for cell, layers in [("gru", 1), ("gru", 2), ("lstm", 1), ("lstm", 2)]
]


@pytest.mark.parametrize("attention,flow,cell,layers", VJP_CASES)
def test_written_out_vjp_equals_autograd_through_the_scatter_form(
    attention, flow, cell, layers, monkeypatch
):
    """The row forms' vector–Jacobian product (the chain rule written out through the output
    layers and, for Bahdanau, the GRU/LSTM cells) is autograd's gradient through ``nn.GRU`` /
    ``nn.LSTM`` and the plain output layers (the scatter form), to float64 rounding."""
    model = tiny(attention, flow, cell, layers=layers).double()
    tr = model.trace(SRC, SRC_LEN, TGT_IN, TGT_OUT)
    b_idx, t_idx = tr.step_mask.nonzero(as_tuple=True)
    weights = _random_rows(tr, p=3, seed=4).double().permute(0, 3, 1, 2, 4)[b_idx, t_idx]
    g = torch.randn(len(b_idx), 3, model.decoder.output.out_features, dtype=torch.float64)
    form = rows_given_attention(model, tr, b_idx, t_idx)
    logits, vjp = form.with_vjp(weights)
    grad = vjp(g)
    monkeypatch.setattr(seq2seq, "ROW_VALUES_BUDGET", 0)  # past the budget: the scatter form
    w = weights.clone().requires_grad_(True)
    slow = rows_given_attention(model, tr, b_idx, t_idx)(w)
    (grad_slow,) = torch.autograd.grad((g * slow).sum(), w)
    assert not logits.requires_grad and grad.shape == weights.shape
    torch.testing.assert_close(logits, slow.detach(), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(grad, grad_slow, atol=1e-12, rtol=1e-12)
    assert grad.abs().max() > 0.01  # a real gradient was compared (not zeros)
    # and the differentiable call of the same form gives the same gradient under autograd
    w = weights.clone().requires_grad_(True)
    (grad_call,) = torch.autograd.grad((g * form(w)).sum(), w)
    torch.testing.assert_close(grad, grad_call, atol=1e-12, rtol=1e-12)
