"""The report's "Attention's alignment beside a statistical aligner's" table appears only where a
reference aligner ran: on a study without one (the golden fixture: copy data with gold links, no
aligner) it repeated the alignment table's AER, precision and recall under a title promising an
aligner's row. The full study with eflomal is tests/study/test_reference_alignment.py (slow)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from attnstudy.report.alignment_tables import side_by_side_table
from attnstudy.report.facts import layer_facts, model_facts, thresholds_of
from attnstudy.report.store import load_study
from attnstudy.tracking import Tracker

GOLDEN = Path(__file__).parents[1] / "fixtures" / "golden"
TITLE = "Attention's alignment beside a statistical aligner's"


@pytest.fixture(scope="module")
def golden_store(tmp_path_factory):
    """The golden fixture's store: its tracker and study run id."""
    spec = importlib.util.spec_from_file_location("golden_build", GOLDEN / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path_factory.mktemp("golden-aligner")
    study = module.load(root)
    return Tracker(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"), study


@pytest.fixture(scope="module")
def golden_study(golden_store):
    """The golden fixture study as the report reads it: its data, facts and per-layer facts."""
    tracker, study = golden_store
    data = load_study(tracker, study)
    t = thresholds_of(data)
    facts = {e.model_run_id: model_facts(e, t) for e in data.entries}
    layers = {e.model_run_id: layer_facts(e, facts[e.model_run_id]) for e in data.entries}
    return data, facts, layers


def test_no_aligner_no_section(golden_study):
    data, facts, layers = golden_study
    assert not data.references
    assert any("alignment" in e.ablations_run for e in data.entries)  # the gold table's rows
    assert side_by_side_table(data, facts, layers) is None
    assert TITLE not in (GOLDEN / "report.md").read_text(encoding="utf-8")  # the built report
    assert "### Does it align with gold links?" in (GOLDEN / "report.md").read_text("utf-8")


def test_an_aligner_brings_the_section_with_its_row_first(golden_study, monkeypatch):
    data, facts, layers = golden_study
    reference = {
        "aligner": "eflomal, grow-diag-final-and",
        "how": "learnt on the test sources.",
        "scores": {"aer": (0.2, 0.15, 0.25), "precision": (0.8, 0.75, 0.85)}
        | {"recall": (0.7, 0.65, 0.75)},
        "counts": {"test_verses": 8},
    }
    monkeypatch.setattr(data, "references", [reference])
    table = side_by_side_table(data, facts, layers)
    assert table["title"] == TITLE
    assert "eflomal, grow-diag-final-and: learnt on the test sources." in table["intro"]
    header = table["header"]
    first = dict(zip(header, table["rows"][0]))
    assert (first["aligner"], first["AER"], first["precision"], first["recall"]) == (
        "eflomal, grow-diag-final-and",
        "0.2 [0.15, 0.25]",
        "0.8 [0.75, 0.85]",
        "0.7 [0.65, 0.75]",
    )
    assert sum(r[header.index("aligner")] == "attention argmax" for r in table["rows"]) == 6


def test_a_task_with_word_tags_gets_attention_s_breakdowns(golden_study, golden_store, monkeypatch):
    """Attention's alignment by the source word's tag and by link shape, from the stored per-step
    tables of the golden study, once its task (copy) has word tags in the registry (any task
    with them gets the breakdowns; without them, none)."""
    import dataclasses

    from attnstudy.data import breakdowns
    from attnstudy.data.tasks import TASKS, WordTags, load_task
    from attnstudy.report.alignment_tables import breakdown_rows, stored_examples

    data, _, _ = golden_study
    tracker, _ = golden_store
    assert breakdown_rows(data, stored_examples(tracker)) == {
        "-alignment-tags": [],
        "-alignment-shape": [],
    }

    def tags(cfg):  # the first symbols of the copy alphabet as one tag, the rest as another
        splits = load_task(cfg)
        return {
            ex.id: tuple("low" if t in "abcd" else "high" for t in ex.src)
            for ex in [*splits.train, *splits.dev, *splits.test]
        }

    tagged = WordTags("symbol class", tags, {"low": "first four"})
    monkeypatch.setitem(TASKS, "copy", dataclasses.replace(TASKS["copy"], word_tags=tagged))
    out = breakdown_rows(data, stored_examples(tracker))
    by_tag, by_shape = out["-alignment-tags"], out["-alignment-shape"]
    models = [e.variant for e in data.entries if "alignment" in e.ablations_run]
    assert models and {r["model"] for r in by_tag} == set(models) - {
        e.variant for e in data.entries if e.attention == "none"
    }
    assert {r["layer"] for r in by_tag} == {"analysed"}  # the golden battery: one unit a model
    groups = {r["symbol class"] for r in by_tag}
    assert {"first four", "high"} <= groups and "low" not in groups
    # copy: one gold link per target token, its own source token: every link 1–1, gold mass
    # and AER per group numbers
    assert {r["link shape"] for r in by_shape} <= {"1–1", breakdowns.NO_LINK}
    row = by_tag[0]
    assert row["examples"] == "8" and row["AER"].count("[") == 1
    assert 0 < float(row["gold mass"].split()[0]) <= 1
    # the step counts of one model and layer sum to its examples' gold links (one per token)
    first = [r for r in by_tag if (r["model"], r["layer"]) == (row["model"], row["layer"])]
    links = sum(float(r["gold links"]) for r in first)
    shape = [r for r in by_shape if (r["model"], r["layer"]) == (row["model"], row["layer"])]
    assert links == sum(float(r["gold links"]) for r in shape) > 0


def test_one_tag_for_every_word_gives_the_battery_s_own_alignment_numbers(
    golden_study, golden_store, monkeypatch
):
    """With a single tag, the breakdown's one group is the whole corpus: its AER, precision,
    recall and gold mass are the ``alignment`` ablation's own, as the battery logged them."""
    import dataclasses

    from attnstudy.data.tasks import TASKS, WordTags, load_task
    from attnstudy.report.alignment_tables import breakdown_rows, stored_examples
    from attnstudy.verdict.findings import Estimate

    data, _, _ = golden_study
    tracker, _ = golden_store

    def tags(cfg):
        splits = load_task(cfg)
        return {ex.id: ("x",) * len(ex.src) for ex in [*splits.train, *splits.dev, *splits.test]}

    monkeypatch.setitem(
        TASKS, "copy", dataclasses.replace(TASKS["copy"], word_tags=WordTags("tag", tags))
    )
    rows = breakdown_rows(data, stored_examples(tracker))["-alignment-tags"]
    entries = {e.variant: e for e in data.entries}
    checked = 0
    for r in rows:
        assert r["tag"] == "x"
        m = entries[r["model"]].ablation_metrics
        for label, stat in (("AER", "aer"), ("precision", "precision"), ("recall", "recall")):
            key = f"ablation/alignment/{stat}"
            if key not in m:
                continue
            logged = Estimate(m[key], m[f"{key}_ci_low"], m[f"{key}_ci_high"]).fmt(3)
            assert r[label] == logged, (r["model"], label)
            checked += 1
        key = "ablation/alignment/gold_mass"
        assert r["gold mass"].split()[0] == f"{m[key]:.3g}"
    assert checked >= 6  # two attention models, three statistics each
