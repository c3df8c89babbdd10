"""Benchmark 12 — reading a 2,000-model study's records, in bulk against one run at a time.

The report reads a study's runs (:func:`attnstudy.tracking.store.study_runs`): its models and
their ablation runs, found by their membership tags (``attnstudy.study.<study id>``) with one
paged search. Before 2026-12-07 it read each recorded id with its own ``get_run``. Both are timed
here, interleaved, on the 2,000-model stub study of ``tests/fixtures/stub_store.py`` (2,000 model
runs and 2,000 ablation runs in a local SQLite store, no training), and so is everything
:func:`attnstudy.report.store.load_study` reads besides the tables (its artifact checks: the stub
runs have none). Target: bulk at least 3× faster than one run at a time.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_records [--smoke] [--models N]``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from . import common

TARGET = 3.0


def run(args) -> dict:
    from attnstudy.report.store import load_study
    from attnstudy.tracking import Tracker, store
    from tests.fixtures import stub_store

    n = args.models or (200 if args.smoke else 2000)
    repeats = args.repeats or (1 if args.smoke else 3)
    with tempfile.TemporaryDirectory(prefix="attnstudy-bench-records-") as tmp:
        build_s, stub = common.timed(lambda: stub_store.build(Path(tmp) / "root", n))
        tracker = Tracker(stub.uri, create=False)
        ids = stub.models + stub.ablations

        def bulk():
            runs = store.study_runs(tracker, stub.study_id)
            return [r.run_id for r in runs.models] + [runs.ablations[m].run_id for m in stub.models]

        def one_by_one():
            return [tracker.get_run(i).run_id for i in ids]

        timings = common.interleaved({"bulk": bulk, "one at a time": one_by_one}, repeats=repeats)
        same = timings["bulk"].result == timings["one at a time"].result == ids
        report_s, data = common.timed(lambda: load_study(tracker, stub.study_id))
        assert len(data.entries) == n
    ratio = timings["one at a time"].best / timings["bulk"].best
    rows = [
        {
            "models": n,
            "runs read": len(ids),
            "bulk s": timings["bulk"].best,
            "one at a time s": timings["one at a time"].best,
            "one at a time / bulk": ratio,
            "load_study s": report_s,
            "same runs": same,
        }
    ]
    notes = [
        f"stub store built in {build_s:.1f} s (not counted; one transaction)",
        f"bulk: one paged search of the membership tag ({len(ids)} runs, tags and metrics); "
        f"one at a time: {len(ids)} get_run calls; "
        f"ratio {ratio:.1f}× (target ≥ {TARGET:g}×, {common.verdict(ratio, TARGET)})",
        "load_study: the report's whole read of the study, tables excepted (the stub runs have "
        "no artifacts, so each of its artifact checks finds none); one run",
        common.load_note(args),
    ]
    common.report(
        "Study records: a 2,000-model study read in bulk vs one run at a time",
        args,
        {"models": n, "timing": f"best of {repeats} interleaved"},
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows, "ratio": ratio, "same": same}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=None, help="stub models (default 2,000)")
    args = p.parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
