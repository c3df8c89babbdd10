"""Committed result tables: the docs' generated blocks are current (docs/findings.md,
docs/benchmarks.md), and every number with an interval in the findings (and in README, which
quotes a few) is a cell of a committed table (experiments/results/*.csv, written by
``attnstudy report --results``)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from attnstudy.report import results

ROOT = Path(__file__).parents[2]
RESULTS = ROOT / "experiments" / "results"
FINDINGS = "docs/findings.md"
BENCHMARKS = "docs/benchmarks.md"
"""Where the Findings and the "Results on this machine" section live (README links to them)."""


def _doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _markdown_files() -> list[str]:
    return ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def test_write_and_render_a_block(tmp_path):
    rows = [
        {"model": "a|b", "λ": "0.1", "JSD": "0.3 [0.2, 0.4]"},
        {"model": "c", "λ": "1", "JSD": "0.5 [0.45, 0.55]"},
    ]
    (path,) = results.write_results(tmp_path, "exp", {"-x": rows, "-empty": []})
    assert path.name == "exp-x.csv" and results.read_rows(path) == rows
    text = "before\n<!-- results:exp-x.csv[model,JSD]:begin -->\nstale\n<!-- results:exp-x.csv:end -->\n"
    out = results.render_blocks(text, tmp_path)
    assert out == (
        "before\n<!-- results:exp-x.csv[model,JSD]:begin -->\n| model | JSD |\n|---|---|\n"
        "| a\\|b | 0.3 [0.2, 0.4] |\n| c | 0.5 [0.45, 0.55] |\n<!-- results:exp-x.csv:end -->\n"
    )
    assert results.render_blocks(out, tmp_path) == out  # idempotent
    with pytest.raises(KeyError, match="no column 'TVD'"):
        results.render_blocks(text.replace("[model,JSD]", "[model,TVD]"), tmp_path)
    with pytest.raises(KeyError) as err:  # one column, comma and all
        results.render_blocks(text.replace("[model,JSD]", '["λ, lambda"]'), tmp_path)
    assert err.value.args[0].startswith("exp-x.csv has no column 'λ, lambda'")
    (tmp_path / "exp-q.csv").write_text('model,"AER, linked"\na,0.5\n', encoding="utf-8")
    q = '<!-- results:exp-q.csv["AER, linked", model]:begin -->\n<!-- results:exp-q.csv:end -->'
    assert results.render_blocks(q, tmp_path).splitlines()[1:4] == [
        "| AER, linked | model |",
        "|---|---|",
        "| 0.5 | a |",
    ]
    with pytest.raises(FileNotFoundError):
        results.render_blocks(text.replace("exp-x.csv", "exp-y.csv"), tmp_path)


def test_a_block_reads_a_second_study_from_one_sub_folder(tmp_path):
    """A second study of one experiment writes its tables (same names) into a sub-folder; a block
    names it as ``<folder>/<file>.csv``; a path that climbs out (``..``) is no block."""
    results.write_results(tmp_path / "layers", "exp", {"-x": [{"model": "m", "AER": "0.7"}]})
    text = "<!-- results:layers/exp-x.csv[AER]:begin -->\n<!-- results:layers/exp-x.csv:end -->"
    assert results.render_blocks(text, tmp_path).splitlines()[1:4] == [
        "| AER |",
        "|---|",
        "| 0.7 |",
    ]
    climbing = text.replace("layers/", "../")
    assert results.render_blocks(climbing, tmp_path) == climbing


def test_interval_pattern():
    found = results.INTERVAL.findall("p 0.586 [0.573, 0.598], JSD 5.18e-06 [2.37e-06, 8.23e-06]")
    assert found == ["0.586 [0.573, 0.598]", "5.18e-06 [2.37e-06, 8.23e-06]"]


def test_result_blocks_are_generated_from_the_committed_tables():
    for name in (FINDINGS, BENCHMARKS):
        assert list(results.MARKER.finditer(_doc(name))), f"{name} has no results block"
    for name in _markdown_files():  # README and every chapter: whatever blocks they have
        text = _doc(name)
        assert results.render_blocks(text, RESULTS) == text, f"{name} is stale: run `make docs`"


def _prose(text: str) -> str:
    """Text without its generated blocks, its lines joined (a number and its interval may be
    broken across lines)."""
    return " ".join(re.sub(r"<!-- results:.*?:end -->", "", text, flags=re.S).split())


def _section(text: str, title: str) -> str:
    """A ``## title`` section of a Markdown file, as :func:`_prose`."""
    body = text.split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]
    return _prose(body)


@functools.cache
def _cells() -> frozenset[str]:
    """Every cell of every committed table (read once per test process)."""
    return frozenset(
        {
            cell
            for csv in [*RESULTS.glob("*.csv"), *RESULTS.glob("*/*.csv")]
            for row in results.read_rows(csv)
            for cell in row.values()
        }
    )


