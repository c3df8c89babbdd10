"""Interventions: one parametrised list, shared invariance checks (Captum test_config style)."""

from __future__ import annotations

import pytest
import torch
from attnstudy.analysis.batch import step_generator
from attnstudy.analysis.interventions import (
    erase_max,
    erase_ranked,
    given,
    one_hot,
    permute,
    ranks_of,
    uniform,
)

from attnstudy.models import masked_softmax

LENGTHS = [5, 3, 1, 2]
IDS = ["e0", "e1", "e2", "e3"]


def _attention(t_x: int = 5, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor(LENGTHS)
    pad_mask = torch.arange(t_x)[None, :] >= lengths[:, None]
    w = masked_softmax(torch.randn(4, 2, 3, t_x, generator=g) * 2, pad_mask)
    return w, ~pad_mask


def _desc_order(w: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    key = (-w).masked_fill(~valid[:, None, None, :], float("inf"))
    return key.sort(dim=-1, stable=True).indices


# name → fn(weights (B,H,T_y,T_x), valid (B,T_x), ids) -> (replacement (B,P,H,T_y,T_x), empty (B,P,H,T_y) | None)
def _permute(w, valid, ids):
    return permute(w, valid, 6, lambda b, t: step_generator(0, ids[b], t, "test")).weights, None


def _uniform(w, valid, ids):
    return uniform(valid, w).unsqueeze(1), None


def _erase_max(w, valid, ids):
    e = erase_max(w, valid)
    return e.weights.unsqueeze(1), e.empty.unsqueeze(1)


def _erase_ranked_prefixes(w, valid, ids):  # k = 0…T_x: includes erasing everything
    k = torch.arange(w.size(-1) + 1)
    e = erase_ranked(w.unsqueeze(1), _desc_order(w, valid).unsqueeze(1), k.view(1, -1, 1, 1))
    return e.weights, e.empty


def _one_hot(w, valid, ids):
    idx = w.masked_fill(~valid[:, None, None, :], -1).argmax(-1)
    return one_hot(idx, valid).unsqueeze(1), None


def _given(w, valid, ids):
    return given(w, valid, tuple(w.shape)).unsqueeze(1), None


INTERVENTIONS = {
    "permute": (_permute, True),
    "uniform": (_uniform, False),
    "erase_max": (_erase_max, False),
    "erase_ranked": (_erase_ranked_prefixes, False),
    "one_hot": (_one_hot, False),
    "given": (_given, True),
}


@pytest.fixture(params=list(INTERVENTIONS))
def intervention(request):
    return INTERVENTIONS[request.param]


def test_rows_sum_to_one_or_are_flagged_empty(intervention):
    fn, _ = intervention
    w, valid = _attention()
    rep, empty = fn(w, valid, IDS)
    assert torch.isfinite(rep).all()
    sums = rep.sum(-1)
    if empty is None:
        torch.testing.assert_close(sums, torch.ones_like(sums), atol=1e-6, rtol=0)
    else:
        assert (rep[empty] == 0).all()
        torch.testing.assert_close(sums[~empty], torch.ones_like(sums[~empty]), atol=1e-6, rtol=0)


def test_padding_stays_exactly_zero(intervention):
    fn, _ = intervention
    w, valid = _attention()
    rep, _ = fn(w, valid, IDS)
    pad = (~valid)[:, None, None, None, :].expand_as(rep)
    assert (rep[pad] == 0).all()


@pytest.mark.parametrize("name", [n for n, (_, keeps) in INTERVENTIONS.items() if keeps])
def test_permutation_keeps_the_multiset(name):
    fn, _ = INTERVENTIONS[name]
    w, valid = _attention()
    rep, _ = fn(w, valid, IDS)
    for b, n in enumerate(LENGTHS):
        orig = w[b, :, :, :n].sort(-1).values.unsqueeze(0).expand(rep.size(1), -1, -1, -1)
        torch.testing.assert_close(rep[b, :, :, :, :n].sort(-1).values, orig, atol=0, rtol=0)


def test_extra_padding_changes_nothing(intervention):
    fn, _ = intervention
    w, valid = _attention()
    w_pad = torch.cat([w, torch.zeros(*w.shape[:-1], 2)], -1)
    valid_pad = torch.cat([valid, torch.zeros(valid.size(0), 2, dtype=torch.bool)], -1)
    rep, empty = fn(w, valid, IDS)
    rep_pad, empty_pad = fn(w_pad, valid_pad, IDS)
    p = min(rep.size(1), rep_pad.size(1))  # erase_ranked's P axis grows with T_x
    torch.testing.assert_close(rep_pad[:, :p, ..., :-2], rep[:, :p], atol=1e-7, rtol=0)
    assert (rep_pad[..., -2:] == 0).all()
    if empty is not None:
        assert torch.equal(empty_pad[:, :p], empty[:, :p])


def test_batch_size_changes_nothing(intervention):
    fn, _ = intervention
    w, valid = _attention()
    rep, empty = fn(w, valid, IDS)
    for b in range(len(LENGTHS)):
        one, one_empty = fn(w[b : b + 1], valid[b : b + 1], IDS[b : b + 1])
        torch.testing.assert_close(one[0], rep[b], atol=0, rtol=0)
        if empty is not None:
            assert torch.equal(one_empty[0], empty[b])


# --- specific behaviour -------------------------------------------------------------------


def test_permute_flags_identity_and_skips_single_positions():
    w, valid = _attention()
    res = permute(w, valid, 40, lambda b, t: step_generator(1, IDS[b], t, "test"))
    assert res.weights.shape == (4, 40, 2, 3, 5) and res.identity.shape == (4, 40, 3)
    assert res.identity[2].all()  # one valid position: never permuted
    assert torch.equal(res.weights[2], w[2].unsqueeze(0).expand(40, -1, -1, -1))
    # two valid positions, two heads: identity with probability 1/4 — some, not all, of 40
    n_id = int(res.identity[3].sum())
    assert 0 < n_id < 120
    same = (res.weights[3] == w[3].unsqueeze(0)).all(-1).all(1)  # (P, T_y) every head unchanged
    distinct = (w[3, :, :, 0] != w[3, :, :, 1]).all(0)  # rows whose two weights differ
    assert torch.equal(same[:, distinct], res.identity[3][:, distinct])


def test_permute_is_seeded_per_example_and_step():
    w, valid = _attention()
    a = permute(w, valid, 5, lambda b, t: step_generator(0, IDS[b], t, "test")).weights
    b = permute(w, valid, 5, lambda b, t: step_generator(0, IDS[b], t, "test")).weights
    c = permute(w, valid, 5, lambda b, t: step_generator(1, IDS[b], t, "test")).weights
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_permute_rows_input():
    w, valid = _attention()
    rows = w[:, :, 0]  # (B, H, T_x)
    res = permute(rows, valid, 3, lambda b, t: step_generator(0, IDS[b], t, "test"))
    assert res.weights.shape == (4, 3, 2, 5) and res.identity.shape == (4, 3)


def test_uniform_values():
    valid = torch.tensor([[True, True, True, False], [True, False, False, False]])
    torch.testing.assert_close(
        uniform(valid), torch.tensor([[1 / 3, 1 / 3, 1 / 3, 0], [1, 0, 0, 0]])
    )


def test_erase_max_by_hand():
    w = torch.tensor([[[0.5, 0.3, 0.2, 0.0]], [[1.0, 0.0, 0.0, 0.0]]])  # (B=2, H=1, T_x=4)
    valid = torch.tensor([[True, True, True, False], [True, False, False, False]])
    e = erase_max(w, valid)
    torch.testing.assert_close(e.weights[0, 0], torch.tensor([0.0, 0.6, 0.4, 0.0]))
    assert e.empty.tolist() == [[False], [True]]
    assert (e.weights[1] == 0).all()


def test_erase_ranked_by_hand_and_erasing_padding_is_a_no_op():
    w = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.0, 0.0]])
    order = torch.tensor([[3, 1, 0, 2, 4, 5]])
    torch.testing.assert_close(
        erase_ranked(w, order, 2).weights, torch.tensor([[0.25, 0.0, 0.75, 0.0, 0.0, 0.0]])
    )
    everything = erase_ranked(w, order, 6)
    assert everything.empty.item() and (everything.weights == 0).all()
    padding_first = torch.tensor([[4, 5, 0, 1, 2, 3]])
    torch.testing.assert_close(erase_ranked(w, padding_first, 2).weights, w, atol=1e-7, rtol=0)


