"""Alignment broken down by the Greek word's part of speech and by the gold link's shape
(attnstudy.data.breakdowns): hand-worked sums, the tags through the task registry (and out of the
data digest), eflomal's rows on the fixture and attention's from a per-step table."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pandas as pd
import pytest

from attnstudy.config import data_config
from attnstudy.data import breakdowns as bd
from attnstudy.data import eflomal, nt
from attnstudy.data.alignment import Alignment
from attnstudy.data.symmetrise import SYMMETRISATIONS
from attnstudy.data.tasks import TASKS, get_task
from attnstudy.data.types import Example, splits_digest

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nt"
FILES = nt.NTFiles(
    FIXTURE / "SBLGNT.tsv", FIXTURE / "nt_BSB.tsv", FIXTURE / "SBLGNT-BSB-manual.json"
)

# Greek words 0 noun, 1 det, 2 verb; English words 0 … 3.
TAGS = ("noun", "det", "verb")
# English 0 ← Greek 0 and 1 (a noun and its article); English 1 and 2 ← Greek 2; English 3 none
GOLD = {(0, 0), (1, 0), (2, 1), (2, 2)}
# hits (0,0) and (2,1); misses (0,2) and (2,3) (English 3 has no gold link)
HYP = {(0, 0), (2, 1), (0, 2), (2, 3)}


def _group(i: int, j: int) -> str:
    return get_task(nt.TASK).word_tags.group(TAGS[i])


def test_the_worked_example_by_part_of_speech():
    steps = bd.hard_steps(HYP, GOLD, 4)
    assert steps[0][:3] == (0, 1.0, 1.0) and steps[2][:3] == (2, 1.0, 0.0)
    sums = bd.sentence_sums(GOLD, steps, _group)
    # English 0 counts ½ for "noun" and ½ for "article" (SBLGNT det): hit ½, |A| ½, |S| ½ · 2
    assert list(sums["noun"]) == [0.5, 0.5, 1.0, 0.0, 0.0, 0.5]
    assert list(sums["article"]) == list(sums["noun"])
    # English 1 and 2 count 1 each for "verb": one hit of two links, two gold links
    assert list(sums["verb"]) == [1.0, 2.0, 2.0, 0.0, 0.0, 2.0]
    assert list(sums[bd.NO_LINK]) == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    out = bd.breakdown([sums], resamples=50)
    assert list(out) == ["verb", "article", "noun", bd.NO_LINK]  # by gold links, no link last
    noun = out["noun"]
    assert noun["precision"].value == 1.0 and noun["recall"].value == 0.5
    assert noun["aer"].value == pytest.approx(1 - 2 * 0.5 / (0.5 + 1.0))  # 1/3
    assert out["verb"]["precision"].value == out["verb"]["recall"].value == 0.5
    assert out["verb"]["aer"].value == pytest.approx(0.5)
    assert out[bd.NO_LINK]["precision"].value == 0.0 and out[bd.NO_LINK]["aer"].value == 1.0
    assert math.isnan(out[bd.NO_LINK]["recall"].value)
    assert math.isnan(noun["gold_mass"].value)  # hard links: no mass
    # the weights sum to 1 per step and every gold link is counted once
    assert sum(r["steps"] for r in out.values()) == 4
    assert sum(r["gold_links"] for r in out.values()) == len(GOLD)


def test_link_shapes_and_recall_by_shape():
    gold = {
        (0, 0),  # 1–1
        (1, 1), (1, 2),  # one Greek word, two English words: 1–n
        (2, 3), (3, 3),  # two Greek words, one English word: n–1
        (4, 4), (4, 5), (5, 4), (5, 5),  # a 2 × 2 block: n–m
    }  # fmt: skip
    shapes = bd.link_shapes(gold)
    assert shapes[(0, 0)] == "1–1"
    assert shapes[(1, 1)] == shapes[(1, 2)] == "1–n"
    assert shapes[(2, 3)] == shapes[(3, 3)] == "n–1"
    assert {shapes[link] for link in [(4, 4), (4, 5), (5, 4), (5, 5)]} == {"n–m"}
    hyp = {(0, 0), (1, 1), (2, 3), (4, 4)}  # one hit per block
    sums = bd.sentence_sums(gold, bd.hard_steps(hyp, gold, 6), lambda i, j: shapes[(i, j)])
    out = bd.breakdown([sums], order=bd.SHAPES, resamples=50)
    assert list(out) == list(bd.SHAPES)
    assert [out[s]["recall"].value for s in bd.SHAPES] == [1.0, 0.5, 0.5, 0.25]
    assert [out[s]["gold_links"] for s in bd.SHAPES] == [1, 2, 2, 4]


def test_word_tags_travel_through_the_registry_and_stay_out_of_the_digest(monkeypatch):
    monkeypatch.setattr(nt, "package_files", lambda: FILES)
    spec = TASKS[nt.TASK].word_tags
    assert spec is not None and spec.label == "part of speech"
    assert [spec.group(t) for t in ("det", "num", "intj", "noun")] == [
        "article",
        "other",
        "other",
        "noun",
    ]
    assert all(t.word_tags is None for name, t in TASKS.items() if name != nt.TASK)
    cfg = data_config(task=nt.TASK, nt_min_test_verses=0, nt_test_fraction=0.3)
    tags = spec.tags(cfg)
    splits = nt.make_splits(FILES, cfg)
    examples = [*splits.train, *splits.dev, *splits.test]
    assert set(tags) == {ex.id for ex in examples}
    for ex in examples:  # one tag per Greek word, SBLGNT's own
        assert len(tags[ex.id]) == max(ex.src_words) + 1
    first = nt.read_corpus(FILES).verses[0]
    assert first.greek_pos[:2] == ("noun", "noun")  # Βίβλος γενέσεως
    assert tags[next(k for k in tags if k.endswith(first.id))] == first.greek_pos
    # the examples carry no tags: the digest (and so every model key) is what it was without
    assert not any("pos" in f or "tag" in f for f in Example.__dataclass_fields__)
    bare = nt.Verse(*[getattr(first, f) for f in nt.Verse.__dataclass_fields__][:-1])
    assert bare.greek_pos == () and bare.links == first.links
    corpus = nt.read_corpus(FILES)  # other tags, the same data digest
    retagged = nt.Corpus(
        tuple(dataclasses.replace(v, greek_pos=("intj",) * len(v.greek)) for v in corpus.verses),
        corpus.stats,
    )
    monkeypatch.setattr(nt, "read_corpus", lambda files: retagged)
    assert {t for ts in spec.tags(cfg).values() for t in ts} == {"intj"}
    assert splits_digest(nt.make_splits(FILES, cfg)) == splits_digest(splits)
    monkeypatch.setattr(nt, "read_corpus", lambda files: corpus)
    swapped = data_config(task=nt.TASK, direction="en-grc", nt_min_test_verses=0)
    assert spec.tags(swapped) == {} and bd.tag_group(nt.TASK, swapped) is None


def _fake_alignment(cfg) -> eflomal.NTAlignment:
    """eflomal's run replaced by the gold itself (forward) and nothing (backward)."""
    test = nt.split_verses(nt.read_corpus(FILES), cfg)["test"]
    _, renumber = eflomal.nt_pairs(test)
    links = tuple(eflomal.Directional(frozenset(v.links), frozenset()) for v in test)
    return eflomal.NTAlignment(0, tuple(test), links, tuple(renumber), cfg)


