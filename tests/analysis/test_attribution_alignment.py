"""Attribution argmax as an alignment (``attribution_alignment``) and attention's precision and
recall (``alignment``): known answers on hand-made matrices, attention scored by both entries
alike, and every method on a tiny model."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from analysis_testkit import VOCAB, call, hand_batch, make_examples, tiny_model
from attnstudy.analysis.ablations import attribution_alignment
from attnstudy.analysis.batch import prepare_batches
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.suite import summarize

from attnstudy.data.alignment import Alignment
from attnstudy.data.types import Example

CFG = AblationConfig(bootstrap_resamples=50)


class _TraceOnly:
    has_attention = True


def _summary(out, name):
    return summarize(
        out.assign(prefix="reference"),
        pd.DataFrame({"example_id": out["example_id"].unique()}),
        [name],
        {name: "reference"},
        CFG,
    )


def _copy_batch():
    """Target 0 looks at source 0, target 1 at source 2 (gold 1), target 2 ties: links 0–0
    (right) and 2–1 (wrong), none for token 2; <eos> counts nothing."""
    rows = torch.tensor([[0.8, 0.1, 0.1], [0.1, 0.2, 0.7], [0.4, 0.4, 0.2], [0.3, 0.3, 0.4]]).view(
        1, 1, 4, 3
    )
    gold = Alignment(sure=frozenset((i, i) for i in range(3)), possible=frozenset())
    ex = Example("h/0", ("a", "b", "c"), ("a", "b", "c"), gold)
    return hand_batch(rows, [3], [ex], prefix="reference")


def test_argmax_counts_by_hand():
    batch = _copy_batch()
    counts = attribution_alignment.argmax_counts(batch, batch.trace.attention.mean(1))
    assert counts["n_hyp"].tolist() == [1, 1, 0, 0]
    assert counts["n_hyp_sure"].tolist() == [1, 0, 0, 0]
    assert counts["n_sure"].tolist() == [1, 1, 1, 0]


def test_attention_precision_and_recall_by_hand():
    """2 predicted links, 1 right, 3 sure links: precision 1/2, recall 1/3, AER = 1 − F1 =
    1 − 2·1 / (2 + 3) = 0.6 (sure links only)."""
    s = _summary(call("alignment", _TraceOnly(), _copy_batch(), CFG), "alignment")
    assert s["ablation/alignment/precision"] == pytest.approx(0.5)
    assert s["ablation/alignment/recall"] == pytest.approx(1 / 3)
    assert s["ablation/alignment/aer"] == pytest.approx(0.6)
    p, r = 0.5, 1 / 3
    assert s["ablation/alignment/aer"] == pytest.approx(1 - 2 * p * r / (p + r))


def test_possible_links_count_for_precision_not_recall():
    rows = torch.tensor([[0.1, 0.9], [0.9, 0.1], [0.5, 0.5]]).view(1, 1, 3, 2)
    gold = Alignment(sure=frozenset({(0, 0)}), possible=frozenset({(1, 0), (0, 1)}))
    ex = Example("h/0", ("a", "b"), ("a", "b"), gold)
    s = _summary(
        call("alignment", _TraceOnly(), hand_batch(rows, [2], [ex], "reference"), CFG),
        "alignment",
    )
    # links 1–0 (possible) and 0–1 (possible): |A∩P| = 2 of |A| = 2; |A∩S| = 0 of |S| = 1
    assert s["ablation/alignment/precision"] == pytest.approx(1.0)
    assert s["ablation/alignment/recall"] == pytest.approx(0.0)
    assert s["ablation/alignment/aer"] == pytest.approx(1 - (0 + 2) / (2 + 1))


def test_subword_scores_are_summed_into_words_and_counted_once_per_word():
    """Source words 0 = subwords 0–1, 1 = subword 2; target word 0 = subwords 0–1, word 1 =
    subword 2, subword 3 is punctuation (no word). Subword 0 of source word 0 is small but its two
    subwords sum above word 1: target word 0 links source word 0 (right), on its first row only."""
    rows = torch.tensor(
        [
            [0.3, 0.3, 0.4, 0.0],
            [0.3, 0.3, 0.4, 0.0],
            [0.1, 0.1, 0.8, 0.0],
            [0.9, 0.05, 0.05, 0.0],
            [0.3, 0.3, 0.4, 0.0],
        ]
    ).view(1, 1, 5, 4)
    gold = Alignment(sure=frozenset({(0, 0), (1, 1)}), possible=frozenset())
    ex = Example(
        "w/0",
        ("▁a", "b", "▁c"),
        ("▁x", "y", "▁z", "."),
        gold,
        src_words=(0, 0, 1),
        tgt_words=(0, 0, 1, -1),
    )
    batch = hand_batch(rows, [3], [ex], prefix="reference")
    counts = attribution_alignment.argmax_counts(batch, batch.trace.attention.mean(1))
    assert counts["n_hyp"].tolist() == [1, 0, 1, 0, 0]
    assert counts["n_hyp_sure"].tolist() == [1, 0, 1, 0, 0]
    assert counts["n_sure"].tolist() == [1, 0, 1, 0, 0]
    plain = call("alignment", _TraceOnly(), batch, CFG)
    assert plain["alignment_n_hyp_sure"].tolist() == counts["n_hyp_sure"].tolist()


@pytest.mark.parametrize("flow", ["bahdanau", "transformer"])
def test_attention_row_equals_the_alignment_ablation_and_methods_are_ratios(flow):
    model = tiny_model("multihead" if flow == "transformer" else "additive", flow)
    examples = make_examples()
    batch = next(prepare_batches(model, examples, VOCAB, VOCAB, "reference", len(examples)))
    cfg = AblationConfig(
        bootstrap_resamples=50,
        attribution_alignment={"integrated_gradients": {"n_steps": 4}},
    )
    out = call("attribution_alignment", model, batch, cfg)
    plain = call("alignment", model, batch, cfg)
    for c in ("n_hyp", "n_hyp_sure", "n_hyp_possible"):
        a = out[f"attribution_alignment_attention_{c}"].fillna(-1).tolist()
        assert a == plain[f"alignment_{c}"].fillna(-1).tolist()
    s = _summary(out, "attribution_alignment")
    p = _summary(plain, "alignment")
    assert s["ablation/attribution_alignment/aer_attention"] == pytest.approx(
        p["ablation/alignment/aer"]
    )
    assert s["ablation/attribution_alignment/precision_attention"] == pytest.approx(
        p["ablation/alignment/precision"]
    )
    for m in attribution_alignment.METHODS:
        for stat in ("aer", "precision", "recall"):
            v = s[f"ablation/attribution_alignment/{stat}_{m}"]
            assert math.isfinite(v) and 0.0 <= v <= 1.0
    # the example without gold is skipped
    assert out.loc[out["example_id"] == examples[-1].id, "attribution_alignment_skipped"].all()


def test_refuses_another_prefix():
    model = tiny_model()
    batch = next(prepare_batches(model, make_examples(3), VOCAB, VOCAB, "greedy", 3))
    with pytest.raises(ValueError, match="reference prefix"):
        call("attribution_alignment", model, batch)


def test_no_empty_figure():
    """Its statistics are corpus ratios with no per-step value: the generic per-step figure
    would be empty ('no defined values'), so the entry has none; the report's table shows it."""
    from attnstudy.analysis.catalogue import get_ablation

    spec = get_ablation("attribution_alignment")
    assert spec.figure is None
    assert all(st.column is None for st in spec.stats.values())


def test_a_model_without_attention_has_no_attention_recall_rather_than_zero():
    """A `none` model's attention statistics are undefined (they were recall 0: its NaN link
    counts summed as 0 over the gold links), while the attribution methods are scored."""
    model = tiny_model("none", "bahdanau")
    examples = make_examples()
    batch = next(prepare_batches(model, examples, VOCAB, VOCAB, "reference", len(examples)))
    cfg = AblationConfig(
        bootstrap_resamples=50,
        attribution_alignment={"methods": ["input_x_gradient"]},
    )
    out = call("attribution_alignment", model, batch, cfg)
    assert out["attribution_alignment_attention_n_hyp"].isna().all()
    s = _summary(out, "attribution_alignment")
    for stat in ("aer", "precision", "recall"):
        v = s.get(f"ablation/attribution_alignment/{stat}_attention", math.nan)
        assert math.isnan(v), (stat, v)
        assert 0.0 <= s[f"ablation/attribution_alignment/{stat}_input_x_gradient"] <= 1.0
