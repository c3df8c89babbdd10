"""The batched permutation drawing of :func:`permute` against its per-step loop: the
same generator calls in the same order, so the same permutations, bit for bit."""

from __future__ import annotations

import pytest
import torch
from attnstudy.analysis.batch import step_generator
from attnstudy.analysis.interventions import _permutation_index_loop, permute


def _case(seed: int, b: int = 6, h: int = 2, t_y: int = 4, t_x: int = 7):
    g = torch.Generator().manual_seed(seed)
    valid = torch.rand(b, t_x, generator=g) < 0.7  # padding anywhere, not only at the end
    valid[0] = False  # no valid position
    valid[1] = False
    valid[1, 3] = True  # one valid position: never permuted
    valid[2] = False
    valid[2, [1, 5]] = True  # two: identity drawn often
    valid[3] = True  # no padding
    weights = torch.rand(b, h, t_y, t_x, generator=g).masked_fill(~valid[:, None, None], 0.0)
    steps = torch.rand(b, t_y, generator=g) < 0.8
    return weights, valid, steps


def _loop_permute(weights, valid, n, gen_fn, steps):
    b, h, t_y, t_x = weights.shape
    index, identity = _permutation_index_loop(valid, steps, n, h, gen_fn)
    return weights.unsqueeze(1).expand(b, n, h, t_y, t_x).gather(-1, index), identity


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 3, 40])
def test_batched_permute_equals_the_per_step_loop(seed, n):
    weights, valid, steps = _case(seed)

    def gen(b, t):
        return step_generator(seed, f"e{b}", t, "permutation")

    fast = permute(weights, valid, n, gen, steps)
    slow_w, slow_id = _loop_permute(weights, valid, n, gen, steps)
    assert torch.equal(fast.weights, slow_w)
    assert torch.equal(fast.identity, slow_id)
    assert fast.identity[2][:, steps[2]].any()  # two valid positions: some identities drawn
    assert not fast.identity[3][:, steps[3]].all()  # a real permutation happened


@pytest.mark.parametrize("seed", [0, 1])
def test_right_padded_sources_equal_the_per_step_loop(seed):
    """Valid positions a prefix of every row (every trace's sources): the path without the slot
    scatter gives the loop's permutations too."""
    weights, _, steps = _case(seed)
    lengths = torch.tensor([0, 1, 2, 7, 5, 3])
    valid = torch.arange(7) < lengths[:, None]
    weights = weights.masked_fill(~valid[:, None, None], 0.0)

    def gen(b, t):
        return step_generator(seed, f"e{b}", t, "permutation")

    fast = permute(weights, valid, 20, gen, steps)
    slow_w, slow_id = _loop_permute(weights, valid, 20, gen, steps)
    assert torch.equal(fast.weights, slow_w) and torch.equal(fast.identity, slow_id)
    assert not fast.identity[3][:, steps[3]].all()


def test_one_shared_generator_is_drawn_in_the_same_step_order():
    weights, valid, steps = _case(5)
    fast = permute(weights, valid, 4, torch.Generator().manual_seed(9), steps)
    shared = torch.Generator().manual_seed(9)
    slow_w, slow_id = _loop_permute(weights, valid, 4, lambda _b, _t: shared, steps)
    assert torch.equal(fast.weights, slow_w) and torch.equal(fast.identity, slow_id)


def test_ties_between_draws_sort_as_in_the_per_step_argsort(monkeypatch):
    """Draws with many ties (a coarse fake ``torch.rand``): the batched argsort still gives each
    step the order its own argsort gives."""
    real_rand = torch.rand

    def coarse(*shape, generator=None, device=None):
        return (real_rand(*shape, generator=generator, device=device) * 3).floor()

    monkeypatch.setattr(torch, "rand", coarse)
    weights, valid, steps = _case(3, t_x=12)
    valid[3] = True

    def gen(b, t):
        return step_generator(0, f"e{b}", t, "permutation")

    fast = permute(weights, valid, 20, gen, steps)
    slow_w, slow_id = _loop_permute(weights, valid, 20, gen, steps)
    assert torch.equal(fast.weights, slow_w) and torch.equal(fast.identity, slow_id)
