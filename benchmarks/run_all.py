"""Run every benchmark of issue #5 (``make bench``), each in its own process, one after another.

Full mode (the default) is sized for < 30 minutes on a 2-core machine; it first trains (or finds
in ``benchmarks/.cache/``) the two small quickstart G2P models the benchmarks share. Every
script appends its tables to ``benchmarks/RESULTS.md``. ``--smoke`` runs the tiny sizes.

Run: ``PYTHONPATH=src:. python -m benchmarks.run_all [--smoke] [--only permutation,loo]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from . import common

BENCHMARKS = ["permutation", "adversarial", "loo", "flops", "scaling", "training", "tracking"]
"""Script names (``benchmarks/bench_<name>.py``), in issue order."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    p.add_argument("--only", default=None, help=f"comma-separated subset of {','.join(BENCHMARKS)}")
    p.add_argument("--results", default=None, help="results file (default: benchmarks/RESULTS.md in full mode)")
    p.add_argument("--model-uri", default=None, help="passed to every benchmark")
    p.add_argument("--threads", type=int, default=None, help="passed to every benchmark")
    args = p.parse_args(argv)
    names = args.only.split(",") if args.only else BENCHMARKS
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; valid: {', '.join(BENCHMARKS)}")
    extra = (["--smoke"] if args.smoke else []) + (["--results", args.results] if args.results else [])
    extra += (["--model-uri", args.model_uri] if args.model_uri else [])
    extra += (["--threads", str(args.threads)] if args.threads else [])
    root = common.HERE.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(root / "src"), str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if not args.smoke and not args.model_uri:
        print("preparing the benchmark models (trained once, cached in benchmarks/.cache/) …", flush=True)
        code = ("import argparse; from benchmarks import common\n"
                "a = argparse.Namespace(smoke=False, model_uri=None)\n"
                "[print(f, common.get_model(a, f).origin, flush=True) for f in common.FLOWS]")
        subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True)
    summary, failed = [], []
    t_all = time.perf_counter()
    for name in names:
        t0 = time.perf_counter()
        print(f"\n=== benchmark {name} ===", flush=True)
        rc = subprocess.run([sys.executable, "-m", f"benchmarks.bench_{name}", *extra], cwd=root, env=env).returncode
        secs = time.perf_counter() - t0
        summary.append({"benchmark": name, "exit code": rc, "seconds": secs})
        if rc:
            failed.append(name)
    print("\n" + common.table(summary))
    print(f"total {time.perf_counter() - t_all:.0f} s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
