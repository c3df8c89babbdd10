"""Attention vs gold alignment: AER (Och & Ney 2003), hard links, gold mass — by hand.

(Named ``test_attention_alignment.py``: ``tests/data/test_alignment.py`` already holds the
basename, and pytest's default import mode refuses two test modules with one basename.)
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_testkit import call, hand_batch, one_batch, tiny_model
from attnstudy.analysis.ablations.alignment import (
    aer,
    batch_to_pharaoh,
    hard_alignment,
    to_pharaoh,
)
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.suite import summarize

from attnstudy.data.alignment import Alignment
from attnstudy.data.types import Example

CFG = AblationConfig(bootstrap_resamples=50)


def test_aer_by_hand():
    hyp = {(0, 0), (1, 1), (2, 1)}
    sure = {(0, 0)}
    possible = {(1, 1)}  # S is added to P
    # |A∩S| = 1, |A∩P| = 2, |A| = 3, |S| = 1 → 1 − 3/4
    assert aer(hyp, sure, possible) == pytest.approx(0.25)
    assert aer(sure, sure, sure) == 0.0
    assert aer(set(), {(0, 0)}, set()) == 1.0
    assert math.isnan(aer(set(), set(), set()))


def test_hard_alignment_ties_give_no_link_and_padding_is_ignored():
    w = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8]])
    valid = torch.tensor([True, True, False])
    assert hard_alignment(w, valid) == {(1, 1)}


def _gold_batch(heads: int = 1):
    # example with a 2-token target (+ <eos> step) over a 3-token source
    rows = torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.2, 0.3], [0.2, 0.3, 0.5]])
    att = rows.view(1, 1, 3, 3).expand(2, heads, 3, 3).clone()
    if heads == 2:
        att[0, 1] = torch.tensor([[0.1, 0.2, 0.7], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
        att[0, 0] = 2 * rows - att[0, 1]  # head mean = rows
    gold = Alignment(sure=frozenset({(0, 0)}), possible=frozenset({(1, 1), (2, 1)}))
    examples = [
        Example("g/0", ("a", "b", "c"), ("a", "b"), gold),
        Example("g/1", ("a", "b", "c"), ("a", "b"), None),
    ]
    return hand_batch(att, [3, 3], examples, prefix="reference")


def test_run_alignment_by_hand():
    out = call("alignment", TraceOnly(), _gold_batch(), CFG)
    g0 = out[out["example_id"] == "g/0"]
    assert g0["alignment_n_hyp"].tolist() == [1, 1, 0]  # <eos> step has no gold link: left out
    assert g0["alignment_n_hyp_sure"].tolist() == [1, 0, 0]
    assert g0["alignment_n_hyp_possible"].tolist() == [1, 0, 0]
    assert g0["alignment_n_sure"].tolist() == [1, 0, 0]
    np.testing.assert_allclose(g0["alignment_gold_mass"], [0.6, 0.5, np.nan], atol=1e-6)
    np.testing.assert_allclose(g0["alignment_argmax_on_gold"], [1.0, 0.0, np.nan])
    g1 = out[out["example_id"] == "g/1"]
    assert g1["alignment_skipped"].all() and g1["alignment_n_hyp"].isna().all()
    # corpus AER from the summed counts: 1 − (1 + 1)/(2 + 1)
    table = out.assign(prefix="reference")
    summary = summarize(
        table,
        pd.DataFrame({"example_id": ["g/0", "g/1"]}),
        ["alignment"],
        {"alignment": "reference"},
        CFG,
    )
    assert summary["ablation/alignment/aer"] == pytest.approx(1 / 3)
    assert summary["ablation/alignment/gold_mass"] == pytest.approx(0.55)
    assert summary["ablation/alignment/argmax_on_gold"] == pytest.approx(0.5)
    assert summary["ablation/alignment/n_skipped"] == 3
    assert summary["ablation/alignment/gold_mass_n_undefined"] == 1  # the <eos> step
    # AER's sums get nothing from <eos> (|A| + |S| = 0): it is not computed on that step either
    assert summary["ablation/alignment/aer_n_undefined"] == 1
    assert summary["ablation/alignment/aer_linked"] == pytest.approx(
        1 / 3
    )  # every token has gold links


def test_standard_aer_counts_links_of_unaligned_target_tokens():
    """Och & Ney's AER is over every predicted link: a target token without gold links (a weekday,
    a century digit) still contributes its hard link to |A|. The linked-targets variant leaves it out.
    (The suite used to report only the linked variant, e.g. 0.026 where the standard AER is 0.154.)"""
    rows = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7], [0.4, 0.3, 0.3]])
    att = rows.view(1, 1, 4, 3)
    # target tokens 0 and 1 are linked (both hits); token 2 has no gold link; step 3 is <eos>
    gold = Alignment(sure=frozenset({(0, 0), (1, 1)}), possible=frozenset())
    batch = hand_batch(
        att, [3], [Example("u/0", ("a", "b", "c"), ("a", "b", "x"), gold)], prefix="reference"
    )
    out = call("alignment", TraceOnly(), batch, CFG)
    assert out["alignment_linked"].tolist() == [True, True, False, False]
    assert out["alignment_n_hyp"].tolist() == [
        1,
        1,
        1,
        0,
    ]  # the unlinked token's link counts, <eos> not
    summary = summarize(
        out.assign(prefix="reference"),
        pd.DataFrame({"example_id": ["u/0"]}),
        ["alignment"],
        {"alignment": "reference"},
        CFG,
    )
    # standard: |A| = 3, |S| = 2, |A∩S| = |A∩P| = 2 → 1 − 4/5; linked targets only: 1 − 4/4
    assert summary["ablation/alignment/aer"] == pytest.approx(0.2)
    assert summary["ablation/alignment/aer_linked"] == pytest.approx(0.0)
    assert all(math.isfinite(v) for v in summary.values())


def test_per_head_counts():
    out = call("alignment", TraceOnly(), _gold_batch(heads=2), CFG)
    g0 = out[out["example_id"] == "g/0"]
    assert g0["alignment_head1_n_hyp_possible"].tolist() == [0, 1, 0]  # head 1 links (2,0), (1,1)
    assert g0["alignment_head1_n_hyp_sure"].tolist() == [0, 0, 0]
    table = out.assign(prefix="reference")
    s = summarize(
        table,
        pd.DataFrame({"example_id": ["g/0", "g/1"]}),
        ["alignment"],
        {"alignment": "reference"},
        CFG,
    )
    assert s["ablation/alignment/aer_head1"] == pytest.approx(1 - 1 / 3)  # (0 + 1)/(2 + 1)


def test_alignment_needs_the_reference_prefix(examples):
    model = tiny_model("additive")
    with pytest.raises(ValueError, match="reference"):
        call("alignment", model, one_batch(model, examples, "greedy"), CFG)


def test_pharaoh_export():
    batch = _gold_batch()
    assert (
        to_pharaoh(batch.trace.attention[0], torch.ones(3, dtype=torch.bool), n_target=2)
        == "0-0 0-1"
    )
    assert batch_to_pharaoh(batch) == {"g/0": "0-0 0-1", "g/1": "0-0 0-1"}


class TraceOnly:
    """Stand-in model: the alignment ablation only reads the traced attention."""

    has_attention = True


def test_alignment_word_of_an_example_without_word_maps_is_nan_whatever_its_batch_mates(
    hf_model,
):
    """On a pretrained model's examples, one without gold links has no word maps: beside a
    linked example its rows' ``alignment_word`` is NaN, as in a table of it alone (which has no
    such column). It was the step index there, so that the value depended on its batch-mates."""
    from attnstudy.analysis.batch import prepare_batches

    from attnstudy.models.hf import subword_examples

    linked = Example("x/0", ("cat", "dog"), ("cat", "dog"), Alignment.from_links({(0, 0), (1, 1)}))
    plain = Example("x/1", ("dog", "cat", "bird"), ("dog", "cat", "bird"))
    examples = subword_examples(hf_model, [linked, plain])
    assert examples[0].tgt_words == (0, 1) and examples[1].tgt_words == ()
    vocab = hf_model.vocab
    (batch,) = prepare_batches(hf_model, examples, vocab, vocab, "reference", 4)
    frame = call("alignment", hf_model, batch).sort_values(["example_id", "step"])
    mine = frame[frame["example_id"] == "x/1"]
    assert len(mine) == 4 and mine["alignment_word"].isna().all()
    assert frame[frame["example_id"] == "x/0"]["alignment_word"].tolist() == [0, 1, -1]
    # a batch of linked examples only keeps an integer column
    (alone,) = prepare_batches(hf_model, examples[:1], vocab, vocab, "reference", 4)
    words = call("alignment", hf_model, alone)["alignment_word"]
    assert words.dtype == np.int64 and sorted(words.tolist()) == [-1, 0, 1]
