"""Benchmark — the attribution methods (analysis/attribution.py): integrated gradients against one
gradient × input pass, and peak memory on one long example.

1. **Integrated gradients vs gradient × input.** On the quickstart's additive-bahdanau model
   (G2P sizes: embedding 32, bidirectional GRU 64, decoder 128, attention 64; random init, since
   a step's cost does not depend on the weights) and the first 60 G2P test words (the quickstart's
   ``n_examples``, batches of 32, the reference prefix), one thread: the wall time of
   integrated gradients with 50 steps (``integrated_gradients``, Captum's Gauss–Legendre points,
   batched: B × k rows per pass, one backward per step) against one gradient × input pass
   (``gradient_scores``: one backward per step, saliency and input × gradient together),
   interleaved best of 3. Target: ≤ 60×. Occlusion and leave-one-out are timed beside them for
   information.
2. **Peak memory of one long example.** One copy-task source of L tokens (L = 1000 by default),
   the reference prefix (L + 1 decoder steps), the quickstart's model sizes, in a child process
   whose peak RSS is its ``VmHWM`` (``/proc/self/status``: the high-water mark of the process's
   own memory since its ``exec``; ``ru_maxrss`` would also count the parent's memory at the
   fork, which Linux carries over ``exec``): saliency and input × gradient (one pass), integrated
   gradients and occlusion, in turn. Integrated gradients' memory does not depend on n_steps:
   its automatic pass size is one path point when B · T_y · T_x exceeds ``CELLS_PER_PASS``
   (here 10⁶ cells), so each pass keeps the graph of one trace, as gradient × input does; the
   long run uses ``--long-ig-steps`` points (default 2: 2 passes) to bound its time, and says so.
   Target: ≤ 2 GB.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_attribution [--smoke] [--lengths 1000]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from . import common

QUICKSTART_EXAMPLES = 60
IG_STEPS = 50
RATIO_TARGET = 60.0
PEAK_TARGET_GB = 2.0


def _peak_rss_kb() -> int:
    """The high-water mark of this process's resident memory since its exec (kB)."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:"))


def _child(params: dict) -> dict:
    """One long example in this (child) process: each method's time and the RSS after it."""
    import torch
    from attnstudy.analysis import attribution as attr
    from attnstudy.analysis.batch import prepare_batches

    from attnstudy.config import ModelConfig, validate_data_config
    from attnstudy.data.tasks import load_task
    from attnstudy.data.vocab import Vocab
    from attnstudy.models import build_model

    torch.set_num_threads(params["threads"])
    splits = load_task(validate_data_config(params["data"]))
    src_vocab = Vocab.build(ex.src for ex in splits.train)
    tgt_vocab = Vocab.build(ex.tgt for ex in splits.train)
    torch.manual_seed(1)
    model = build_model(ModelConfig.model_validate(params["model"]), len(src_vocab), len(tgt_vocab))
    model.eval()
    batch = next(prepare_batches(model, splits.test[:1], src_vocab, tgt_vocab, "reference", 1))
    start_kb = _peak_rss_kb()
    out: dict = {"steps": int(batch.trace.step_mask.sum()), "rss_start_kb": start_kb, "runs": []}
    methods = {
        "saliency + input × gradient": lambda: attr.gradient_scores(model, batch),
        f"integrated gradients ({params['ig_steps']} points)": lambda: attr.integrated_gradients(
            model, batch, n_steps=params["ig_steps"]
        ),
        "occlusion": lambda: attr.occlusion(model, batch),
    }
    only = params.get("only")  # a subset of the methods (by name prefix), e.g. ["occlusion"]
    for name, fn in methods.items():
        if only and not any(name.startswith(o) for o in only):
            continue
        t0 = time.perf_counter()
        fn()
        out["runs"].append(
            {
                "method": name,
                "s": time.perf_counter() - t0,
                "peak_rss_kb": _peak_rss_kb(),
            }
        )
        print(json.dumps(out), flush=True)
    return out


