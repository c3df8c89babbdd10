"""Task nt-greek-english on the committed fixture (a few verses of the real files): verses,
merging, dropping, refusals, the chapter split, subwords with word maps, detokenisation."""

from __future__ import annotations

import json
import shutil
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pydantic
import pytest
import torch
from attnstudy.analysis.ablations.alignment import aer, word_attention

from attnstudy.config import data_config
from attnstudy.data import nt
from attnstudy.data.subwords import merge_subwords, train_tokenizer
from attnstudy.data.tasks import get_task
from attnstudy.data.types import DataError

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nt"
FILES = nt.NTFiles(
    FIXTURE / "SBLGNT.tsv", FIXTURE / "nt_BSB.tsv", FIXTURE / "SBLGNT-BSB-manual.json"
)


def cfg(**kw):
    values = {"task": nt.TASK, "nt_min_test_verses": 0, "nt_vocab_size": 120, **kw}
    return data_config(**values)


def verse(vid: str) -> nt.Verse:
    return next(v for v in nt.read_corpus(FILES).verses if v.id == vid)


def test_counts_merged_and_dropped():
    s = nt.read_corpus(FILES).stats
    assert s["greek_verses"] == 14  # Acts 19:41's Greek is under 19:40 in the SBLGNT
    assert s["examples"] == 12
    assert s["crossing_records"] == 1  # Luke 7:18–19
    assert (s["merged_examples"], s["merged_verses"]) == (1, 2)
    assert s["dropped_verses"] == 1  # Matthew 7:20: no record names its words
    assert s["verses_without_linked_word"] == 1
    assert s["chapters"] == 6
    assert s["records"] == 142 and s["links"] == 277
    ids = [v.id for v in nt.read_corpus(FILES).verses]
    assert "42007018+42007019" in ids and "40007020" not in ids


def test_one_verse_words_and_links():
    v = verse("43001002")  # John 1:2
    assert v.greek == ("οὗτος", "ἦν", "ἐν", "ἀρχῇ", "πρὸς", "τὸν", "θεόν")
    assert v.english_text == "He was with God in the beginning."
    assert v.exclude == (False,) * 7 + (True,)
    # οὗτος–He, ἦν–was, ἐν–in, ἀρχῇ–the beginning, πρὸς–with, θεόν–God; τὸν unaligned
    assert v.links == {(0, 0), (1, 1), (2, 4), (3, 5), (3, 6), (4, 2), (6, 3)}


def test_english_of_the_previous_greek_verse_joins_it():
    v = verse("44019040")  # the BSB's Acts 19:41 translates SBLGNT 19:40's last words
    assert v.english_text.endswith("After he had said this, he dismissed the assembly.")


@pytest.mark.parametrize("kind", ["bpe", "words"])
def test_examples_keep_word_links_and_punctuation_maps_to_no_word(kind):
    c = cfg(nt_tokenization=kind, nt_vocab_size=400)
    splits = nt.build_splits(FILES, c)
    ex = next(e for e in splits.dev if e.id == "nt/dev/43001002")
    v = verse("43001002")
    greek_tok, english_tok = nt.tokenizers(FILES, c)
    assert english_tok.words(ex.tgt) == list(v.english)
    if kind == "bpe":  # ἦ and ῇ never occur in the 8 training verses
        assert ex.src[:5] == ("▁οὗ", "τος", "▁", "<unk>", "ν")
        assert greek_tok.words(ex.src) == [
            "οὗτος",
            "<unk>ν",
            "ἐν",
            "ἀρχ<unk>",
            "πρὸς",
            "τὸν",
            "θεόν",
        ]
    else:
        assert greek_tok.words(ex.src) == list(v.greek)
    # the English '.' is in the target, as word −1; the 7 words are numbered 0…6
    assert ex.tgt[-1] in (".", "▁.") and ex.tgt_words[-1] == -1
    assert sorted(set(ex.tgt_words) - {-1}) == list(range(7))
    assert sorted(set(ex.src_words)) == list(range(7))
    assert ex.alignment.sure == v.links == ex.alignment.possible
    if kind == "words":
        assert ex.src == v.greek and ex.tgt == v.english


