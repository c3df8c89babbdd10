"""Benchmark 2 — adversarial search: batched against a per-step loop.

* **batched** — :func:`attnstudy.analysis.ablations.adversarial.search_adversarial`: every searchable step of a
  batch × its K candidates optimised as one problem (one forward + backward of the output
  layers per Adam iteration).
* **per-step loop** — :func:`attnstudy.analysis.ablations.adversarial.adversarial_loop_reference`: one step (its K
  candidates) at a time, each with its own parameters and Adam optimiser, seeded identically.

Same seed → the same per-row objective values (the batched loss is a sum of independent rows,
Adam is element-wise); the largest difference is reported. Target: loop / batched ≥ 5×.

The fast path and early stopping, with the result-quality check (every family, the default 500
Adam iterations): the search with the plain objective (the module docstring's terms through
``divergences.jsd`` under autograd, ``torch.optim.Adam``: the loop reference), the default fast
path (fused loss, written-out gradient and AMSGrad), and the fast path with per-row early
stopping (``EarlyStop(tol=STOP_TOL)``); per variant its time, the found rate and the mean max JSD
with their 95 % intervals (the report's estimator, ``suite.step_mean_ci``, resampling examples).
Target: ≥ 2× faster than the plain search with the found rate and max JSD inside the plain
search's intervals.

``--before COMMIT``: the same section also times, interleaved in the same process, the plain and
the default search of ``analysis/ablations/adversarial.py`` as it was at an earlier commit (read
with ``git show``, loaded beside the current module; it must have ``_optimise(…, plain,
early_stop)``, from commit 64ad73d on), on the same models and batches — with the Transformer's
row form switched off where that commit's ``transformer.py`` had none — and the speed-ups are
then taken against that commit's plain search. The models are today's code in both (only the
search module is the earlier one).

Every search of that section is timed twice: wall time and the process's CPU time
(``time.process_time``); on a loaded machine the CPU time is the steadier figure (the wall time
then counts the waits for a core). ``--iters`` and ``--words`` set the section's Adam iterations
(default 500) and test words (default 16): the cost of a search is linear in the iterations, so
a shorter run gives the time ratio (not the result quality at 500).

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_adversarial [--smoke] [--before COMMIT]
[--iters N] [--words N]``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

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


ROOT = Path(__file__).resolve().parents[1]


def _before(commit: str):
    """(module, row form) of an earlier commit: its ``analysis/ablations/adversarial.py`` loaded
    as ``attnstudy.analysis.ablations._adversarial_before`` (its relative imports resolve to the
    current package), and whether its Transformer had ``rows_given_attention``.

    Raises:
        SystemExit: the commit or the file is not in this repository.
    """

    def show(path: str) -> str:
        out = subprocess.run(
            ["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, text=True
        )
        if out.returncode:
            raise SystemExit(f"--before {commit}: git show {path} failed ({out.stderr.strip()})")
        return out.stdout

    source = show("analysis/ablations/adversarial.py")
    row_form = "def rows_given_attention" in show("src/attnstudy/models/transformer.py")
    name = "attnstudy.analysis.ablations._adversarial_before"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(name, f.name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    Path(f.name).unlink()
    return module, row_form


def run(args) -> dict:
    n_words = 2 if args.smoke else 16
    iters = 4 if args.smoke else 100
    repeats = args.repeats or (2 if args.smoke else 3)
    prefix = "reference" if args.smoke else "greedy"
    # Jain & Wallace's solver: the fast path, its loop reference and early stopping are its own
    cfg = common.ablation_cfg(seed=0, adversarial={"solver": "jw"})
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
    words = getattr(args, "words", None) or n_words
    quality = _early_stopping(args, cfg, words, prefix, ready if words == n_words else None)
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
            "timing": f"best of {repeats} interleaved (loop: 1 run); fast path and early "
            f"stopping: best of {args.repeats or 1} interleaved",
        },
        [
            ("", common.table(rows)),
            (
                f"Fast path and early stopping (stop_tol = {STOP_TOL:g}), "
                f"{quality['iters']} Adam iterations: time and result quality",
                common.table(quality["rows"]),
            ),
        ],
        notes,
    )
    return {"rows": rows, "checks": checks, "quality": quality["rows"]}


def _early_stopping(args, cfg, n_words: int, prefix: str, ready: dict | None = None) -> dict:
    """Plain objective, fast path, fast path + early stopping, per family (module docstring),
    and with ``--before`` that commit's plain and default search; ``ready``: flow → (model,
    batches) already built (the smoke run checks those families only)."""
    from attnstudy.analysis.ablations import adversarial
    from attnstudy.analysis.suite import step_mean_ci

    from attnstudy.models import eval_mode

    iters = 6 if args.smoke else (getattr(args, "iters", None) or 500)
    every = 2 if args.smoke else 20
    ctx = AblationContext.of(cfg)
    before, row_form = _before(args.before) if getattr(args, "before", None) else (None, True)

    def search(module, model, batch, plain: bool, stop_tol: float):
        params = cfg.params_for("adversarial").model_copy(update={"steps": iters})
        stop = module.EarlyStop(tol=stop_tol, every=every) if stop_tol > 0 else None
        b_idx, t_idx = module._searched_rows(batch)
        flags = module._requires_grad_off(model)
        try:
            with eval_mode(model):
                part = module._optimise(
                    model, batch, b_idx, t_idx, params, ctx, plain=plain, early_stop=stop
                )
        finally:
            module._restore_requires_grad(model, flags)
        return module.adversarial_table(batch, part)  # each commit's table of its own result

    cpu: dict[str, list[float]] = {}  # variant → CPU seconds of each repeat

    def timed(name, module, model, batches, plain, tol, scatter=False):
        if scatter:  # the earlier commit's Transformer had no row form: its scatter form
            model.rows_given_attention = lambda *a: None
        start = time.process_time()
        try:
            return pd.concat(
                [search(module, model, b, plain, tol) for b in batches], ignore_index=True
            )
        finally:
            cpu.setdefault(name, []).append(time.process_time() - start)
            model.__dict__.pop("rows_given_attention", None)

    variants = {}
    if before is not None:
        variants[f"{args.before}: plain objective"] = (before, True, 0.0)
        variants[f"{args.before}: default search"] = (before, False, 0.0)
    variants |= {
        "plain objective": (adversarial, True, 0.0),
        "fast path": (adversarial, False, 0.0),
        "fast path + early stopping": (adversarial, False, STOP_TOL),
    }
    base_name = next(iter(variants))
    rows, notes = [], []
    ready = ready or {}
    for flow in list(ready) if args.smoke and ready else common.kernels(args):
        if flow in ready:
            bm, batches = ready[flow]
        else:
            bm = common.get_model(args, flow)
            batches = common.prepared(bm, n_words, prefix, batch_size=32)
        scatter = flow == "transformer" and not row_form
        cpu.clear()
        res = common.interleaved(
            {
                name: partial(
                    timed, name, module, bm.model, batches, plain, tol, module is before and scatter
                )
                for name, (module, plain, tol) in variants.items()
            },
            args.repeats or 1,
        )
        base = res[base_name]
        cpu_best = {name: min(times) for name, times in cpu.items()}
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
                    "CPU s": cpu_best[name],
                    "CPU speed-up": cpu_best[base_name] / cpu_best[name],
                    "found rate": f"{found[0]:.3f} [{found[1]:.3f}, {found[2]:.3f}]",
                    "max JSD": f"{jsd[0]:.4f} [{jsd[1]:.4f}, {jsd[2]:.4f}]",
                }
            )
        for name in ("fast path", "fast path + early stopping"):
            (f0, j0), (f1, j1) = est[base_name], est[name]
            inside = f0[1] <= f1[0] <= f0[2] and j0[1] <= j1[0] <= j0[2]
            speed = base.best / res[name].best
            speed_cpu = cpu_best[base_name] / cpu_best[name]
            notes.append(
                f"{flow}: {name} {speed:.2f}× (CPU time {speed_cpu:.2f}×) the {base_name} search "
                f"(target ≥ {TARGET_FAST:g}×, {common.verdict(speed, TARGET_FAST)} by wall time, "
                f"{common.verdict(speed_cpu, TARGET_FAST)} by CPU time); found rate and max "
                f"JSD {'inside' if inside else 'OUTSIDE'} its 95 % intervals"
            )
    return {"rows": rows, "notes": notes, "iters": iters}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument(
        "--before",
        default=None,
        metavar="COMMIT",
        help="also time that commit's plain and default search, interleaved (module docstring)",
    )
    p.add_argument(
        "--iters",
        type=int,
        default=None,
        metavar="N",
        help="Adam iterations of the fast-path section (default 500; the time ratio holds at "
        "fewer, the result quality is that of N iterations)",
    )
    p.add_argument(
        "--words",
        type=int,
        default=None,
        metavar="N",
        help="test words of the fast-path section (default 16)",
    )
    args = p.parse_args(argv)
    for name in ("iters", "words"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