def test_eflomal_rows_and_breakdowns_on_the_fixture(monkeypatch):
    monkeypatch.setattr(nt, "package_files", lambda: FILES)
    cfg = data_config(task=nt.TASK, nt_min_test_verses=0, nt_test_fraction=0.3)
    aligned = _fake_alignment(cfg)
    rows = eflomal.nt_rows(aligned, n_scored=(None, 2), resamples=50)
    assert [r["aligner"] for r in rows] == [f"eflomal, {h}" for h in SYMMETRISATIONS] * 2
    forward = rows[0]
    assert forward["AER"].startswith("0 [") and forward["precision"].startswith("1 [")
    assert rows[1]["links"] == "0" and rows[1]["precision"] == "undefined"
    assert [r["test verses"] for r in rows] == ["4"] * 7 + ["2"] * 7
    pos, shape = bd.eflomal_breakdowns(aligned, heuristic="forward", n_scored=(None,), resamples=50)
    by = {r["part of speech"]: r for r in pos}
    assert by["noun"]["recall"].startswith("1 [") and by["article"]["precision"].startswith("1 [")
    assert "det" not in by and list(by)[-1] == bd.NO_LINK
    gold = sum(len(v.links) for v in aligned.test)
    assert sum(float(r["gold links"].replace(",", "")) for r in pos) == gold
    assert [r["link shape"] for r in shape][:2] == ["1–1", "1–n"]
    assert [r["recall"].split()[0] for r in shape] == ["1", "1", "1", "1", "undefined"]
    assert [r["gold links"] for r in shape] == ["33", "13", "2", "44", "0"]  # 44: one record


