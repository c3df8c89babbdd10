"""The report's text is a function of the store alone: a committed fixture study's ``summary.csv``
and ``report.md`` are rebuilt byte for byte (recorded before the catalogue drove the report, so a
refactoring of how tables are built cannot change a published string)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parents[1] / "fixtures" / "golden"


def _fixture():
    spec = importlib.util.spec_from_file_location("golden_build", GOLDEN / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def golden_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    study = _fixture().load(root)
    mp = pytest.MonkeyPatch()
    mp.setenv("ATTNSTUDY_ROOT", str(root))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.delenv("ATTNSTUDY_UI_URL", raising=False)
    try:
        from attnstudy import api

        path = api.report(study_id=study, out_dir=str(root / "report"))
    finally:
        mp.undo()
    return path.parent


@pytest.mark.parametrize("name", ["summary.csv", "report.md"])
def test_the_report_is_byte_identical_to_the_golden_file(golden_report, name):
    built = (golden_report / name).read_bytes()
    golden = (GOLDEN / name).read_bytes()
    if built != golden:  # the first differing line, for the reader of a failure
        for i, (a, b) in enumerate(zip(built.splitlines(), golden.splitlines()), 1):
            assert a == b, f"{name} line {i} differs"
    assert built == golden


def test_every_published_summary_column_is_a_label_of_the_catalogue_or_the_tasks():
    """The committed result tables (``report --results``) keep their headers: each statistic's
    column, as :func:`attnstudy.report.results.read_rows` reads it (a former label of a statistic
    renamed to its label now), is a label the catalogue or the task registry declares."""
    from attnstudy.analysis.catalogue import shown_stats

    from attnstudy.data.tasks import TASKS
    from attnstudy.report.results import read_rows

    labels = {s.stat.label for s in shown_stats()}
    labels |= {m.label for t in TASKS.values() for m in t.metrics}
    fixed = {"model", "examples", "steps", "test examples", "study run"}
    fixed |= {"layer", "aligner", "attention argmax"}  # the alignment tables' row keys
    # the breakdowns' row keys: a task's word tags (part of speech), the link shape
    fixed |= {"gold links", "link shape"}
    fixed |= {t.word_tags.label for t in TASKS.values() if t.word_tags is not None}
    results = Path(__file__).parents[2] / "experiments" / "results"
    tables = [
        p
        for p in results.glob("*.csv")
        if not p.stem.endswith(("-models", "-seed-variance", "-timing", "-adversaries"))
        and p.stem != "inseq-side-by-side"  # a benchmark's table (benchmarks/bench_inseq.py)
        and p.stem != "quickstart-time"  # the quickstart's time (benchmarks/bench_study.py)
        and not p.stem.startswith("nt-greek-english-eflomal")  # python -m attnstudy.data.eflomal
    ]
    assert len(tables) >= 8
    for path in tables:
        header = list(read_rows(path)[0])
        assert set(header) - fixed <= labels, (path.name, set(header) - fixed - labels)


def test_each_tables_steps_are_those_its_statistics_were_computed_on(golden_report):
    """The alignment table counted the greedy steps (110 for a model whose AER used 55 reference
    steps), then every analysed step (55, where gold mass has no value at the 8 <eos> steps):
    each question's steps column is the steps its statistics have a value at, as
    ``attnstudy ablate`` prints them (:func:`attnstudy.verdict.findings.steps_computed_on`)."""
    import re

    from attnstudy.report import load_study
    from attnstudy.tracking import Tracker
    from attnstudy.verdict.findings import steps_computed_on

    md = (golden_report / "report.md").read_text(encoding="utf-8")
    aligns = md.split("### Does it align with gold links?")[1].split("\n### ")[0]
    used = md.split("### Is attention used? Intervening on it")[1].split("\n### ")[0]
    store = golden_report.parent / "mlruns" / "mlflow.db"
    data = load_study(Tracker(f"sqlite:///{store}", create=False), _study_id())
    for e in data.entries:
        if e.attention == "none":
            continue
        m = e.ablation_metrics
        for table, keys in (
            (aligns, ["ablation/alignment/aer", "ablation/alignment/gold_mass"]),
            (used, ["ablation/permutation/flip_rate", "ablation/uniform/flip_rate"]),
        ):
            counts = sorted({steps_computed_on(m, k) for k in keys})
            want = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
            row = re.search(rf"^\| {re.escape(e.variant)} \| (\d+) \| ([^|]+) \|", table, re.M)
            assert row.group(2).strip() == want, (e.variant, keys)
    # AER and gold mass alike: 55 reference steps less the 8 <eos> steps (110 greedy steps, then
    # 55 counting <eos>, before)
    assert "| copy additive-bahdanau | 8 | 47 |" in aligns
    assert "| copy additive-bahdanau | 8 | 110 |" in used


def _study_id() -> str:
    return (GOLDEN / "store" / "STUDY").read_text(encoding="utf-8").strip()


def test_the_golden_store_is_made_by_the_battery_of_today():
    """The committed store is the battery's current output, not an older one's: every statistic
    it logged has its count of undefined steps (the report's steps column subtracts it; a store
    made before ratio statistics logged theirs counted AER at <eos> and printed "47 to 55"), and
    every model with attention logged ``aer_shift`` (a store made before it printed "undefined").
    Rebuild a stale store with ``python tests/fixtures/golden/build.py``."""
    import sqlite3

    from attnstudy.analysis.catalogue import stat_keys

    with sqlite3.connect(GOLDEN / "store" / "mlflow.db") as db:
        rows = db.execute("select run_uuid, key from latest_metrics where key like 'ablation/%'")
        logged: dict[str, set[str]] = {}
        for run, key in rows:
            logged.setdefault(run, set()).add(key)
    stats = set(stat_keys())
    aligned = [keys for keys in logged.values() if "ablation/alignment/n_steps" in keys]
    assert len(aligned) == 4  # the two additive and the two Transformer models
    for keys in logged.values():
        assert not sorted(k for k in keys & stats if f"{k}_n_undefined" not in keys)
    for keys in aligned:
        assert "ablation/alignment/aer_shift" in keys
