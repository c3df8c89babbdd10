"""Benchmark 2 — adversarial search: batched against a per-step loop.

* **batched** — :func:`attnstudy.analysis.ablations.adversarial.search_adversarial`: every searchable step of a
  batch × its K candidates optimised as one problem (one forward + backward of the output
  layers per Adam iteration).
* **per-step loop** — :func:`attnstudy.analysis.ablations.adversarial.adversarial_loop_reference`: one step (its K
  candidates) at a time, each with its own parameters and Adam optimiser, seeded identically.

Same seed → the same per-row objective values (the batched loss is a sum of independent rows,
Adam is element-wise); the largest difference is reported. Target: loop / batched ≥ 5×.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_adversarial [--smoke]``.
"""

from __future__ import annotations

from functools import partial

import torch
from attnstudy.analysis.ablations.adversarial import adversarial_loop_reference, search_adversarial
from attnstudy.analysis.batch import AblationContext

from . import common

TARGET = 5.0


def _each(fn, model, batches, cfg, iters):
    params, ctx = cfg.params_for("adversarial"), AblationContext.of(cfg)
    return [fn(model, b, params, ctx, steps=iters) for b in batches]


def _cat(results, name):
    return torch.cat([getattr(r, name) for r in results])


def run(args) -> dict:
    n_words = 2 if args.smoke else 16
    iters = 4 if args.smoke else 100
    repeats = args.repeats or (2 if args.smoke else 3)
    prefix = "reference" if args.smoke else "greedy"
    cfg = common.ablation_cfg(seed=0)
    rows, origins, checks = [], {}, {}
    for flow in common.FLOWS:
        bm = common.get_model(args, flow)
        origins[flow] = bm.origin
        batches = common.prepared(bm, n_words, prefix, batch_size=32)
        res = common.interleaved(
            {
                "batched": partial(_each, search_adversarial, bm.model, batches, cfg, iters),
                "loop": partial(_each, adversarial_loop_reference, bm.model, batches, cfg, iters),
            },
            repeats,
            once=("loop",),
        )
        fast, slow = res["batched"].result, res["loop"].result
        obj_f, obj_s = _cat(fast, "objective"), _cat(slow, "objective")
        diff = float((obj_f - obj_s).abs().max()) if obj_f.numel() else 0.0
        rel = (
            float(((obj_f - obj_s).abs() / obj_s.abs().clamp(min=1e-12)).max())
            if obj_f.numel()
            else 0.0
        )
        jsd_diff = (
            float((_cat(fast, "jsd") - _cat(slow, "jsd")).abs().max()) if obj_f.numel() else 0.0
        )
        checks[flow] = {"objective_abs": diff, "objective_rel": rel, "jsd_abs": jsd_diff}
        n_rows = int(obj_f.numel())
        rows.append(
            {
                "flow": f"{flow} ({common.FLOWS[flow]})",
                "words": n_words,
                "searched steps": n_rows,
                "K": cfg.params_for("adversarial").k,
                "Adam iterations": iters,
                "batched s": res["batched"].best,
                "loop s": res["loop"].best,
                "loop / batched": res["loop"].best / res["batched"].best,
                "max abs diff objective": diff,
                "max rel diff objective": rel,
                "max abs diff JSD": jsd_diff,
            }
        )
    notes = [f"model {flow}: {o}" for flow, o in origins.items()]
    for r in rows:
        notes.append(
            f"{r['flow']}: loop/batched {r['loop / batched']:.1f}× (target ≥ {TARGET:.0f}×, "
            f"{common.verdict(r['loop / batched'], TARGET)}); objective max abs diff "
            f"{r['max abs diff objective']:.1e}"
        )
    notes.append(
        "the cost of both is linear in the Adam iterations (each is one forward + backward), "
        f"so the ratio at {iters} iterations holds at the default 500"
    )
    if args.smoke:
        notes.append(
            "smoke mode: random weights and tiny sizes; the ratios say nothing about the target"
        )
    common.report(
        "Adversarial search: batched vs per-step loop",
        args,
        {
            "words": n_words,
            "K": cfg.params_for("adversarial").k,
            "Adam iterations": iters,
            "prefix": prefix,
            "seed": cfg.seed,
            "timing": f"best of {repeats} interleaved (loop: 1 run)",
        },
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows, "checks": checks}


def main(argv=None) -> dict:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
