"""benchmarks/bench_refusals.py in smoke mode: it runs, times each case and leaves nothing behind
(never a timing assertion: the machine may be busy)."""

from __future__ import annotations


def test_refusal_benchmark_times_each_case(tmp_path):
    from benchmarks import bench_refusals

    results = tmp_path / "RESULTS.md"
    out = bench_refusals.main(["--smoke", "--results", str(results)])
    assert [r["refusal"] for r in out["rows"]] == [c[0] for c in bench_refusals.CASES[:3]]
    assert [r["exit"] for r in out["rows"]] == [0, 1, 2]  # --help, a refused server, a bad URI
    assert all(r["CPU s"] > 0 for r in out["rows"])
    assert out["created"] == []
    assert "Refusals: CPU time" in results.read_text(encoding="utf-8")
