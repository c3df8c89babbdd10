"""Benchmark — an ablation worker's peak memory against the number of analysed examples.

One G2P model (the quickstart sizes, ``additive``/``bahdanau``, trained here for a few epochs in a
throwaway store) is ablated by :func:`attnstudy.study.ablation_runs.ablate_run` — the default
battery,
the example browser, the tables, figures and verdict, everything an ablation run of a study
does — on 100, 300, 1,000 and 3,000 test examples, each in a fresh process, whose peak resident
memory (``VmHWM``) is read at its end. Target: the peak grows by at most 10 % from 100 to 3,000
examples. The adversarial search costs ~0.5 CPU s per example, so the curve with it stops at
1,000 examples (``--max-adversarial``) and goes on to 3,000 without it (the battery less
``adversarial``; the rest is the default battery).

``--profile N`` runs one worker on N examples under :mod:`tracemalloc` and prints what is held
(grouped by traceback) at the end of the suite and when the browser page is built, and the
Python-allocation peak of each phase: how the holders were found.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_memory [--smoke] [--sizes 100,300,1000,3000]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common

TARGET = 0.10
"""Largest relative growth of the peak from the smallest to the largest size."""
SIZES = (100, 300, 1000, 3000)
ADVERSARIAL_MAX = 1000


def vm_hwm_kb() -> int:
    """This process's peak resident set (``VmHWM`` of ``/proc/self/status``), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _train(root: Path, n_test: int, epochs: int, smoke: bool) -> str:
    """Train the benchmark's model into the store under ``root`` (or find it there: the run id
    in ``root/bench_memory_run.txt``, with at least ``n_test`` test examples); its run id."""
    mark = root / "bench_memory_run.txt"
    if mark.is_file():
        run_id, have = mark.read_text().split()
        if int(have) >= n_test:
            return run_id
    from attnstudy.study.model_runs import train_spec
    from attnstudy.tracking import Tracker

    spec = common.run_spec(
        "bahdanau",
        n_train=300 if smoke else 6000,
        n_dev=20 if smoke else 200,
        n_test=n_test,
        epochs=epochs,
    )
    with common.project_root(root):  # the caller's project root is left as it was
        tracker = Tracker()
        run = train_spec(
            spec, tracker, experiment_id=tracker.experiment_id("bench"), progress=False
        )
    mark.write_text(f"{run.run_id} {n_test}\n")
    return run.run_id


def _battery(adversarial: bool) -> list[str]:
    from attnstudy.analysis.catalogue import list_ablations

    return [a for a in list_ablations(default_only=True) if adversarial or a != "adversarial"]


def worker(args) -> dict:
    """One ablation run in this process (``--worker``): the numbers as one JSON line."""
    import torch

    torch.set_num_threads(1)
    os.environ["ATTNSTUDY_ROOT"] = args.root
    from attnstudy.analysis.catalogue import AblationConfig

    from attnstudy.study.ablation_runs import ablate_run
    from attnstudy.study.model_runs import load_model
    from attnstudy.tracking import Tracker

    tracker = Tracker(create=False)
    _, loaded = load_model(f"runs:/{args.run_id}", tracker)
    cfg = AblationConfig(
        n_examples=args.worker,
        ablations=_battery(not args.no_adversarial),
        bootstrap_resamples=200 if args.smoke else 1000,
    )
    import attnstudy.analysis.suite as suite

    marks = {}
    run_suite = suite.run_suite

    def suite_hook(*a, **k):  # where the peak is reached: in the suite or in the pages after it
        result = run_suite(*a, **k)
        marks["suite"] = vm_hwm_kb()
        return result

    suite.run_suite = suite_hook
    if args.phases:
        _watch_phases(marks)
    before = vm_hwm_kb()
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    ablate_run(args.run_id, loaded, cfg, tracker, progress=False)
    out = {
        "examples": args.worker,
        "adversarial": not args.no_adversarial,
        "peak MiB": vm_hwm_kb() / 1024,
        "before ablation MiB": before / 1024,
        "peak at the suite's end MiB": marks["suite"] / 1024,
        "seconds": time.perf_counter() - t0,
        "cpu s": time.process_time() - cpu0,
    }
    if args.phases:
        for name, (start, peak) in marks.get("phases", {}).items():
            print(
                f"PHASE {name}: resident {start / 1024:.0f} MiB at its start, peak {peak / 1024:.0f} MiB"
            )
    print("RESULT " + json.dumps(out), flush=True)
    return out


