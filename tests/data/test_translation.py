"""BLEU and chrF (attnstudy.scoring.translation) against sacrebleu called directly, the bootstrap
against sacrebleu rescoring each resample, the task registry's say on which tasks get them, and
the NT task's detokenised texts on the committed fixture."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

sacrebleu = pytest.importorskip("sacrebleu")

from attnstudy.config import data_config  # noqa: E402
from attnstudy.data import nt  # noqa: E402
from attnstudy.data.tasks import TASKS, TRANSLATION_METRICS  # noqa: E402
from attnstudy.data.types import DataError, Example  # noqa: E402
from attnstudy.scoring import translation  # noqa: E402

FIXTURE = Path(__file__).parents[1] / "fixtures" / "nt"
FILES = nt.NTFiles(
    FIXTURE / "SBLGNT.tsv", FIXTURE / "nt_BSB.tsv", FIXTURE / "SBLGNT-BSB-manual.json"
)

HYPS = [
    "In the beginning was the Word, and the Word was with God.",
    "He was with God in the beginning.",
    "Through him all things were made.",
    "In him was life, and that life was the light of men.",
    "The light shines in the darkness.",
]
REFS = [
    "In the beginning was the Word, and the Word was with God, and the Word was God.",
    "He was with God in the beginning.",
    "Through Him all things were made, and without Him nothing was made that has been made.",
    "In Him was life, and that life was the light of men.",
    "The Light shines in the darkness, and the darkness has not overcome it.",
]


@pytest.mark.parametrize("name", ["bleu", "chrf"])
def test_score_is_sacrebleus_own_corpus_score(name):
    direct = (
        sacrebleu.corpus_bleu(HYPS, [REFS])
        if name == "bleu"
        else sacrebleu.corpus_chrf(HYPS, [REFS])
    )
    score, low, high = translation.corpus_score(name, HYPS, REFS)
    assert score == pytest.approx(direct.score, abs=1e-9)
    assert low <= score <= high and low < high
    # the same seed, the same interval
    assert translation.corpus_score(name, HYPS, REFS) == (score, low, high)


@pytest.mark.parametrize("name", ["bleu", "chrf"])
def test_bootstrap_is_the_percentile_interval_of_sacrebleu_rescoring_each_resample(name):
    """Summing sacrebleu's per-segment statistics over a resample gives what sacrebleu's
    corpus score of that resample's texts gives; the interval is their 2.5th/97.5th percentile."""
    resamples, seed = 60, 3
    _, low, high = translation.corpus_score(name, HYPS, REFS, resamples=resamples, seed=seed)
    draws = np.random.default_rng(seed).integers(0, len(HYPS), size=(resamples, len(HYPS)))
    score = sacrebleu.corpus_bleu if name == "bleu" else sacrebleu.corpus_chrf
    direct = [score([HYPS[i] for i in d], [[REFS[i] for i in d]]).score for d in draws]
    assert (low, high) == pytest.approx(tuple(np.percentile(direct, [2.5, 97.5])), abs=1e-6)


def test_mismatched_or_empty_input_is_refused():
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        translation.corpus_score("bleu", ["a", "b"], ["a"])
    with pytest.raises(ValueError, match="no segments"):
        translation.corpus_score("chrf", [], [])


def test_only_translation_tasks_get_the_metrics():
    with_text = {name for name, spec in TASKS.items() if spec.translation_texts is not None}
    assert with_text == {nt.TASK}
    assert [m for m in TASKS[nt.TASK].metrics if m in TRANSLATION_METRICS] == list(
        TRANSLATION_METRICS
    )
    ex = Example("copy/test/0", ("a", "b"), ("a", "b"))
    cfg = data_config(task="copy")
    assert translation.translation_scores(cfg, [ex], [["a", "b"]], "test") == {}
    assert all(
        m not in TRANSLATION_METRICS
        for name, s in TASKS.items()
        if name != nt.TASK
        for m in s.metrics
    )


def _fixture_splits(monkeypatch, **kw):
    monkeypatch.setattr(nt, "package_files", lambda: FILES)
    cfg = data_config(task=nt.TASK, nt_min_test_verses=0, nt_vocab_size=120, **kw)
    return cfg, nt.build_splits(FILES, cfg)


def test_nt_texts_join_subwords_and_keep_the_bsb_spacing(monkeypatch):
    cfg, splits = _fixture_splits(monkeypatch)
    examples = splits.train + splits.dev + splits.test
    by_id = {v.id: v for v in nt.read_corpus(FILES).verses}
    hyps, refs = nt.translation_texts(cfg, examples, [ex.tgt for ex in examples])
    for ex, hyp, ref in zip(examples, hyps, refs):
        verse = by_id[ex.id.split("/", 2)[2]]
        assert ref == nt.detokenize_english(verse.english, verse.skip_space_after)
        if "<unk>" not in ex.tgt:  # its own subwords, decoded: its words, the BSB's spacing
            assert hyp == nt.detokenize_english(verse.english)
    # John 1:1 of the fixture: punctuation kept, no space before it
    john = next(r for ex, r in zip(examples, refs) if ex.id.endswith("/43001001"))
    assert john.startswith("In the beginning was the Word, and the Word was with God")
    assert john.endswith("God.")