def test_direction_en_grc_transposes_the_links():
    a = nt.build_splits(FILES, cfg()).dev
    b = nt.build_splits(FILES, cfg(direction="en-grc")).dev
    for x, y in zip(a, b):
        assert (x.src, x.src_words) == (y.tgt, y.tgt_words)
        assert {(j, i) for i, j in x.alignment.sure} == y.alignment.sure


def test_subword_attention_is_summed_into_words_and_punctuation_ignored():
    ex = next(e for e in nt.build_splits(FILES, cfg()).dev if e.id == "nt/dev/43001002")
    t_y, t_x = len(ex.tgt), len(ex.src)
    weights = torch.full((t_y, t_x), 1.0 / t_x)
    words = word_attention(weights, ex.src_words, ex.tgt_words)
    assert words.shape == (7, 7)  # the '.' row is no word
    n_sub = [ex.src_words.count(i) for i in range(7)]
    expected = torch.tensor([n / t_x for n in n_sub]).expand(7, 7)
    assert torch.allclose(words, expected)


def test_tokenizer_is_trained_on_train_only_and_deterministic():
    splits = nt.build_splits(FILES, cfg())
    again = nt.build_splits(FILES, cfg(split_salt="attnstudy-nt-v1"))  # equal config, new object
    assert [e.src for e in splits.train] == [e.src for e in again.train]
    words = [v.greek for v in nt.split_verses(nt.read_corpus(FILES), cfg())["train"]]
    t1, t2 = train_tokenizer(words, "bpe", 120), train_tokenizer(list(words), "bpe", 120)
    # the same vocabulary, merges and ids (with a "##" continuation prefix the ids, and with
    # them the ties between equally frequent pairs, followed hash-map order)
    assert t1.vocabulary == t2.vocabulary
    assert t1.tokenizer.to_str() == t2.tokenizer.to_str()
    # a vocabulary of 120 learned on the training verses alone leaves dev words in pieces
    assert len(t1.vocabulary) <= 120
    assert any(not t.startswith("▁") for e in splits.dev for t in e.src)


def test_split_by_chapter():
    chapters = tuple((f"4{k:04d}", 10 + k % 7) for k in range(260))
    parts = nt.split_chapters(chapters, "attnstudy-nt-v1", 0.10, 0.05, 300)
    assert len(parts["test"]) >= 26 and sum(n for c, n in chapters if c in parts["test"]) >= 300
    assert len(parts["dev"]) == 13
    assert len(parts["train"]) == 260 - len(parts["test"]) - 13
    assert set(parts["train"]).isdisjoint(parts["test"]) and set(parts["dev"]).isdisjoint(
        parts["test"]
    )
    # at least 300 verses: with 10 verses per chapter the test split needs 30 chapters
    assert (
        len(nt.split_chapters(tuple((c, 10) for c, _ in chapters), "s", 0.1, 0.05, 300)["test"])
        == 30
    )
    other = nt.split_chapters(chapters, "another salt", 0.10, 0.05, 300)
    assert other["test"] != parts["test"]


def test_fixture_split_keeps_chapters_apart():
    parts = nt.split_verses(nt.read_corpus(FILES), cfg())
    chapters = {s: {v.chapter for v in vs} for s, vs in parts.items()}
    assert chapters["train"].isdisjoint(chapters["test"] | chapters["dev"])
    assert sum(len(vs) for vs in parts.values()) == 12
    assert all(parts.values())


def test_detokenize_english():
    for v in nt.read_corpus(FILES).verses:  # the spacing rule reproduces the BSB's flags here
        assert nt.detokenize_english(v.english) == v.english_text
    assert nt.detokenize_english(["“", "Lord", ",", "Lord", ",", "”", "he", "said", "."]) == (
        "“Lord, Lord,” he said."
    )
    assert merge_subwords(["▁be", "g", "inning", "▁was", "▁"]) == ["beginning", "was", ""]


