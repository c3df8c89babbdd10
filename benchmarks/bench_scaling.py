"""Benchmark 5 — scaling of the ablation suite.

Suite cost (:func:`attnstudy.analysis.suite.run_suite`, everything from preparing the traces to the
bootstrap summary) against

* the number of examples (G2P test words, 1k, 2k, 5k, 10k; trained quickstart model, greedy
  prefix) — cost must grow linearly (log-log slope ≈ 1) and peak memory must stay flat
  (10k / 1k peak RSS ≤ 1.3, peak ≤ 2 GB) because the suite streams its batches;
* the source length (copy task, 5 … 80 tokens, fixed number of examples, reference prefix,
  randomly initialised model of the quickstart sizes: the cost of a step does not depend on
  the weights, and the reference fixes the number of steps).

Ablations: permutation, global permutation and uniform (counterfactuals), erase-max and
erase-until-flip (erasure), importance (gradient and leave-one-out). The adversarial search is
timed separately, at 1k examples only. Every size runs in its own child process (so sizes do not
contaminate each other's memory); its peak RSS is the child's ``ru_maxrss`` from ``os.wait4``.
Per-ablation times come from a timing wrapper around each ablation function in the child.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_scaling [--smoke] [--sizes 1000,2000]``.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common

SUITE = [
    "permutation",
    "permutation_global",
    "uniform",
    "erase_max",
    "erase_until_flip",
    "importance",
]
RSS_RATIO_TARGET = 1.3
RSS_PEAK_TARGET_GB = 2.0


# ----------------------------------------------------------------------------- child


def _child(params: dict) -> dict:
    import resource

    import pyarrow.parquet as pq
    import torch
    from attnstudy.analysis import suite as suite_mod
    from attnstudy.analysis.catalogue import AblationConfig, get_ablation

    from attnstudy.config import ModelConfig, validate_data_config
    from attnstudy.data.tasks import load_task
    from attnstudy.data.vocab import Vocab
    from attnstudy.models import build_model
    from attnstudy.models.io import load_model_dir

    if params.get("threads"):
        torch.set_num_threads(params["threads"])
    data = validate_data_config(params["data"])
    splits = load_task(data)
    if params.get("model_dir"):
        loaded = load_model_dir(params["model_dir"])
        model, src_vocab, tgt_vocab = loaded.model, loaded.src_vocab, loaded.tgt_vocab
    else:
        src_vocab = Vocab.build(ex.src for ex in splits.train)
        tgt_vocab = Vocab.build(ex.tgt for ex in splits.train)
        torch.manual_seed(1)
        model = build_model(
            ModelConfig.model_validate(params["model"]), len(src_vocab), len(tgt_vocab)
        ).eval()
    examples = splits.test[: params["n"]]
    cfg = AblationConfig.model_validate(params["cfg"] | {"n_examples": len(examples)})

    times: dict[str, float] = {}
    sampler = RssSampler()
    for name in cfg.ablations:  # timing wrappers (results unchanged)
        module, _, attr = get_ablation(name).run.partition(":")
        mod = importlib.import_module(module)
        fn = getattr(mod, attr)

        def wrapped(*a, _fn=fn, _name=name, **kw):
            t0 = time.perf_counter()
            sampler.current = _name
            try:
                return _fn(*a, **kw)
            finally:
                sampler.current = None
                times[_name] = times.get(_name, 0.0) + time.perf_counter() - t0

        setattr(mod, attr, wrapped)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # streamed, as `attnstudy ablate` does
        suite_mod.run_suite(
            model,
            examples,
            src_vocab,
            tgt_vocab,
            cfg,
            progress=False,
            table_path=Path(tmp) / "steps.parquet",
        )
        wall = time.perf_counter() - t0
        n_steps = pq.ParquetFile(Path(tmp) / "steps.parquet").metadata.num_rows
    sampler.stop()
    return {
        "n": len(examples),
        "steps": int(n_steps),
        "wall": wall,
        "ablations": times,
        "ablation_peak_rss_kb": sampler.peaks,
        "rss_before_kb": rss_before,
        "mean_src_len": float(np.mean([len(e.src) for e in examples])),
    }


class RssSampler:
    """The highest resident set size (kB, from ``/proc/self/statm``) seen while each ablation
    ran, sampled every 5 ms on a daemon thread: which ablation makes the process's peak."""

    def __init__(self, interval: float = 0.005):
        import threading

        self.current: str | None = None
        self.peaks: dict[str, int] = {}
        self._page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
        self._done = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss_kb(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self._page_kb

    def _run(self) -> None:
        while not self._done.wait(self._interval):
            name = self.current
            if name is not None:
                self.peaks[name] = max(self.peaks.get(name, 0), self.rss_kb())

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def copy_of_length(length: int, n_test: int) -> dict:
    """The data section of a copy task whose sources all have ``length`` tokens (the cost of a
    step does not depend on the weights, so a few training examples suffice for the vocabulary)."""
    return {
        "task": "copy",
        "vocab_size": 20,
        "min_len": length,
        "max_len": length,
        "n_train": 20,
        "n_dev": 2,
        "n_test": n_test,
    }


def spawn(params: dict, module: str = "benchmarks.bench_scaling") -> dict:
    """Run one size in a child process (``python -m <module> --child <params as JSON>``, whose
    last stdout line starting with ``{`` is its JSON result); adds its peak RSS (kB) from
    ``os.wait4``.

    Raises:
        RuntimeError: if the child exits with a non-zero status.
    """
    with tempfile.TemporaryFile("w+") as out:
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(
                [
                    str(common.HERE.parent / "src"),
                    str(common.HERE.parent),
                    os.environ.get("PYTHONPATH", ""),
                ]
            ),
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", module, "--child", json.dumps(params)],
            stdout=out,
            cwd=common.HERE.parent,
            env=env,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{module} child failed (exit {proc.returncode}) for {params['label']}"
            )
        out.seek(0)
        lines = [ln for ln in out.read().splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1])
    res["peak_rss_kb"] = usage.ru_maxrss
    return res