def test_nt_texts_in_the_other_direction_are_greek_words(monkeypatch):
    cfg, splits = _fixture_splits(monkeypatch, direction="en-grc")
    ex = splits.train[0]
    by_id = {v.id: v for v in nt.read_corpus(FILES).verses}
    hyps, refs = nt.translation_texts(cfg, [ex], [ex.tgt])
    assert hyps == refs == [" ".join(by_id[ex.id.split("/", 2)[2]].greek)]


def test_an_example_naming_no_verse_is_refused(monkeypatch):
    cfg, _ = _fixture_splits(monkeypatch)
    bad = Example("nt/test/99001001", ("▁a",), ("▁a",))
    with pytest.raises(DataError, match="names no verse"):
        nt.translation_texts(cfg, [bad], [["▁a"]])


def test_without_sacrebleu_a_translation_task_is_refused_before_training(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sacrebleu.metrics", None)  # import fails
    with pytest.raises(translation.TranslationMetricError, match="sacrebleu.*make test-deps"):
        translation.check_installed(data_config(task=nt.TASK))
    assert isinstance(translation.TranslationMetricError("x"), DataError)  # one line, exit 2
    translation.check_installed(data_config(task="copy"))  # not translation: nothing needed


def test_the_report_shows_the_logged_intervals_for_a_translation_task_only():
    """The report's task table reads BLEU/chrF with their logged intervals (task_estimates),
    and the table of trainings has their columns for a translation task only."""
    from attnstudy.report.facts import task_estimates
    from attnstudy.report.store import ModelEntry
    from attnstudy.report.tables import training_row

    m = {"test/n": 805.0, "test/chrf": 19.5, "test/chrf_ci_low": 19.1, "test/chrf_ci_high": 20.0}
    m |= {"test/bleu": 3.77, "test/bleu_ci_low": 3.35, "test/bleu_ci_high": 4.21}
    entry = ModelEntry("t", nt.TASK, "multihead", "–", "1", "r", "FINISHED", "t", model_metrics=m)
    est = task_estimates(entry)
    assert est["test/chrf"].fmt(3) == "19.5 [19.1, 20]" and est["test/chrf"].n == 805
    assert est["test/bleu"].fmt(3) == "3.77 [3.35, 4.21]"
    assert "test_beam/chrf" not in est  # not logged: no cell
    row = training_row("t", "1", "FINISHED", metrics=m, params={}, run_id="r", task=nt.TASK)
    assert row["chrF, greedy"] == "19.5 [19.1, 20.0]" and row["chrF, beam"] == ""
    other = training_row("t", "1", "FINISHED", metrics=m, params={}, run_id="r", task="copy")
    assert "chrF, greedy" not in other and "CPU minutes" not in other


def test_the_task_registry_decides_the_columns_of_the_table_of_trainings():
    """A translation task's table of trainings (and task table) carries its token error rate and
    BLEU/chrF, not WER or exact match (1 and 0 for nearly every verse: the published models had
    dev and test WER 100.00); every other task keeps its columns, in their order."""
    from attnstudy.data.tasks import task_metrics
    from attnstudy.report.tables import training_row

    m = {"train/epochs": 3.0, "train/best_epoch": 3.0, "train/seconds": 1416.0}
    m |= {"best_dev/wer": 1.0, "best_dev/per": 0.8918, "test/wer": 1.0, "test/per": 0.8841}
    m |= {"test/chrf": 14.7, "test/chrf_ci_low": 14.3, "test/chrf_ci_high": 15.0}
    row = training_row("t", "1", "FINISHED", metrics=m, params={}, run_id="r", task=nt.TASK)
    assert (row["dev PER %"], row["test PER %"]) == ("89.18", "88.41")
    assert not [k for k in row if "WER" in k or "exact" in k]
    assert row["chrF, greedy"] == "14.7 [14.3, 15.0]" and row["minutes"] == "23.6"
    assert [t.key for t in task_metrics([nt.TASK])] == ["test/per"] + [
        t.key for t in TRANSLATION_METRICS
    ]
    head = ["model", "seed", "status", "epochs", "best epoch", "minutes"]
    rates = ["dev WER %", "dev PER %", "test WER %", "test PER %"]
    tail = ["beam", "config", "run"]
    for task in ("copy", "g2p", "dates", "tsv", None, "a task of another version"):
        other = training_row("t", "1", "FINISHED", metrics=m, params={}, run_id="r", task=task)
        assert list(other) == head + rates + tail, task
        assert (other["dev WER %"], other["test PER %"]) == ("100.00", "88.41")
