"""One quickstart time: README, docs/benchmarks.md and experiments/quickstart.toml quote the one
record experiments/results/quickstart-time.csv through generated blocks, and no other time."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnstudy.report import results

ROOT = Path(__file__).parents[2]
RESULTS = ROOT / "experiments" / "results"
QUOTING = ("README.md", "docs/benchmarks.md", "experiments/quickstart.toml")

ROW = {
    "date": "2026-12-07",
    "machine": "2-core VM",
    "load at start": "0.6",
    "code": "53d30d5",
    "command": "make run",
    "set-up": "the virtual environment already set up",
    "models": "6",
    "wall s": "148",
    "user CPU s": "239",
    "source": "by hand",
}


def test_the_sentence_reads_the_record():
    assert results.duration(148) == "2 min 28 s" and results.duration(42.4) == "42 s"
    assert results.quickstart_time(ROW) == (
        "`make run` took **2 min 28 s** on an idle 2-core VM, the virtual environment already set "
        "up (2026-12-07, code 53d30d5, load 0.6 at its start; 3 min 59 s of user CPU over all "
        "cores): 6 models trained and ablated, then the report."
    )


def test_a_block_is_written_as_markdown_or_as_toml_comments(tmp_path):
    (tmp_path / results.QUICKSTART_TIME).write_text(
        ",".join(ROW) + "\n" + ",".join(ROW.values()) + "\n", encoding="utf-8"
    )
    md = "a\n<!-- quickstart-time:begin (x) -->\nold\n<!-- quickstart-time:end -->\nb\n"
    out = results.render_time_blocks(md, tmp_path)
    assert out == (
        "a\n<!-- quickstart-time:begin (x) -->\n"
        + results.quickstart_time(ROW)
        + "\n<!-- quickstart-time:end -->\nb\n"
    )
    toml = "# quickstart-time:begin\n# old\n# quickstart-time:end\n[experiment]\n"
    lines = results.render_time_blocks(toml, tmp_path).splitlines()
    assert lines[0] == "# quickstart-time:begin" and lines[-2:] == [
        "# quickstart-time:end",
        "[experiment]",
    ]
    assert all(line.startswith("# ") and len(line) <= 100 for line in lines[1:-2])
    assert " ".join(line[2:] for line in lines[1:-2]) == results.quickstart_time(ROW).replace(
        "**", ""
    )
    assert results.render_time_blocks("no block\n", tmp_path / "nowhere") == "no block\n"


def test_two_records_are_refused(tmp_path):
    (tmp_path / results.QUICKSTART_TIME).write_text(
        ",".join(ROW) + "\n" + (",".join(ROW.values()) + "\n") * 2, encoding="utf-8"
    )
    with pytest.raises(ValueError, match="holds 2 rows; the quickstart has one time"):
        results.render_time_blocks("# quickstart-time:begin\n# quickstart-time:end\n", tmp_path)


@pytest.mark.parametrize("name", QUOTING)
def test_each_place_quotes_the_one_record_and_no_other_time(name):
    text = (ROOT / name).read_text(encoding="utf-8")
    assert results.TIME_BLOCK.search(text), f"{name} has no quickstart-time block"
    assert results.render_time_blocks(text, RESULTS) == text, f"{name} is stale: run `make docs`"
    outside = results.TIME_BLOCK.sub("", text)
    if name == "docs/benchmarks.md":  # the section that quotes it; the profile tables follow
        outside = outside.split("## The quickstart's time", 1)[1].split("###", 1)[0]
    durations = re.findall(r"\d+ min(?:utes)?(?: \d+ s)?|\d+(?:\.\d+)? s\b", outside)
    assert not durations, f"{name} quotes another quickstart time: {durations}"


def test_the_benchmark_writes_a_record_the_docs_read(tmp_path):
    from benchmarks import bench_study

    run = {"load before": "0.42 0.50 0.61", "wall": 151.4, "user cpu": 240.2, "workers": 2}
    bench_study.record(tmp_path / results.QUICKSTART_TIME, run, 6)
    (row,) = results.read_rows(tmp_path / results.QUICKSTART_TIME)
    assert (row["load at start"], row["wall s"], row["user CPU s"], row["models"]) == (
        "0.42",
        "151",
        "240",
        "6",
    )
    assert "took **2 min 31 s**" in results.quickstart_time(row)
