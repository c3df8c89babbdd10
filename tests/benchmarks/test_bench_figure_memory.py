"""benchmarks/bench_figure_memory.py in smoke mode: its rows, and the growth per 100 saves it
judges, from a hand-made curve."""

import math

import pytest


@pytest.mark.slow  # six figures saved in a process that imports torch: ~5 s idle
def test_smoke_rows_every_n_saves(tmp_path):
    from benchmarks import bench_figure_memory

    results = tmp_path / "results.md"
    out = bench_figure_memory.main(
        ["--smoke", "--saves", "6", "--every", "3", "--results", str(results)]
    )
    assert [r["saves"] for r in out["rows"]] == [1, 3, 6]
    for r in out["rows"]:
        assert r["VmRSS MB"] > 0 and r["RssAnon MB"] > 0 and r["gc objects"] > 0
        assert math.isclose(r["VmRSS MB"], r["RssAnon MB"] + r["RssFile MB"], abs_tol=1.0)
    text = results.read_text(encoding="utf-8")
    assert "## Figure memory: resident memory over repeated heatmap saves (smoke)" in text
    assert "per 100 saves from save 1 to save 6" in text and "load average" in text
    assert "not judged (no save past the first 100" in text  # the warm-up alone


def test_growth_per_100_from_save_100_to_the_last():
    from benchmarks.bench_figure_memory import growth_per_100

    rows = [{"saves": s, "VmRSS MB": 200 + (40 if s >= 50 else 0) + s / 100} for s in (1, 50, 100)]
    rows += [{"saves": s, "VmRSS MB": 241 + 0.5 * (s - 100) / 100} for s in (300, 500)]
    assert math.isclose(growth_per_100(rows, "VmRSS MB"), 0.5)  # the warm-up's 40 MB left out
    assert math.isclose(growth_per_100(rows[:2], "VmRSS MB"), 100 * 40.49 / 49)  # shorter run
    assert math.isnan(growth_per_100(rows[:1], "VmRSS MB"))