def _spawn(params: dict) -> dict:
    with tempfile.TemporaryFile("w+") as out:
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(common.HERE.parent / "src"), str(common.HERE.parent)]),
        )
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_attribution", "--child", json.dumps(params)],
            stdout=out,
            cwd=common.HERE.parent,
            env=env,
        )
        _, status, _ = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"attribution child failed for {params['label']}")
        out.seek(0)
        lines = [ln for ln in out.read().splitlines() if ln.startswith("{")]
    res = json.loads(lines[-1])
    res["peak_rss_kb"] = max(r["peak_rss_kb"] for r in res["runs"])
    return res


def run(args) -> dict:
    from attnstudy.analysis import attribution as attr
    from attnstudy.analysis.ablations.importance import loo_importance

    n = 8 if args.smoke else QUICKSTART_EXAMPLES
    ig_steps = 4 if args.smoke else IG_STEPS
    repeats = args.repeats or (1 if args.smoke else 3)
    bm = common.get_model(args, "bahdanau", trained=False)
    batches = common.prepared(bm, n, prefix="reference", batch_size=32)
    steps = common.real_steps(batches)
    timings = common.interleaved(
        {
            "gradient × input": lambda: [attr.gradient_scores(bm.model, b) for b in batches],
            f"integrated gradients ({ig_steps})": lambda: [
                attr.integrated_gradients(bm.model, b, n_steps=ig_steps) for b in batches
            ],
            "occlusion": lambda: [attr.occlusion(bm.model, b) for b in batches],
            "leave-one-out": lambda: [loo_importance(bm.model, b) for b in batches],
        },
        repeats=repeats,
    )
    base = timings["gradient × input"].best
    rows = [
        {
            "method": k,
            "best s": t.best,
            "median s": t.median,
            "ms / step": 1000 * t.best / steps,
            "× gradient × input": t.best / base,
        }
        for k, t in timings.items()
    ]
    ratio = timings[f"integrated gradients ({ig_steps})"].best / base
    notes = [
        f"integrated gradients ({ig_steps} points) / one gradient × input pass: {ratio:.1f}× "
        f"({common.verdict(ratio, RATIO_TARGET, higher_is_better=False)} ≤ {RATIO_TARGET:.0f}×)",
    ]
    sections = [
        ("Time on the quickstart's G2P words (best of interleaved runs)", common.table(rows))
    ]

    lengths = (
        [int(s) for s in args.lengths.split(",")]
        if args.lengths
        else ([12] if args.smoke else [1000])
    )
    long_rows = []
    for length in lengths:
        from .bench_scaling import copy_of_length

        res = _spawn(
            {
                "label": f"L={length}",
                "data": copy_of_length(length, 1),
                "model": dict(common.QUICKSTART_MODEL, attention="additive", flow="bahdanau"),
                "threads": args.threads,
                "ig_steps": args.long_ig_steps,
            }
        )
        for r in res["runs"]:
            long_rows.append(
                {
                    "L": length,
                    "steps": res["steps"],
                    "method": r["method"],
                    "s": r["s"],
                    "peak RSS MB so far": r["peak_rss_kb"] / 1024,
                }
            )
        peak_gb = res["peak_rss_kb"] / 1024**2
        notes.append(
            f"peak RSS at L = {length}: {peak_gb:.2f} GB "
            f"({common.verdict(peak_gb, PEAK_TARGET_GB, higher_is_better=False)} ≤ "
            f"{PEAK_TARGET_GB:.0f} GB; RSS at start {res['rss_start_kb'] / 1024:.0f} MB)"
        )
    sections.append(
        ("One long example, each method in turn (child process)", common.table(long_rows))
    )
    notes.append(common.load_note(args))
    common.report(
        "Attribution methods: integrated gradients vs gradient × input, one long example",
        args,
        {
            "examples": n,
            "decoder steps": steps,
            "model": f"additive-bahdanau, quickstart sizes ({bm.origin})",
            "prefix": "reference",
            "IG points": ig_steps,
            "IG points on the long example": args.long_ig_steps,
            "threads": args.threads,
            "repeats": repeats,
        },
        sections,
        notes,
    )
    return {"ratio": ratio, "long": long_rows}


def main(argv=None) -> dict | None:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--child"]:
        print(json.dumps(_child(json.loads(argv[1]))), flush=True)
        return None
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--lengths", default=None, help="source lengths of the long example (1000)")
    p.add_argument("--long-ig-steps", type=int, default=2, help="IG points on the long example")
    args = p.parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