def test_ranks_of_inverts_an_order():
    order = torch.tensor([[2, 0, 3, 1]])
    assert ranks_of(order).tolist() == [[1, 3, 0, 2]]


def test_one_hot_rejects_padding():
    valid = torch.tensor([[True, True, False]])
    assert one_hot(torch.tensor([1]), valid).tolist() == [[0.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="padding"):
        one_hot(torch.tensor([2]), valid)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.tensor([[[[0.5, 0.4, 0.1]]]]), "padding"),
        (torch.tensor([[[[0.5, 0.4, 0.0]]]]), "sum to 1"),
        (torch.tensor([[[[1.5, -0.5, 0.0]]]]), "non-negative"),
    ],
)
def test_given_validates(bad, match):
    valid = torch.tensor([[True, True, False]])
    with pytest.raises(ValueError, match=match):
        given(bad, valid)


def test_given_checks_shape_and_accepts_a_p_axis():
    valid = torch.tensor([[True, True, False]])
    w = torch.tensor([[[[0.5, 0.5, 0.0]]]])
    assert given(w.unsqueeze(1).expand(1, 3, 1, 1, 3), valid, (1, 1, 1, 3)).shape == (1, 3, 1, 1, 3)
    with pytest.raises(ValueError, match="shape"):
        given(w, valid, (1, 2, 1, 3))