def test_every_number_with_an_interval_in_the_findings_is_a_committed_cell():
    text = _doc(FINDINGS)
    assert text.startswith("# Findings\n"), f"{FINDINGS} is no longer the Findings"
    quoted = results.INTERVAL.findall(_prose(text))
    assert len(quoted) > 50, "the Findings quote too few numbers with their interval"
    missing = [q for q in quoted if q not in _cells()]
    assert not missing, f"numbers in {FINDINGS} without a committed table cell: {missing}"


def test_every_number_with_an_interval_in_the_readme_is_a_committed_cell():
    """README's summary of what the quickstart's larger studies found quotes the Findings."""
    quoted = results.INTERVAL.findall(_prose(_doc("README.md")))
    assert quoted, "README quotes no number with its interval"
    missing = [q for q in quoted if q not in _cells()]
    assert not missing, f"numbers in README without a committed table cell: {missing}"


def test_every_measured_number_in_the_results_section_is_a_committed_cell():
    """'Results on this machine': every number with an interval, and every percentage given to
    two decimals (the tables' WER/PER), is a cell; the literature's reference WERs (one decimal)
    are not measurements."""
    text = _section(_doc(BENCHMARKS), "Results on this machine")
    quoted = results.INTERVAL.findall(text) + re.findall(r"(\d+\.\d\d) %", text)
    assert quoted, "the Results section quotes no measured number"
    missing = [q for q in quoted if q not in _cells()]
    assert not missing, (
        f"numbers in {BENCHMARKS}'s Results without a committed table cell: {missing}"
    )


@pytest.mark.slow
def test_an_experiment_without_a_study_gets_its_table_of_trainings(fresh_root):
    """``attnstudy train`` makes model runs but no study: ``report --results`` then writes the
    table of trainings alone, from the store."""
    from attnstudy import api
    from attnstudy.experiment import load_experiment
    from attnstudy.tracking import Tracker

    models = api.train_experiment(
        load_experiment(ROOT / "experiments" / "tiny.toml"), progress=False
    )
    path = api.report(experiment="tiny", results_dir=str(fresh_root / "res"))
    assert path.name == "tiny-models.csv"
    rows = {r["run"]: r for r in results.read_rows(path)}
    assert set(rows) == {m.run_id for m in models}
    tracker = Tracker()
    for m in models:
        run = tracker.get_run(m.run_id)
        row = rows[m.run_id]
        assert row["status"] == "FINISHED" and row["epochs"] == "2"
        assert row["test WER %"] == f"{100 * run.metrics['test/wer']:.2f}"
        # the report's column of the token error rate, logged by a copy task under its own name
        assert row["dev PER %"] == f"{100 * run.metrics['best_dev/token_error_rate']:.2f}"
        assert f"model.attention={m.spec.model.attention}" in row["config"]
    with pytest.raises(LookupError, match="no experiment 'nope'"):
        api.report(experiment="nope", results_dir=str(fresh_root / "res"))


def test_the_hugging_face_example_is_measured_from_committed_tables():
    """docs/own-model.md's shipped Hugging Face example shows committed tables (rewritten by
    ``make docs``), and its prose quotes no measured number (an interval, a percentage, a
    decimal) that is not a cell: it quoted "25 %" and "AER 0.009" of one build, which no build
    since reproduced."""
    text = _doc("docs/own-model.md")
    blocks = {m["file"] for m in results.MARKER.finditer(text)}
    assert {"hf-example.csv", "hf-example-layers/hf-example.csv", "hf-example-timing.csv"} <= blocks
    prose = _section(text, "Your own Hugging Face model")
    quoted = results.INTERVAL.findall(prose)
    quoted += re.findall(r"(\d+(?:\.\d+)?) ?%", prose)
    quoted += re.findall(r"(?<![\d.])\d+\.\d+(?![\d.])", prose)  # not a version (2.13.0)
    missing = [q for q in quoted if q not in _cells()]
    assert not missing, f"numbers in docs/own-model.md without a committed table cell: {missing}"


def test_the_weak_model_example_is_measured_from_committed_tables():
    """docs/own-data.md's worked example of a model too weak to study shows committed tables
    (rewritten by ``make docs``) and its prose quotes no measured number (an interval, a
    percentage, a decimal outside a code span, where settings are written) that is not a cell."""
    text = _doc("docs/own-data.md")
    blocks = {m["file"] for m in results.MARKER.finditer(text)}
    assert {"tsv-weak.csv", "tsv-weak-models.csv"} <= blocks
    prose = re.sub(r"`[^`]*`", "", _section(text, "When the model is too weak to study"))
    quoted = results.INTERVAL.findall(prose)
    assert len(quoted) >= 20, "the worked example quotes too few numbers"
    quoted += re.findall(r"(\d+(?:\.\d+)?) ?%", prose)
    quoted += re.findall(r"(?<![\d.\[])\d+\.\d+(?![\d.])", results.INTERVAL.sub("", prose))
    missing = [q for q in quoted if q not in _cells()]
    assert not missing, f"numbers in docs/own-data.md without a committed table cell: {missing}"