def _reset_peak() -> bool:
    """Reset this process's ``VmHWM`` to its current resident set (Linux ≥ 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _watch_phases(marks: dict) -> None:
    """``--phases``: the peak resident set of each step of an ablation run's pages (VmHWM reset
    before each), for finding what holds memory without tracemalloc's cost."""
    import attnstudy.analysis.figures as figures

    import attnstudy.pages.browser as browser
    import attnstudy.pages.run_pages as run_pages
    import attnstudy.tracking.client as client

    phases = marks.setdefault("phases", {})
    overall = {"peak": 0}

    def wrap(module, name, label=None):
        real = getattr(module, name, None)
        if real is None:  # another version of the code
            return

        def hooked(*a, **k):
            overall["peak"] = max(overall["peak"], vm_hwm_kb())
            start = _rss_kb()
            _reset_peak()
            try:
                return real(*a, **k)
            finally:
                key = label or name
                if key in phases:
                    key = f"{key} ({len([p for p in phases if p.startswith(key)])})"
                phases[key] = (start, vm_hwm_kb())

        setattr(module, name, hooked)

    wrap(run_pages, "per_example_summary", "per_example_summary (pages)")
    wrap(browser, "per_example_summary", "per_example_summary (browser)")
    wrap(run_pages, "per_example_summary_file")
    wrap(run_pages, "write_steps_csv")
    wrap(run_pages, "steps_of_examples")
    wrap(run_pages, "_predictions")
    wrap(browser, "browser_data")
    wrap(browser, "browser_html")
    wrap(figures, "example_heatmaps")
    wrap(figures, "estimates_plot")
    wrap(client.Tracker, "log_text")
    wrap(client.Tracker, "log_table")
    wrap(client.Tracker, "log_artifact")
    wrap(run_pages, "log_ablation_pages")


def profile(args) -> None:
    """``--profile N``: tracemalloc snapshots of one worker (see the module docstring)."""
    import tracemalloc

    import attnstudy.analysis.suite as suite

    import attnstudy.pages.browser as browser
    import attnstudy.pages.run_pages as run_pages

    snapshots: dict[str, tracemalloc.Snapshot] = {}
    peaks: dict[str, float] = {}

    def phase(name: str) -> None:
        peaks[name] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.reset_peak()
        snapshots[name] = tracemalloc.take_snapshot()

    run_suite, browser_html, log_pages = suite.run_suite, browser.browser_html, None

    def suite_hook(*a, **k):
        phase("before the suite")
        result = run_suite(*a, **k)
        phase("end of the suite (result and recorder held)")
        return result

    def browser_hook(data):
        phase("browser data built (steps table, records, browser data held)")
        return browser_html(data)

    log_pages = run_pages.log_ablation_pages

    def pages_hook(*a, **k):
        out = log_pages(*a, **k)
        phase("end of the pages")
        return out

    suite.run_suite, browser.browser_html = suite_hook, browser_hook
    run_pages.log_ablation_pages = pages_hook
    tracemalloc.start(40)
    args.worker = args.profile
    worker(args)
    filters = [tracemalloc.Filter(False, tracemalloc.__file__)]
    base = None
    for name, snap in snapshots.items():
        snap = snap.filter_traces(filters)
        stats = snap.statistics("traceback")
        total = sum(s.size for s in stats) / 2**20
        print(
            f"\n== {name}: {total:.1f} MiB traced; peak since the previous phase {peaks[name]:.1f} MiB"
        )
        if base is None:  # what the run holds before the suite (data, model): the base
            base = snap
        else:  # what the phase holds beyond the base
            stats = [d for d in snap.compare_to(base, "traceback") if d.size_diff > 0]
            for d in stats:
                d.size, d.count = d.size_diff, d.count_diff
            print("   (held beyond what was held before the suite)")
        # each allocation charged to the innermost line of attnstudy that led to it (its holder)
        by_line: dict[str, list] = {}
        for s in stats:
            # frames oldest first: the last of attnstudy's is the line that allocated (or called
            # the library that did)
            ours = [
                f
                for f in s.traceback
                if ("/attnstudy/" in f.filename or "/analysis/" in f.filename)
                and "site-packages" not in f.filename
            ][::-1]
            key = f"{ours[0].filename}:{ours[0].lineno}" if ours else "(outside attnstudy)"
            entry = by_line.setdefault(key, [0, 0, ours])
            entry[0] += s.size
            entry[1] += s.count
        for key, (size, count, ours) in sorted(by_line.items(), key=lambda kv: -kv[1][0])[:12]:
            chain = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in ours[:5])
            print(f"{size / 2**20:8.2f} MiB {count:8d} blocks  {chain or key}")


