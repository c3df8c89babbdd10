"""Benchmark 2 — adversarial search: batched against a per-step loop.

* **batched** — :func:`attnstudy.analysis.ablations.adversarial.search_adversarial`: every searchable step of a
  batch × its K candidates optimised as one problem (one forward + backward of the output
  layers per Adam iteration).
* **per-step loop** — :func:`attnstudy.analysis.ablations.adversarial.adversarial_loop_reference`: one step (its K
  candidates) at a time, each with its own parameters and Adam optimiser, seeded identically.

Same seed → the same per-row objective values (the batched loss is a sum of independent rows,
Adam is element-wise); the largest difference is reported. Target: loop / batched ≥ 5×.

Early stopping and the fused objective, with the result-quality check (every family, the default
500 Adam iterations): the search with the plain objective (the module docstring's terms through
``divergences.jsd``, as before the fused form), with the fused objective, and with the fused
objective and per-row early stopping (``EarlyStop(tol=STOP_TOL)``); per variant its time, the
found rate and the mean max JSD with their 95 % intervals (the report's estimator,
``suite.step_mean_ci``, resampling examples). Target: ≥ 2× faster than the plain search with the
found rate and max JSD inside the plain search's intervals.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_adversarial [--smoke]``.
"""

from __future__ import annotations

from functools import partial

import pandas as pd
import torch
from attnstudy.analysis.ablations.adversarial import adversarial_loop_reference, search_adversarial
from attnstudy.analysis.batch import AblationContext

from . import common

TARGET = 5.0
STOP_TOL = 1e-4
"""The early-stopping tolerance timed (``adversarial.EarlyStop.tol``)."""
TARGET_FAST = 2.0


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
    rows, origins, checks, ready = [], {}, {}, {}
    for flow in common.FLOWS:
        bm = common.get_model(args, flow)
        origins[flow] = bm.origin
        batches = common.prepared(bm, n_words, prefix, batch_size=32)
        ready[flow] = (bm, batches)
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
    quality = _early_stopping(args, cfg, n_words, prefix, ready)
    notes += quality["notes"]
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
        [
            ("", common.table(rows)),
            (
                f"Fused objective and early stopping (stop_tol = {STOP_TOL:g}), "
                f"{quality['iters']} Adam iterations: time and result quality",
                common.table(quality["rows"]),
            ),
        ],
        notes,
    )
    return {"rows": rows, "checks": checks, "quality": quality["rows"]}


def _early_stopping(args, cfg, n_words: int, prefix: str, ready: dict | None = None) -> dict:
    """Plain objective, fused objective, fused + early stopping, per family (module docstring);
    ``ready``: flow → (model, batches) already built (the smoke run checks those families only)."""
    from attnstudy.analysis.ablations.adversarial import (
        EarlyStop,
        _optimise,
        _requires_grad_off,
        _restore_requires_grad,
        _searched_rows,
        adversarial_table,
    )
    from attnstudy.analysis.suite import step_mean_ci

    from attnstudy.models import eval_mode

    iters = 6 if args.smoke else 500
    every = 2 if args.smoke else 20
    ctx = AblationContext.of(cfg)

    def search(model, batch, plain: bool, stop_tol: float):
        params = cfg.params_for("adversarial").model_copy(update={"steps": iters})
        stop = EarlyStop(tol=stop_tol, every=every) if stop_tol > 0 else None
        b_idx, t_idx = _searched_rows(batch)
        flags = _requires_grad_off(model)
        try:
            with eval_mode(model):
                part = _optimise(
                    model, batch, b_idx, t_idx, params, ctx, plain=plain, early_stop=stop
                )
        finally:
            _restore_requires_grad(model, flags)
        return adversarial_table(batch, part)

    rows, notes = [], []
    ready = ready or {}
    for flow in list(ready) if args.smoke and ready else common.kernels(args):
        if flow in ready:
            bm, batches = ready[flow]
        else:
            bm = common.get_model(args, flow)
            batches = common.prepared(bm, n_words, prefix, batch_size=32)
        variants = {
            "plain objective": (True, 0.0),
            "fused objective": (False, 0.0),
            "fused + early stopping": (False, STOP_TOL),
        }
        res = common.interleaved(
            {
                name: partial(
                    lambda plain, tol, m=bm.model, bs=batches: pd.concat(
                        [search(m, b, plain, tol) for b in bs], ignore_index=True
                    ),
                    plain,
                    tol,
                )
                for name, (plain, tol) in variants.items()
            },
            1,
        )
        base = res["plain objective"]
        est = {}
        for name, timing in res.items():
            table = timing.result[~timing.result["adversarial_skipped"]].copy()
            table["found"] = table["adversarial_found"].astype(float)
            found = step_mean_ci(table, "found", cfg)
            jsd = step_mean_ci(
                table.dropna(subset=["adversarial_max_jsd"]), "adversarial_max_jsd", cfg
            )
            est[name] = (found, jsd)
            rows.append(
                {
                    "flow": flow,
                    "search": name,
                    "s": timing.best,
                    "speed-up": base.best / timing.best,
                    "found rate": f"{found[0]:.3f} [{found[1]:.3f}, {found[2]:.3f}]",
                    "max JSD": f"{jsd[0]:.4f} [{jsd[1]:.4f}, {jsd[2]:.4f}]",
                }
            )
        (f0, j0), (f1, j1) = est["plain objective"], est["fused + early stopping"]
        inside = f0[1] <= f1[0] <= f0[2] and j0[1] <= j1[0] <= j0[2]
        speed = base.best / res["fused + early stopping"].best
        notes.append(
            f"{flow}: fused + early stopping {speed:.2f}× the plain search (target ≥ "
            f"{TARGET_FAST:g}×, {common.verdict(speed, TARGET_FAST)}); found rate and max JSD "
            f"{'inside' if inside else 'OUTSIDE'} the plain search's 95 % intervals"
        )
    return {"rows": rows, "notes": notes, "iters": iters}


def main(argv=None) -> dict:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
