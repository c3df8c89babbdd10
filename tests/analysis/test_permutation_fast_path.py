"""The batched permutation drawing of :func:`permute` against its per-step loop: the
same generator calls in the same order (legacy) or each step's counter-based stream drawn alone
(counter-1), so the same permutations, bit for bit; and the permutation
ablation's fast parts (its argsort, median, TVD and flip) against their plain forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from attnstudy.analysis import random_streams
from attnstudy.analysis.ablations.permutation import (
    nan_median,
    tvd_and_flips,
    with_reference,
)
from attnstudy.analysis.batch import StepStreams, step_generator, step_seed
from attnstudy.analysis.interventions import (
    _argsort_draws,
    _draw_steps,
    _permutation_index_loop,
    permutation_index,
    permute,
)
from attnstudy.analysis.random_streams import CounterStreams
from attnstudy.analysis.step_scores import step_score


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


@pytest.mark.parametrize(
    "coarse",
    [
        lambda u: (u * 4).floor() / 4,  # on the 2^-24 grid: the numpy sort, tied rows by torch
        lambda u: (u * 3).floor(),  # off [0, 1): torch.argsort throughout
    ],
)
def test_ties_between_draws_sort_as_in_the_per_step_argsort(monkeypatch, coarse):
    """Draws with many ties (a coarse fake ``torch.rand`` and ``Tensor.uniform_``, what the
    per-step reference and the batched draw call): the batched argsort still gives each step
    the order its own argsort gives."""
    real_rand, real_uniform = torch.rand, torch.Tensor.uniform_

    def rand(*shape, generator=None, device=None):
        return coarse(real_rand(*shape, generator=generator, device=device))

    def uniform_(self, *args, generator=None):
        return self.copy_(coarse(real_uniform(self, *args, generator=generator)))

    monkeypatch.setattr(torch, "rand", rand)
    monkeypatch.setattr(torch.Tensor, "uniform_", uniform_)
    weights, valid, steps = _case(3, t_x=12)
    valid[3] = True

    def gen(b, t):
        return step_generator(0, f"e{b}", t, "permutation")

    fast = permute(weights, valid, 20, gen, steps)
    slow_w, slow_id = _loop_permute(weights, valid, 20, gen, steps)
    assert torch.equal(fast.weights, slow_w) and torch.equal(fast.identity, slow_id)


def _drawn(seed: int, lengths: list[int], p: int = 6, h: int = 2, t_x: int = 9):
    """:func:`_draw_steps`' buffer for steps of the given valid lengths (own generators)."""
    todo = torch.stack([torch.arange(len(lengths)), torch.zeros(len(lengths), dtype=torch.long)], 1)
    lengths = torch.tensor(lengths)

    def gen(b, t):
        return step_generator(seed, f"e{b}", t, "permutation")

    return _draw_steps(todo, lengths, p, h, t_x, gen), lengths


def _argsort_loop(draw, lengths):
    """Per step, ``argsort`` of its k draws then k … T_x − 1; identity where 0 … T_x − 1."""
    t_x = draw.size(-1)
    order = torch.arange(t_x).expand(draw.shape).clone()
    for s, k in enumerate(lengths.tolist()):
        order[s, ..., :k] = draw[s, ..., :k].argsort(-1)
    return order, (order == torch.arange(t_x)).all(-1).all(-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_argsort_of_the_draws_is_each_steps_own_argsort(seed):
    draw, lengths = _drawn(seed, [2, 9, 5, 2, 3, 7, 9, 4], p=50)
    assert (draw[..., :2] < 1).all() and torch.equal(draw[0, ..., 2:], draw[3, ..., 2:])
    order, identity = _argsort_draws(draw, lengths)
    want_order, want_identity = _argsort_loop(draw, lengths)
    assert torch.equal(order, want_order) and torch.equal(identity, want_identity)
    assert identity[0].any() and not identity[1].any()  # k = 2 draws the identity often


@pytest.mark.parametrize(
    "coarse, t_x",
    [
        (lambda u: (u * 4).floor() / 4, 9),  # on the 2^-24 grid, many ties: torch for those rows
        (lambda u: (u * 4).floor() / 4, 40),  # rows torch.argsort does not sort stably
        (lambda u: (u * 3).floor(), 9),  # outside [0, 1): torch.argsort throughout
        (lambda u: u, 70),  # more than 64 columns: torch.argsort throughout
        (lambda u: u / 3, 9),  # off the grid: truncated, in order (a shared integer: torch)
    ],
)
def test_argsort_of_the_draws_falls_back_where_the_keys_cannot_decide(coarse, t_x):
    draw, lengths = _drawn(3, [2, t_x, 5, t_x - 1], p=40, t_x=t_x)
    for s, k in enumerate(lengths.tolist()):
        draw[s, ..., :k] = coarse(draw[s, ..., :k])
    order, identity = _argsort_draws(draw, lengths)
    want_order, want_identity = _argsort_loop(draw, lengths)
    assert torch.equal(order, want_order) and torch.equal(identity, want_identity)


def test_step_streams_are_the_step_generators():
    ids = ["a", "b/1", "c", "d", "e", "f"]
    streams = StepStreams(7, ids, "permutation", start=4)
    for b, t in [(0, 0), (1, 2), (2, 5)]:
        want = torch.rand(3, 5, generator=step_generator(7, ids[b], 4 + t, "permutation"))
        assert torch.equal(torch.rand(3, 5, generator=streams(b, t)), want)
        assert streams.seed_of(b, t) == step_seed(7, ids[b], 4 + t, "permutation")
    # permute reseeds one generator from seed_of: the same permutations as a generator per step
    weights, valid, steps = _case(4)
    fast = permute(weights, valid, 30, streams, steps)
    slow = permute(weights, valid, 30, lambda b, t: streams(b, t), steps)
    assert torch.equal(fast.weights, slow.weights) and torch.equal(fast.identity, slow.identity)


@pytest.mark.parametrize("seed", [0, 1])
def test_permutation_index_is_the_loops_at_the_permuted_steps(seed):
    weights, valid, steps = _case(seed)
    h = weights.size(1)

    def gen(b, t):
        return step_generator(seed, f"e{b}", t, "permutation")

    got = permutation_index(valid, steps, 25, h, gen)
    index, identity = _permutation_index_loop(valid, steps, 25, h, gen)
    permuted = steps & (valid.sum(-1) >= 2)[:, None]
    assert torch.equal(torch.stack([got.b, got.t], 1), permuted.nonzero())
    assert torch.equal(got.index, index[got.b, :, :, got.t])
    assert torch.equal(got.identity, identity[got.b, :, got.t])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [1, 3, 40])