def test_registry_and_config():
    spec = get_task(nt.TASK)
    assert spec.gold_sure_only and spec.tokenization(cfg()) == ("spaces", "spaces")
    assert cfg().direction == "grc-en"
    with pytest.raises(pydantic.ValidationError):
        data_config(task=nt.TASK, tokenization="chars")  # not a setting of this task
    with pytest.raises(pydantic.ValidationError, match="leave nothing for train"):
        data_config(task=nt.TASK, nt_test_fraction=0.6, nt_dev_fraction=0.5)


def _copy(tmp_path: Path) -> nt.NTFiles:
    for f in (FILES.source, FILES.target, FILES.alignment):
        shutil.copy(f, tmp_path / f.name)
    return nt.NTFiles(*(tmp_path / f.name for f in (FILES.source, FILES.target, FILES.alignment)))


def test_a_record_not_manual_is_refused(tmp_path):
    files = _copy(tmp_path)
    doc = json.loads(files.alignment.read_text("utf-8"))
    doc["records"][3]["meta"]["process"] = "automatic"
    files.alignment.write_text(json.dumps(doc), "utf-8")
    with pytest.raises(DataError, match="process 'automatic'; only 'manual'"):
        nt.read_corpus(files)


@pytest.mark.parametrize(
    "which, text, problem",
    [
        ("alignment", '{"records": [', "not Scripture Burrito alignment JSON"),
        ("source", "id\tword\nn40001001001\tx\n", "not a TSV file with the columns id, text"),
        (
            "target",
            "id\tsource_verse\ttext\tskip_space_after\texclude\nX\t1\ta\t\t\n",
            "token id 'X'",
        ),
    ],
)
def test_files_that_do_not_parse_say_what_to_install(tmp_path, which, text, problem):
    files = _copy(tmp_path)
    getattr(files, which).write_text(text, "utf-8")
    with pytest.raises(DataError, match=problem) as err:
        nt.read_corpus(files)
    assert "make test-deps" in str(err.value) and "\n" not in str(err.value)
    assert f"pip install --no-deps bible-alignments=={nt.PACKAGE_VERSION}" in str(err.value)


def test_package_missing_or_another_version(monkeypatch):
    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(nt, "version", missing)
    with pytest.raises(
        DataError, match="needs the 'bible-alignments' package; run: make test-deps"
    ):
        nt.package_files()
    monkeypatch.setattr(nt, "version", lambda name: "0.4.1")
    with pytest.raises(DataError, match="reads bible-alignments 0.4.2, but 0.4.1 is installed"):
        nt.package_files()


def test_a_record_naming_a_missing_word_is_refused(tmp_path):
    files = _copy(tmp_path)
    doc = json.loads(files.alignment.read_text("utf-8"))
    doc["records"][0]["source"] = ["n40001001099"]
    files.alignment.write_text(json.dumps(doc), "utf-8")
    with pytest.raises(DataError, match="names token 'n40001001099', which the word files lack"):
        nt.read_corpus(files)


def test_corpus_table_counts_each_split():
    table = nt.corpus_table(FILES, cfg())
    assert (table["train_examples"], table["dev_examples"], table["test_examples"]) == (8, 3, 1)
    assert table["test_links"] == 51 and table["test_greek_words"] == 30
    assert sum(table[f"{s}_links"] for s in ("train", "dev", "test")) == 277
    assert table["dev_target_subwords"] >= table["dev_english_tokens"]


def test_gold_is_sure_only_so_aer_is_one_minus_f1():
    splits = nt.build_splits(FILES, cfg())
    assert all(e.alignment.sure_only for e in splits.train + splits.dev + splits.test)
    gold = nt.build_splits(FILES, cfg()).dev[0].alignment.sure
    hyp = set(list(gold)[:5]) | {(99, 0), (98, 1)}
    hit = len(hyp & gold)
    precision, recall = hit / len(hyp), hit / len(gold)
    f1 = 2 * precision * recall / (precision + recall)
    assert aer(hyp, gold, gold) == pytest.approx(1 - f1)
