"""Run every benchmark of the benchmark plan (``make bench``), each in its own process.

Full mode (the default) is sized for < 30 minutes on a 2-core machine; it first trains (or finds
in ``benchmarks/.cache/``) the two small quickstart G2P models the benchmarks share. Every
script appends its tables to ``benchmarks/RESULTS.md``. ``--smoke`` runs the tiny sizes.

With ``--jobs 2`` (the default on a machine with ≥ 2 cores) the benchmarks run in two lanes of
one-thread processes, one per core: the scaling benchmark (the longest) in one, the rest one
after another in the other. Every figure is a ratio of two things timed in the same process, so
a neighbour on the other core does not bias it; absolute times are for information only. The
FLOP-rate benchmark is the exception (a neighbour slows memory-bound kernels and ``torch.mm``
differently): it runs alone after the lanes, and judges its fractions only when the machine's
load stayed idle. Run ``make bench`` on an otherwise idle machine.

Run: ``PYTHONPATH=src:. python -m benchmarks.run_all [--smoke] [--only permutation,loo]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

from . import common

BENCHMARKS = [
    "permutation",
    "adversarial",
    "loo",
    "flops",
    "steps",
    "scaling",
    "training",
    "tracking",
    "records",
]
"""Script names (``benchmarks/bench_<name>.py``), in the order they are listed and run."""
OPT_IN = ["long", "attribution", "study", "figure_memory", "adversarial_solver"]
"""Benchmarks run only when named in ``--only`` (``long``: the battery on one example of up to
1,000 tokens, about 15 minutes on its own; ``attribution``: integrated gradients against gradient ×
input, and the attribution methods on one example of 1,000 tokens; ``study``: the quickstart study
with one worker and with two, and where its time goes, about 8 minutes on an idle 2-core machine;
``figure_memory``: resident memory over 500 saves of the heatmaps figure, about 3 minutes;
``adversarial_solver``: rprop-1 and J&W's solver against a 5,000-iteration J&W reference on the
three families, about 30 minutes)."""
NO_MODELS = {"study", "records", "figure_memory"}
"""Benchmarks that train their own models or need none (run_all prepares no shared benchmark
models for them)."""
ALONE = {"flops"}
"""Benchmarks that run alone after the parallel lanes: a FLOP rate against ``torch.mm`` is only
judged on an idle machine (``bench_flops --idle-load``)."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    p.add_argument(
        "--only",
        default=None,
        help=f"comma-separated subset of {','.join(BENCHMARKS)} (the default list) and of the "
        f"opt-in {','.join(OPT_IN)} (run only when named)",
    )
    p.add_argument(
        "--results", default=None, help="results file (default: benchmarks/RESULTS.md in full mode)"
    )
    p.add_argument("--model-uri", default=None, help="passed to every benchmark")
    p.add_argument("--threads", type=int, default=None, help="passed to every benchmark")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="parallel lanes of one-thread benchmarks (default: 2 with ≥ 2 cores, else 1)",
    )
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS + OPT_IN]
    if unknown:
        p.error(
            f"unknown benchmark(s) {', '.join(unknown)}; valid: {', '.join(BENCHMARKS + OPT_IN)}"
        )
    extra = (["--smoke"] if args.smoke else []) + (
        ["--results", args.results] if args.results else []
    )
    extra += ["--model-uri", args.model_uri] if args.model_uri else []
    extra += ["--threads", str(args.threads)] if args.threads else []
    root = common.HERE.parent
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(root / "src"), str(root), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    )
    if not args.smoke and not args.model_uri and set(names) - NO_MODELS:
        print(
            "preparing the benchmark models (trained once, cached in benchmarks/.cache/) …",
            flush=True,
        )
        code = (
            "import argparse; from benchmarks import common\n"
            "a = argparse.Namespace(smoke=False, model_uri=None)\n"
            "[print(f, common.get_model(a, f).origin, flush=True) for f in common.FLOWS]"
        )
        subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True)
    jobs = args.jobs or (2 if (os.cpu_count() or 1) >= 2 else 1)
    if jobs > 1 and not args.threads:
        extra += ["--threads", "1"]  # one core per lane
    # the FLOP-rate benchmark wants the machine to itself: it runs alone, after the lanes
    alone = [n for n in names if n in ALONE] if jobs > 1 else []
    laned = [n for n in names if n not in alone]
    lanes = (
        [laned]
        if jobs <= 1
        else [
            lane
            for lane in ([n for n in laned if n == "scaling"], [n for n in laned if n != "scaling"])
            if lane
        ]
    )
    summary, failed = [], []
    lock = threading.Lock()
    t_all = time.perf_counter()

    def run_lane(lane: list[str]) -> None:
        for name in lane:
            t0 = time.perf_counter()
            with lock:
                print(f"=== benchmark {name} started ===", flush=True)
            proc = subprocess.run(
                [sys.executable, "-m", f"benchmarks.bench_{name}", *extra],
                cwd=root,
                env=env,
                stdout=subprocess.PIPE if len(lanes) > 1 else None,
                stderr=subprocess.STDOUT,
                text=True,
            )
            secs = time.perf_counter() - t0
            with lock:
                if proc.stdout:
                    print(f"\n=== benchmark {name} ({secs:.0f} s) ===\n{proc.stdout}", flush=True)
                summary.append({"benchmark": name, "exit code": proc.returncode, "seconds": secs})
                if proc.returncode:
                    failed.append(name)

    threads = [threading.Thread(target=run_lane, args=(lane,)) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if alone:
        lanes.append(alone)
        run_lane(alone)
    summary.sort(key=lambda r: names.index(r["benchmark"]))
    print("\n" + common.table(summary))
    print(
        f"total {time.perf_counter() - t_all:.0f} s wall ({len(lanes)} lane(s))"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
