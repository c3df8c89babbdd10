"""What each importance measure costs, counted (docs/attribution.md, "Cost per decoder step").

A counting wrapper around a tiny recurrent model counts, for one example of n = 5 distinct source
tokens and T = 6 decoder steps (the reference prefix: five tokens and <eos>):

* forward passes: rows of ``trace`` calls (each a teacher-forced pass over a prefix, with
  ``steps`` the prefix positions they cover);
* local recomputations: rows of ``logits_given_attention`` (one step's output recomputed from its
  traced prefix state with replacement attention);
* backward passes: one step's output differentiated for one row, i.e. each
  ``torch.autograd.grad`` call times its rows times the steps it batches (``is_grads_batched``).

The docs' table is these numbers divided by T, with n and T kept as symbols.
"""

from __future__ import annotations

import pytest
import torch
from analysis_testkit import NAMES, call, one_batch, sharpen, tiny_model
from attnstudy.analysis.ablations.importance import loo_importance
from attnstudy.analysis.catalogue import AblationConfig

from attnstudy.data.synthetic import synthetic_example

N, T = 5, 6


class Counts:
    """Counting wrappers on one model's ``trace`` and ``logits_given_attention`` and on
    ``torch.autograd.grad`` (while :meth:`counting` is active)."""

    def __init__(self, model, monkeypatch):
        self.forward = self.forward_steps = self.local = self.backward = 0
        trace, local, grad = model.trace, model.logits_given_attention, torch.autograd.grad

        def counted_trace(src, src_lengths, tgt_in, *args, **kwargs):
            self.forward += src.size(0)
            self.forward_steps += src.size(0) * tgt_in.size(1)
            return trace(src, src_lengths, tgt_in, *args, **kwargs)

        def counted_local(tr, weights, chunk_rows=4096, steps=None, **kwargs):
            mask = tr.step_mask if steps is None else steps & tr.step_mask
            self.local += int(mask.sum()) * (1 if weights.dim() == 4 else weights.size(1))
            return local(tr, weights, chunk_rows, steps, **kwargs)

        def counted_grad(outputs, inputs, grad_outputs=None, *args, **kwargs):
            rows = inputs.size(0) if isinstance(inputs, torch.Tensor) else inputs[0].size(0)
            batched = kwargs.get("is_grads_batched", False)
            self.backward += rows * (grad_outputs.size(0) if batched else 1)
            return grad(outputs, inputs, grad_outputs, *args, **kwargs)

        monkeypatch.setattr(model, "trace", counted_trace)
        monkeypatch.setattr(model, "logits_given_attention", counted_local)
        monkeypatch.setattr(torch.autograd, "grad", counted_grad)

    def totals(self) -> tuple[int, int, int, int]:
        return self.forward, self.forward_steps, self.local, self.backward


@pytest.fixture
def counted(monkeypatch):
    model = sharpen(tiny_model("additive", "bahdanau"), 3.0)
    ex = synthetic_example("copy", [0, 1, 2, 3, 4], NAMES, "cost/0")  # n distinct tokens
    batch = one_batch(model, [ex], "reference")
    assert int(batch.trace.src_lengths[0]) == N and int(batch.trace.step_mask.sum()) == T
    return model, batch, Counts(model, monkeypatch)


def _run(model, batch, name, **settings):
    return call(name, model, batch, AblationConfig(ablations=[name], **settings))


# (entry, its settings) → (forward passes, prefix positions they cover, local
# recomputations, backward passes), for one example of n = 5 tokens and T = 6 steps
COSTS = {
    # one trace with gradients; one backward per step
    ("saliency", ()): (1, T, 0, T),
    ("input_x_gradient", ()): (1, T, 0, T),
    # m = 8 path points traced with gradients, the input and the baseline for the delta; m
    # backward passes per step (one vmapped backward over the m rows)
    ("integrated_gradients", (("n_steps", 8),)): (8 + 2, (8 + 2) * T, 0, 8 * T),
    # one trace per replaced token
    ("occlusion", ()): (N, N * T, 0, 0),
    # the step recomputed once unchanged and once per replacement
    ("uniform", ()): (0, 0, 2 * T, 0),
    ("erase_max", ()): (0, 0, 2 * T, 0),
    # n + 1 local recomputations per step; leave-one-out's n traces and input × gradient's
    # trace and backward per step for its τ
    ("value_zeroing", ()): (N + 1, (N + 1) * T, (N + 1) * T, T),
    # hard deletion of the attention ranking: k ∈ {1, 3} for n = 5 (⌈f·n⌉ of the fractions,
    # a repeated k once), deleted and kept alone: 4 traces a step, and the unmodified trace
    ("faithfulness", (("rankings", ("attention",)), ("soft_draws", 0))): (
        1 + 4 * T,
        (1 + 4 * T) * T,
        0,
        0,
    ),
    # the default adds soft erasure with one draw: 2 traces a step of the prefix up to t, and
    # the unmodified and all-zero traces
    ("faithfulness", (("rankings", ("attention",)),)): (
        1 + 4 * T + 2 + 2 * T,
        (1 + 4 * T) * T + 2 * T + 2 * sum(t + 1 for t in range(T)),
        0,
        0,
    ),
    # and soft erasure with D = 2 draws: 2·D traces a step of the prefix up to t, and the
    # unmodified and all-zero traces
    ("faithfulness", (("rankings", ("attention",)), ("soft_draws", 2))): (
        1 + 4 * T + 2 + 2 * 2 * T,
        (1 + 4 * T) * T + 2 * T + 2 * 2 * sum(t + 1 for t in range(T)),
        0,
        0,
    ),
}


@pytest.mark.parametrize(("entry", "want"), list(COSTS.items()), ids=lambda x: str(x))
def test_cost_of_each_measure(counted, entry, want):
    model, batch, counts = counted
    name, settings = entry
    _run(model, batch, name, **({name: dict(settings)} if settings else {}))
    assert counts.totals() == want


def test_leave_one_out_traces_each_deletion_once(counted):
    model, batch, counts = counted
    loo_importance(model, batch)
    assert counts.totals() == (N, N * T, 0, 0)
