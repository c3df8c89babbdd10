"""``aer_shift``: the hard link of target token t from the attention of step t + 1 (Chen et al.
2020), beside ``aer`` and ``aer_linked``; known answer: attention exactly one step late."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from analysis_testkit import call, hand_batch
from attnstudy.analysis.catalogue import AblationConfig, get_ablation
from attnstudy.analysis.suite import summarize

from attnstudy.data.alignment import Alignment
from attnstudy.data.types import Example

CFG = AblationConfig(bootstrap_resamples=50)


class _TraceOnly:
    has_attention = True


def _late_batch(heads: int = 1):
    """A 3-token copy (gold links i–i) whose attention is exactly one step late: step t looks at
    source t − 1 (step 0 at the last source token), the <eos> step at source 2."""
    n = 3
    rows = torch.full((n + 1, n), 0.1)
    for t in range(n + 1):
        rows[t, (t - 1) % n] = 0.8
    att = rows.view(1, 1, n + 1, n).expand(1, heads, n + 1, n).clone()
    gold = Alignment(sure=frozenset((i, i) for i in range(n)), possible=frozenset())
    ex = Example("late/0", ("a", "b", "c"), ("a", "b", "c"), gold)
    return hand_batch(att, [n], [ex], prefix="reference")


def _summary(out):
    return summarize(
        out.assign(prefix="reference"),
        pd.DataFrame({"example_id": out["example_id"].unique()}),
        ["alignment"],
        {"alignment": "reference"},
        CFG,
    )


@pytest.mark.parametrize("heads", [1, 2])
def test_attention_one_step_late_has_aer_shift_zero_and_plain_aer_one(heads):
    out = call("alignment", _TraceOnly(), _late_batch(heads), CFG)
    assert out["alignment_shift_n_hyp"].tolist() == [1, 1, 1, 0]  # <eos> counts nothing
    assert out["alignment_shift_n_hyp_sure"].tolist() == [1, 1, 1, 0]
    assert out["alignment_n_hyp_sure"].tolist() == [0, 0, 0, 0]
    s = _summary(out)
    assert s["ablation/alignment/aer_shift"] == pytest.approx(0.0)
    assert s["ablation/alignment/aer"] == pytest.approx(1.0)  # every plain link is wrong


def test_aer_shift_by_hand_and_no_link_without_a_next_step():
    """Step 1's row ties (no link for token 0); token 1's next step is <eos>, whose row links
    source 0 (a miss against sure 1–1); counts as Och & Ney's: 1 − (0 + 0) / (1 + 2)."""
    rows = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.7, 0.3]])
    gold = Alignment(sure=frozenset({(0, 0), (1, 1)}), possible=frozenset())
    ex = Example("h/0", ("a", "b"), ("a", "b"), gold)
    batch = hand_batch(rows.view(1, 1, 3, 2), [2], [ex], prefix="reference")
    out = call("alignment", _TraceOnly(), batch, CFG)
    assert out["alignment_shift_n_hyp"].tolist() == [0, 1, 0]
    assert out["alignment_shift_n_hyp_sure"].tolist() == [0, 0, 0]
    assert _summary(out)["ablation/alignment/aer_shift"] == pytest.approx(1.0)
    # a step that is not real (the example ends earlier) gives the token before it no link
    batch.trace.step_mask[0, 2] = False
    out = call("alignment", _TraceOnly(), batch, CFG)
    assert out["alignment_shift_n_hyp"].tolist() == [0, 0]


def test_aer_shift_is_in_the_report_beside_aer():
    stats = get_ablation("alignment").stats
    assert list(stats)[:3] == ["aer", "aer_linked", "aer_shift"]
    assert stats["aer_shift"].question == "aligns" and stats["aer_shift"].direction == "lower"
