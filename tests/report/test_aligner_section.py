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
def golden_study(tmp_path_factory):
    """The golden fixture study as the report reads it: its data, facts and per-layer facts."""
    spec = importlib.util.spec_from_file_location("golden_build", GOLDEN / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    root = tmp_path_factory.mktemp("golden-aligner")
    study = module.load(root)
    data = load_study(Tracker(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"), study)
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