def test_attention_breakdowns_from_a_step_table(monkeypatch):
    """A tiny per-step table as the ``alignment`` ablation writes it (subword rows, ``<eos>``),
    for an example whose source tags come through the registry."""
    monkeypatch.setattr(nt, "package_files", lambda: FILES)
    cfg = data_config(task=nt.TASK, nt_min_test_verses=0, nt_test_fraction=0.3)
    ex = nt.make_splits(FILES, cfg).test[0]
    tags = get_task(nt.TASK).word_tags.tags(cfg)[ex.id]
    gold = {(0, 0), (1, 0), (2, 1)}
    toy = Example(
        ex.id,
        src=("a", "b", "c"),
        tgt=("x", "y1", "y2", "z"),
        alignment=Alignment.from_links(gold),
        src_words=(0, 1, 2),
        tgt_words=(0, 1, 1, 2),
    )
    table = pd.DataFrame(
        {
            "example_id": [ex.id] * 5,
            "step": [0, 1, 2, 3, 4],
            "alignment_word": [0, 1, 1, 2, -1],
            "alignment_n_hyp": [1.0, 1.0, 0.0, 1.0, 0.0],
            "alignment_n_hyp_sure": [1.0, 0.0, 0.0, 0.0, 0.0],
            "alignment_n_sure": [2.0, 1.0, 0.0, 0.0, 0.0],
            "alignment_gold_mass": [0.8, 0.3, math.nan, math.nan, math.nan],
        }
    )
    steps = bd.attention_steps(table, 3)  # the second subword's row and <eos> count nothing
    assert steps[:2] == [(0, 1.0, 1.0, 0.8), (1, 1.0, 0.0, 0.3)]
    assert steps[2][:3] == (2, 1.0, 0.0) and math.isnan(steps[2][3])
    by_tag, by_shape = bd.attention_breakdowns(
        table, [toy], nt.TASK, cfg, label="model · layer 3", resamples=50
    )
    group = get_task(nt.TASK).word_tags.group
    want = {}  # English 0 ← Greek 0 and 1 (½ each), English 1 ← Greek 2, English 2 none
    for i, w, m in ((0, 0.5, 0.8), (1, 0.5, 0.8), (2, 1.0, 0.3)):
        want.setdefault(group(tags[i]), []).append((w, m))
    got = {r["part of speech"]: r for r in by_tag}
    for g, parts in want.items():
        mass = sum(w * m for w, m in parts) / sum(w for w, _ in parts)
        assert got[g]["gold mass"] == f"{mass:.3g}", g  # one example: no interval
    assert got[bd.NO_LINK]["precision"] == "0" and got[bd.NO_LINK]["recall"] == "undefined"
    shapes = {r["link shape"]: r for r in by_shape}
    assert shapes["n–1"]["recall"] == "0.5" and shapes["n–1"]["gold mass"] == "0.8"
    assert shapes["1–1"]["recall"] == "0" and shapes["1–1"]["gold mass"] == "0.3"