# ----------------------------------------------------------------------------- parent


def slope(x, y) -> float:
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = (x > 0) & (y > 0)
    if ok.sum() < 2:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def run(args) -> dict:
    sizes = (
        [int(s) for s in args.sizes.split(",")]
        if args.sizes
        else ([6, 12] if args.smoke else [1000, 2000, 5000, 10000])
    )
    lengths = (
        [int(s) for s in args.lengths.split(",")]
        if args.lengths
        else ([5, 10] if args.smoke else [5, 10, 20, 40, 80])
    )
    n_len = args.length_examples or (3 if args.smoke else 50)
    adv_n = 3 if args.smoke else 1000
    p_count = args.permutations or (3 if args.smoke else 20)
    adv_steps = args.adv_steps or (3 if args.smoke else 100)
    base_cfg = {
        "ablations": SUITE,
        "n_permutations": p_count,
        "seed": 0,
        "bootstrap_resamples": 50 if args.smoke else 1000,
        "adversarial": {"steps": adv_steps},
    }
    threads = args.threads
    notes, sections = [], []

    with tempfile.TemporaryDirectory() as tmp:
        # examples axis: G2P (copy in smoke mode: a child would re-read CMUdict for seconds)
        if args.smoke:
            data_ex = {
                "task": "copy",
                "vocab_size": 20,
                "min_len": 3,
                "max_len": 8,
                "n_train": 50,
                "n_dev": 5,
                "n_test": max(sizes + [adv_n]),
            }
            model_dir, origin, prefix = None, "random init (copy task)", "reference"
        else:
            bm = common.get_model(args, "bahdanau")
            from attnstudy.models.io import save_model_dir

            model_dir = str(Path(tmp) / "model")
            save_model_dir(model_dir, bm.model, bm.spec, bm.src_vocab, bm.tgt_vocab)
            data_ex = bm.spec.data.model_copy(update={"n_test": None}).model_dump(mode="json")
            origin, prefix = bm.origin, "greedy"
        notes.append(f"examples axis model: {origin}")
        model_cfg = dict(common.QUICKSTART_MODEL, attention="additive", flow="bahdanau")
        ex_rows = []
        for n in sizes:
            r = spawn(
                {
                    "label": f"n={n}",
                    "n": n,
                    "data": data_ex,
                    "model_dir": model_dir,
                    "model": model_cfg,
                    "cfg": base_cfg | {"prefix": prefix},
                    "threads": threads,
                }
            )
            ex_rows.append(r)
        adv = spawn(
            {
                "label": "adversarial",
                "n": adv_n,
                "data": data_ex,
                "model_dir": model_dir,
                "model": model_cfg,
                "cfg": base_cfg | {"prefix": prefix, "ablations": ["adversarial"]},
                "threads": threads,
            }
        )
        # length axis: copy task of fixed length L
        len_rows = []
        for length in lengths:
            data_len = copy_of_length(length, n_len)
            r = spawn(
                {
                    "label": f"L={length}",
                    "n": n_len,
                    "data": data_len,
                    "model_dir": None,
                    "model": model_cfg,
                    "cfg": base_cfg | {"prefix": "reference"},
                    "threads": threads,
                }
            )
            r["length"] = length
            len_rows.append(r)

    def table_rows(rows, key):
        out = []
        for r in rows:
            row = {
                key: r[key] if key != "examples" else r["n"],
                "steps": r["steps"],
                "suite s": r["wall"],
                "ms / step": 1000 * r["wall"] / max(r["steps"], 1),
            }
            row |= {f"{a} s": r["ablations"].get(a, 0.0) for a in SUITE}
            row["peak RSS MB"] = r["peak_rss_kb"] / 1024
            row["RSS at start MB"] = r["rss_before_kb"] / 1024
            out.append(row)
        return out

    def slopes(rows, xs):
        s = {"suite": slope(xs, [r["wall"] for r in rows])}
        s |= {a: slope(xs, [r["ablations"].get(a, 0.0) for r in rows]) for a in SUITE}
        return s

    ex_slopes = slopes(ex_rows, [r["n"] for r in ex_rows])
    len_slopes = slopes(len_rows, [r["length"] for r in len_rows])
    sections.append(
        ("Cost against number of examples", common.table(table_rows(ex_rows, "examples")))
    )
    sections.append(
        ("Cost against source length (copy task)", common.table(table_rows(len_rows, "length")))
    )
    sections.append(
        (
            "Log-log slopes",
            common.table(
                [
                    {"axis": "examples", **{k: v for k, v in ex_slopes.items()}},
                    {"axis": "source length", **{k: v for k, v in len_slopes.items()}},
                ]
            ),
        )
    )
    sections.append(
        (
            "Adversarial search (timed at one size)",
            common.table(
                [
                    {
                        "examples": adv["n"],
                        "steps": adv["steps"],
                        "Adam iterations": adv_steps,
                        "search s": adv["ablations"].get("adversarial", 0.0),
                        "suite s (with tracing)": adv["wall"],
                        "ms / step (search)": 1000
                        * adv["ablations"].get("adversarial", 0.0)
                        / max(adv["steps"], 1),
                        "peak RSS MB": adv["peak_rss_kb"] / 1024,
                    }
                ]
            ),
        )
    )
    first, last = ex_rows[0], ex_rows[-1]
    ratio = last["peak_rss_kb"] / first["peak_rss_kb"]
    peak_gb = max(r["peak_rss_kb"] for r in ex_rows + len_rows + [adv]) / 2**20
    notes.append(f"examples slope {ex_slopes['suite']:.2f} (target ≈ 1, linear)")
    notes.append(
        f"peak RSS {last['n']} / {first['n']} examples: {ratio:.2f} (target ≤ {RSS_RATIO_TARGET}, "
        f"{common.verdict(ratio, RSS_RATIO_TARGET, higher_is_better=False)}); largest peak {peak_gb:.2f} GB "
        f"(target ≤ {RSS_PEAK_TARGET_GB} GB, {common.verdict(peak_gb, RSS_PEAK_TARGET_GB, False)})"
    )
    notes.append(
        f"source-length slope {len_slopes['suite']:.2f}: steps grow ∝ L and per-step work (positions, "
        "permuted/erased rows, deletions) ∝ L, so 2 is expected for the erasure and leave-one-out parts"
    )
    notes.append(
        f"adversarial search: {adv_steps} Adam iterations (cost is linear in them; default 500 ≈ "
        f"{500 / adv_steps:.0f}× the time shown)"
    )
    if args.smoke:
        notes.append(
            "smoke mode: copy task, random weights, tiny sizes; slopes say nothing about the targets"
        )
    common.report(
        "Scaling of the ablation suite",
        args,
        {
            "sizes": ",".join(map(str, sizes)),
            "lengths": ",".join(map(str, lengths)),
            "examples per length": n_len,
            "P": p_count,
            "threads": threads,
            "ablations": ", ".join(SUITE),
            "bootstrap resamples": base_cfg["bootstrap_resamples"],
            "prefix (examples axis)": prefix,
        },
        sections,
        notes,
    )
    return {
        "examples": ex_rows,
        "lengths": len_rows,
        "adversarial": adv,
        "slopes": {"examples": ex_slopes, "lengths": len_slopes},
        "rss_ratio": ratio,
        "peak_gb": peak_gb,
    }


def main(argv=None) -> dict | None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--child", default=None, help=argparse_suppress())
    p.add_argument("--sizes", default=None, help="comma-separated numbers of examples")
    p.add_argument("--lengths", default=None, help="comma-separated copy-task source lengths")
    p.add_argument("--length-examples", type=int, default=None, help="examples per source length")
    p.add_argument(
        "--permutations", type=int, default=None, help="P for the permutation ablation (default 20)"
    )
    p.add_argument(
        "--adv-steps", type=int, default=None, help="Adam iterations of the adversarial search"
    )
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))), flush=True)
        return None
    common.setup(args)
    return run(args)


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
