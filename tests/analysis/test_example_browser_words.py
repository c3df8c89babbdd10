"""The example browser on subword tokens (the nt-greek-english fixture, John 1:2): the texts as
words, the attention between Greek and English words as the alignment ablation scores it (a
source word's subword attention summed, a target word's rows averaged), the gold word links on
that grid, attention's argmax links and the per-word alignment numbers of the per-step table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from analysis_testkit import sharpen
from attnstudy.analysis import figures
from attnstudy.analysis.batch import prepare_batches
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.heatmaps import Recorder, output_word_index, word_labels, word_text
from attnstudy.analysis.suite import run_suite

from attnstudy.config import ModelConfig, TransformerConfig, data_config
from attnstudy.data import nt
from attnstudy.data.subwords import merge_subwords, subword_word_index
from attnstudy.data.vocab import Vocab
from attnstudy.models import build_model
from attnstudy.pages.browser import browser_data, browser_html

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nt"
FILES = nt.NTFiles(
    FIXTURE / "SBLGNT.tsv", FIXTURE / "nt_BSB.tsv", FIXTURE / "SBLGNT-BSB-manual.json"
)
JOHN_1_2 = "nt/dev/43001002"
GREEK = ["οὗτος", "<unk>ν", "ἐν", "ἀρχ<unk>", "πρὸς", "τὸν", "θεόν"]  # ἦ, ῇ unseen in training
ENGLISH = ["He", "was", "with", "God", "in", "the", "beginning"]  # the '.' is no word
# οὗτος–He, ἦν–was, ἐν–in, ἀρχῇ–the beginning, πρὸς–with, θεόν–God; τὸν unaligned
GOLD = [[0, 0, True], [1, 1, True], [2, 4, True], [3, 5, True], [3, 6, True], [4, 2, True]]
GOLD += [[6, 3, True]]


def _nt_run(family: str):
    cfg = data_config(task=nt.TASK, nt_min_test_verses=0, nt_vocab_size=120)
    splits = nt.build_splits(FILES, cfg)
    sv = Vocab.build(ex.src for ex in splits.train)
    tv = Vocab.build(ex.tgt for ex in splits.train)
    torch.manual_seed(0)
    if family == "transformer":
        mcfg = TransformerConfig(architecture="transformer", layers=2, heads=2, d_model=8, d_ff=16)
    else:
        mcfg = ModelConfig(embedding_dim=8, encoder_hidden=6, decoder_hidden=8, attention_dim=6)
    model = sharpen(build_model(mcfg, len(sv), len(tv)).eval(), 2.0)
    acfg = AblationConfig(
        bootstrap_resamples=20, seed=3, ablations=["alignment", "permutation"], n_examples=10
    )
    rec = Recorder(acfg.prefix)
    res = run_suite(model, splits.dev, sv, tv, acfg, progress=False, batch_size=4, recorder=rec)
    ex = next(e for e in splits.dev if e.id == JOHN_1_2)
    return model, ex, sv, tv, res, rec.result()


@pytest.fixture(scope="module", params=["recurrent", "transformer"])
def nt_run(request):
    return _nt_run(request.param)


def _loop_words(att, src_words, tgt_words):
    """Reference: cell (J, I) = mean over J's subword rows of the sum over I's subword columns."""
    n_src, n_tgt = max(src_words) + 1, max(tgt_words) + 1
    out = [[0.0] * n_src for _ in range(n_tgt)]
    for big_j in range(n_tgt):
        rows = [j for j, w in enumerate(tgt_words) if w == big_j]
        for big_i in range(n_src):
            cols = [i for i, w in enumerate(src_words) if w == big_i]
            out[big_j][big_i] = sum(float(att[j, i]) for j in rows for i in cols) / len(rows)
    return out


def test_word_grid_of_john_1_2_with_its_gold_links(nt_run):
    model, ex, sv, tv, res, records = nt_run
    rec = next(r for r in records if r["id"] == JOHN_1_2)
    ref = rec["reference_words"]
    assert ref["source"] == GREEK and ref["rows"] == ENGLISH
    assert ref["gold"] == GOLD  # the verse's links, between words, never subword cells
    # the word grid against a loop over the subword attention of the reference prefix
    batch = next(prepare_batches(model, [ex], sv, tv, "reference"))
    att = batch.trace.attention[0]  # (H, T, T_x), the analysed layer
    n = len(ex.src)
    expected = [
        _loop_words(att[h, : len(ex.tgt), :n], ex.src_words, ex.tgt_words)
        for h in range(att.size(0))
    ]
    mean = [[sum(e[j][i] for e in expected) / len(expected) for i in range(7)] for j in range(7)]
    assert len(ref["attention"]) == 7 and all(len(row) == 7 for row in ref["attention"])
    for got, want in zip(ref["attention"], mean):
        assert got == pytest.approx(want, abs=6e-4)  # rounded to 3 decimals
        assert sum(want) == pytest.approx(1.0, abs=1e-5)  # Greek has no word-less subword
    # attention's link of each English word: its row's argmax, the ablation's hard link
    assert ref["links"] == sorted(
        [max(range(7), key=row.__getitem__), j] for j, row in enumerate(mean)
    )
    # … and the per-step table's counts agree: a link on a gold cell is a sure hit
    steps = res.table[(res.table["example_id"] == JOHN_1_2) & (res.table["prefix"] == "reference")]
    if "layer" in steps.columns:
        steps = steps[steps["layer"] == rec["layer"]]
    if "head" in steps.columns:
        steps = steps[steps["head"] == rec["head"]]
    first = (
        steps[steps["alignment_word"] >= 0].sort_values("step").drop_duplicates("alignment_word")
    )
    gold = {(s, t) for s, t, _ in GOLD}
    hits = [float((s, t) in gold) for s, t in sorted(ref["links"], key=lambda x: x[1])]
    assert first["alignment_n_hyp_sure"].tolist() == hits
    # the browser's per-word table: the gold mass of each English word, from the same grid
    data = browser_data(records, res.table, meta={"prefix": "greedy"})
    values = data["records"][JOHN_1_2]["reference_word_values"]
    masses = [sum(mean[t][s] for s, tt, _ in GOLD if tt == t) for t in range(7)]
    assert values["gold mass"] == pytest.approx(masses, abs=1e-4)
    assert values["argmax on gold"] == hits


def test_greedy_rows_are_the_output_words(nt_run):
    _, ex, *_, records = nt_run
    rec = next(r for r in records if r["id"] == JOHN_1_2)
    w = rec["words"]
    assert w["source"] == GREEK
    assert w["rows"] == merge_subwords([t for t in rec["rows"] if t != "<eos>"])
    assert w["row_words"][-1] == -1 and rec["rows"][-1] == "<eos>"
    assert len(w["attention"]) == len(rec["attention"])  # every layer
    for layer, sub in zip(w["attention"], rec["attention"]):
        want = _loop_words(np.array(sub), ex.src_words, w["row_words"][:-1])
        for got, row in zip(layer, want):
            assert got == pytest.approx(row, abs=3e-3)  # from the rounded subword record
    if "heads" in rec:
        assert len(w["heads"][0]) == len(rec["heads"][0])


def test_list_and_page_show_words():
    _, ex, *_, res, records = _nt_run("recurrent")
    data = browser_data(records, res.table, meta={"title": "nt"})
    row = next(r for r in data["examples"] if r["id"] == JOHN_1_2)
    assert row["source"] == " ".join(GREEK)
    assert row["reference"] == "He was with God in the beginning ."  # punctuation kept in text
    rec = next(r for r in records if r["id"] == JOHN_1_2)
    assert row["prediction"] == " ".join(merge_subwords([t for t in rec["rows"][:-1]]))
    page = browser_html(data)  # the word grid travels in the page's JSON
    assert '"reference_words"' in page and '"He","was","with","God"' in page


def test_output_words_of_marked_and_word_level_tokens():
    assert output_word_index(["▁He", "▁w", "as", "<unk>", "▁.", "<eos>"]) == [0, 1, 1, 1, 2, -1]
    assert output_word_index(["He", "was", ".", "<eos>"]) == [0, 1, 2, -1]  # words as tokens
    tokens = ["▁ο", "ὗ", "τ", "ος", "▁", "<unk>", "ν"]
    assert subword_word_index(tokens) == [0, 0, 0, 0, 1, 1, 1]
    assert word_labels(tokens, subword_word_index(tokens)) == merge_subwords(tokens)
    assert word_text(["▁be", "g", "inning", "▁.", "<eos>"]) == "beginning ."


def test_report_figure_draws_the_gold_links_between_words(nt_run):
    *_, records = nt_run
    rec = next(r for r in records if r["id"] == JOHN_1_2)
    fig = figures.example_heatmaps([rec], "nt")
    ax = fig.axes[len(fig.axes) - 2]  # the last panel (the colour bar is the last axes)
    assert "between words" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()] == ENGLISH
    assert [t.get_text() for t in ax.get_xticklabels()] == GREEK
    boxes = sorted((round(b.get_x() + 0.5), round(b.get_y() + 0.5)) for b in ax.patches)
    assert boxes == sorted((s, t) for s, t, _ in GOLD)