@pytest.mark.parametrize("padding", ["anywhere", "right"])
def test_counter_streams_permute_equals_the_per_step_loop(seed, n, padding):
    """Counter-based streams (rng = "counter-1"): the batched draw (one Philox call, one sort)
    gives each step the permutations of its own stream drawn alone."""
    weights, valid, steps = _case(seed)
    if padding == "right":
        valid = torch.arange(7) < torch.tensor([0, 1, 2, 7, 5, 3])[:, None]
        weights = weights.masked_fill(~valid[:, None, None], 0.0)
    streams = CounterStreams(seed, [f"e{b}" for b in range(6)], "permutation", start=2)
    fast = permute(weights, valid, n, streams, steps)
    slow_w, slow_id = _loop_permute(weights, valid, n, streams, steps)
    assert torch.equal(fast.weights, slow_w) and torch.equal(fast.identity, slow_id)
    if n == 40:
        assert not fast.identity[3][:, steps[3]].all()  # a real permutation happened
    got = permutation_index(valid, steps, n, weights.size(1), streams)
    index, identity = _permutation_index_loop(valid, steps, n, weights.size(1), streams)
    assert torch.equal(got.index, index[got.b, :, :, got.t])
    assert torch.equal(got.identity, identity[got.b, :, got.t])


def test_counter_permutations_are_rows_p_times_h_plus_h_of_the_steps_stream():
    """Step (b, t)'s replacement p, head h: row p·H + h of its stream (seed, id, start + t,
    "permutation"), the stable argsort of that row's words; the same in a batch of one."""
    weights, valid, steps = _case(1)
    valid[3] = True
    streams = CounterStreams(5, [f"e{b}" for b in range(6)], "permutation", start=1)
    out = permute(weights, valid, 4, streams, steps)
    t = int(steps[3].nonzero()[0, 0])
    key = np.array([random_streams.stream_key(5, "e3", 1 + t, "permutation")], np.uint64)
    words = random_streams.words(key, 4 * 2 * 7)[0].reshape(4, 2, 7)
    perm = torch.from_numpy(np.argsort(words, axis=-1, kind="stable"))
    assert torch.equal(out.weights[3, :, :, t], weights[3, :, t].expand(4, 2, 7).gather(-1, perm))
    alone = permute(weights[3:4], valid[3:4], 4, CounterStreams(5, ["e3"], "permutation", 1))
    assert torch.equal(alone.weights[0, :, :, t], out.weights[3, :, :, t])


def test_nan_median_is_numpys_nanmedian():
    g = torch.Generator().manual_seed(0)
    values = torch.rand(60, 10, generator=g, dtype=torch.float64)
    values[values < 0.3] = float("nan")  # odd and even counts, one or none left
    values[5] = float("nan")
    values[6, 1:] = float("nan")
    values[7, :] = 0.25  # equal values
    with pytest.warns(RuntimeWarning):  # the all-NaN row
        want = np.nanmedian(values.numpy(), axis=1)
    np.testing.assert_array_equal(nan_median(values).numpy(), want)
    assert np.isnan(want[5]) and want[6] == values[6, 0]


def test_tvd_and_flips_are_the_step_scores_block_by_block(monkeypatch):
    import attnstudy.analysis.ablations.permutation as permutation

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(11, 8, 6, generator=g) * 3
    logits[3, 2] = logits[3, 7]  # an unchanged row: TVD 0, no flip
    logits[4, :, :2] = 5.0  # ties for the maximum
    monkeypatch.setattr(permutation, "SCORE_BLOCK", 100)  # blocks of 2 steps
    d, flips = tvd_and_flips(logits)
    probs = torch.softmax(logits, -1)
    assert torch.equal(d, step_score("tvd", probs[:, :7], probs[:, 7:]))
    assert torch.equal(flips, step_score("flip", probs[:, :7], probs[:, 7:]).bool())
    assert d[3, 2] == 0 and not flips[3, 2] and flips.any()


def test_with_reference_appends_the_row_to_its_permutations():
    g = torch.Generator().manual_seed(2)
    rows = torch.rand(4, 2, 5, generator=g)
    index = torch.rand(4, 3, 2, 5, generator=g).argsort(-1)
    out = with_reference(rows, index)
    assert out.shape == (4, 4, 2, 5) and torch.equal(out[:, 3], rows)
    for s, p, h in [(0, 0, 0), (3, 2, 1), (2, 1, 0)]:
        assert torch.equal(out[s, p, h], rows[s, h][index[s, p, h]])