def run(args) -> dict:
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(SIZES)
    if args.smoke:
        sizes = [4, 8]
    adv_max = 8 if args.smoke else args.max_adversarial
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnstudy-bench-memory-") as tmp:
        tmp = args.root or tmp  # --root: a store kept between runs (its model trained once)
        t0 = time.perf_counter()
        run_id = _train(Path(tmp), max(sizes), args.epochs or (1 if args.smoke else 3), args.smoke)
        if args.train_only:
            return {"run_id": run_id}
        train_s = time.perf_counter() - t0
        plan = [(n, True) for n in sizes if n <= adv_max] + [(n, False) for n in sizes]
        if args.smoke:  # two workers (each ~14 s of fixed cost): the curve with adversarial
            plan = [(n, True) for n in sizes]
        for n, adversarial in plan:
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.bench_memory",
                "--worker",
                str(n),
                "--root",
                tmp,
                "--run-id",
                run_id,
                *(["--smoke"] if args.smoke else []),
                *([] if adversarial else ["--no-adversarial"]),
            ]
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(["src", "."]))
            res = subprocess.run(
                cmd, capture_output=True, text=True, env=env, cwd=common.HERE.parent
            )
            line = next((x for x in res.stdout.splitlines() if x.startswith("RESULT ")), None)
            if res.returncode != 0 or line is None:
                raise RuntimeError(f"worker on {n} examples failed:\n{res.stderr[-3000:]}")
            rows.append(json.loads(line.removeprefix("RESULT ")))
            print(common.table([rows[-1]]), flush=True)
    growth = {}
    for adversarial in (True, False):
        curve = [r for r in rows if r["adversarial"] == adversarial]
        if len(curve) >= 2:
            first, last = curve[0], curve[-1]
            growth[adversarial] = (last["peak MiB"] - first["peak MiB"]) / first["peak MiB"]
    notes = [
        "model: G2P, quickstart sizes, additive/bahdanau, 3 epochs on 6,000 words "
        + (f"(trained here, {train_s:.0f} s)" if train_s > 60 else "(trained once, reused)")
        + "; each size a fresh process (torch 1 thread); peak = VmHWM at the end (imports, "
        "model and the task's data, about 800 MiB, included)",
        "battery: the default ablations (with adversarial up to "
        f"{adv_max:,} examples; without it, the rest of the default battery, to {max(sizes):,}), "
        "browser and every page of the run on",
        *(
            f"{'with' if a else 'without'} adversarial: peak grows {100 * g:+.1f} % from "
            f"{[r for r in rows if r['adversarial'] == a][0]['examples']:,} to "
            f"{[r for r in rows if r['adversarial'] == a][-1]['examples']:,} examples (target "
            f"≤ {100 * TARGET:.0f} %, {common.verdict(-g, -TARGET)})"
            for a, g in growth.items()
        ),
        common.load_note(args),
    ]
    common.report(
        "Memory: an ablation worker's peak against the number of examples",
        args,
        {"sizes": ", ".join(f"{n:,}" for n in sizes)},
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows, "growth": growth}


def main(argv=None) -> dict | None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default=None, help="comma-separated example counts")
    p.add_argument("--max-adversarial", type=int, default=ADVERSARIAL_MAX)
    p.add_argument("--epochs", type=int, default=None, help="training epochs (default 3)")
    p.add_argument("--profile", type=int, default=None, help="tracemalloc one worker on N examples")
    p.add_argument(
        "--root", default=None, help="a project root kept between runs (the model trained once)"
    )
    p.add_argument("--train-only", action="store_true", help="train (or find) the model, stop")
    p.add_argument("--worker", type=int, default=None, help=argparse_hidden())
    p.add_argument("--run-id", default=None, help=argparse_hidden())
    p.add_argument("--no-adversarial", action="store_true", help=argparse_hidden())
    p.add_argument("--phases", action="store_true", help="each page step's peak (a worker)")
    args = p.parse_args(argv)
    if args.worker is not None:
        return worker(args)
    if args.profile is not None:
        args.root = args.root or tempfile.mkdtemp(prefix="attnstudy-bench-memory-")
        args.run_id = _train(Path(args.root), args.profile, args.epochs or 3, args.smoke)
        profile(args)
        return None
    if args.idle_load is None:
        args.idle_load = 1.3  # one torch thread per worker (common.setup's threshold)
    common.LOAD.start()
    return run(args)


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
