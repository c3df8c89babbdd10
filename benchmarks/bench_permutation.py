"""Benchmark 1 — local permutation: the fast path against two loops.

Three ways to compute the same per-step numbers (median TVD over P permutations, flip rate,
identity count), from the same prepared batches (greedy prefix, traced once, outside the timing)
and the same permutations (generator per (seed, example, step, "permutation")):

* **fast** — :func:`attnstudy.analysis.ablations.permutation.run`: steps × (P + 1) replacements
  (the P permutations and the unchanged row) as independent rows of one call of the model's row
  form (``attnstudy.analysis._chunks.rows_given_attention``) per example chunk.
* **per-step loop** — the per-step protocol of Moradi et al. (2019): for every decoder step t
  and every permutation p, one ``logits_given_attention`` call over the batch restricted to
  step t (``steps=`` mask), from the same traced prefix state, in its plain (unfolded) form
  (``plain=True``: the Luong and Transformer fast forms' per-call set-up would otherwise be
  timed once per step and permutation).
* **naive** — what a direct transplant of the classification code does: for every step t and
  every permutation p, ``model.decode(src, prefix=tgt_in[:, :t+1], intervene=fn)`` re-runs the
  encoder and the decoder from the start, ``fn`` replacing only step t's row, and step t's
  logits are read.

Models: both recurrent flows and the Transformer (its last layer's cross-attention, all heads).

All three must agree to ≤ 1e-6. Targets: naive / fast ≥ 30×, per-step / fast ≥ 4×. The naive
reference costs minutes per flow at 500 words, so (to keep ``make bench`` under 30 minutes) it
runs on the first three batches (96 words) and is compared with the fast path timed on the same
batches; both are linear in the number of words, so the ratio is that of the 500 words.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_permutation [--smoke]``.
"""

from __future__ import annotations

import inspect
import warnings
from functools import partial

import numpy as np
import pandas as pd
import torch
from attnstudy.analysis._chunks import base_probs, n_valid, step_frame
from attnstudy.analysis.ablations.permutation import run as run_permutation
from attnstudy.analysis.batch import AblationContext, PreparedBatch, step_streams
from attnstudy.analysis.divergences import tvd
from attnstudy.analysis.interventions import Permuted, permute

from attnstudy.models import eval_mode

from . import common

TARGET_NAIVE = 30.0
TARGET_PER_STEP = 4.0
NAIVE_BATCHES = 3  # batches of 32 words timed for the naive reference (see the module docstring)
COLUMNS = ["permutation_median_tvd", "permutation_flip_rate", "permutation_n_identity"]


def _steps(batch: PreparedBatch) -> torch.Tensor:
    tr = batch.trace
    return tr.step_mask & (n_valid(tr) >= 2)[:, None]


def _permutations(batch: PreparedBatch, cfg) -> Permuted:
    """The permutations run_permutation draws (the same streams, ``ablation.rng``'s scheme), for
    the whole batch."""
    ids = batch.example_ids
    tr = batch.trace
    return permute(
        tr.attention,
        ~tr.pad_mask,
        cfg.params_for("permutation").n,
        step_streams(AblationContext.of(cfg), ids, "permutation"),
        _steps(batch),
    )


def _reduce(
    batch: PreparedBatch, probs: torch.Tensor, base: torch.Tensor, perm: Permuted
) -> pd.DataFrame:
    """The per-step summaries of run_permutation from (B, P, T_y, V) probabilities."""
    steps = _steps(batch)
    frame, b_idx, t_idx = step_frame(batch)
    keep = ~perm.identity
    d = tvd(probs, base.unsqueeze(1)).double().masked_fill(~keep, float("nan"))
    flips = (probs.argmax(-1) != base.argmax(-1).unsqueeze(1)).double()
    n_keep = keep.sum(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = torch.from_numpy(np.nanmedian(d.numpy(), axis=1))
    flip = ((flips * keep).sum(1) / n_keep.clamp(min=1)).masked_fill(n_keep == 0, float("nan"))
    nan = torch.full_like(med, float("nan"))
    frame["permutation_median_tvd"] = torch.where(steps, med, nan)[b_idx, t_idx].numpy()
    frame["permutation_flip_rate"] = torch.where(steps, flip, nan)[b_idx, t_idx].numpy()
    frame["permutation_n_identity"] = torch.where(steps, (~keep).sum(1), 0)[b_idx, t_idx].numpy()
    return frame


def _plain(model) -> dict:
    """``plain=True`` where the family has a folded fast form (its unfolded reference)."""
    return (
        {"plain": True}
        if "plain" in inspect.signature(model.logits_given_attention).parameters
        else {}
    )


def per_step_loop(model, batch: PreparedBatch, cfg) -> pd.DataFrame:
    """One ``logits_given_attention`` call per (step, permutation) over the batch, in the plain
    (unfolded) form: what batching over examples alone gives, the fast path's first reference."""
    tr = batch.trace
    steps = _steps(batch)
    plain = _plain(model)  # looked up once, outside the timed loop
    with eval_mode(model), torch.no_grad():
        perm = _permutations(batch, cfg)
        base = base_probs(model, tr, cfg.chunk_rows)
        b, p_count, _, t_y, _ = perm.weights.shape
        probs = base.new_zeros(b, p_count, t_y, base.size(-1))
        for t in range(t_y):
            if not bool(steps[:, t].any()):
                continue
            only_t = torch.zeros_like(steps)
            only_t[:, t] = steps[:, t]
            for p in range(p_count):
                logits = model.logits_given_attention(
                    tr, perm.weights[:, p], cfg.chunk_rows, only_t, **plain
                )
                probs[:, p, t] = torch.softmax(logits[:, t], -1)
    return _reduce(batch, probs, base, perm)


def naive_loop(model, batch: PreparedBatch, cfg) -> pd.DataFrame:
    """One teacher-forced decode from the start per (step, permutation), intervening at step t."""
    tr = batch.trace
    steps = _steps(batch)
    with eval_mode(model), torch.no_grad():
        perm = _permutations(batch, cfg)
        t_y = tr.tgt_in.size(1)
        base = torch.softmax(model.decode(tr.src, tr.src_lengths, t_y, prefix=tr.tgt_in).logits, -1)
        b, p_count = perm.weights.shape[:2]
        probs = base.new_zeros(b, p_count, t_y, base.size(-1))
        for t in range(t_y):
            if not bool(steps[:, t].any()):
                continue
            for p in range(p_count):
                row = perm.weights[:, p, :, t]  # (B, H, T_x); the original row where not permuted

                def fn(w: torch.Tensor, s: int, row=row, t=t) -> torch.Tensor:
                    return row if s == t else w

                out = model.decode(
                    tr.src,
                    tr.src_lengths,
                    t + 1,
                    prefix=tr.tgt_in[:, : t + 1],
                    intervene=fn,
                    **_unit(tr),
                )
                probs[:, p, t] = torch.softmax(out.logits[:, t], -1)
    return _reduce(batch, probs, base, perm)


def _unit(trace) -> dict:
    """``decode``'s layer selector for a multi-layer model (the analysed layer)."""
    return {"layer": trace.layer} if trace.n_layers > 1 else {}


def fast_path(model, batch: PreparedBatch, cfg) -> pd.DataFrame:
    return run_permutation(model, batch, cfg.params_for("permutation"), AblationContext.of(cfg))[
        ["example_id", "step", *COLUMNS]
    ]


def max_diff(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """Largest absolute difference over the value columns; inf if NaN patterns or counts differ."""
    worst = 0.0
    for c in COLUMNS:
        x, y = a[c].to_numpy(float), b[c].to_numpy(float)
        if not np.array_equal(np.isnan(x), np.isnan(y)):
            return float("inf")
        ok = ~np.isnan(x)
        if ok.any():
            worst = max(worst, float(np.abs(x[ok] - y[ok]).max()))
    return worst


def over(batches, fn, model, cfg) -> pd.DataFrame:
    return pd.concat([fn(model, b, cfg) for b in batches], ignore_index=True)


def run(args) -> dict:
    n_words = 3 if args.smoke else 500
    p_count = 3 if args.smoke else 100
    # smoke: random weights would decode to the length limit, so follow the reference there
    prefix = "reference" if args.smoke else "greedy"
    repeats = args.repeats or (2 if args.smoke else 3)
    cfg = common.ablation_cfg(n_permutations=p_count, seed=0)
    rows, checks = [], {}
    origins = {}
    for flow in common.kernels(args):
        bm = common.get_model(args, flow)
        origins[flow] = bm.origin
        batches = common.prepared(bm, n_words, prefix, batch_size=32)
        steps = sum(int(_steps(b).sum()) for b in batches)
        subset = batches[:NAIVE_BATCHES]
        naive_words = sum(len(b.examples) for b in subset)
        res = common.interleaved(
            {
                "fast": partial(over, batches, fast_path, bm.model, cfg),
                "per-step": partial(over, batches, per_step_loop, bm.model, cfg),
                "fast (naive subset)": partial(over, subset, fast_path, bm.model, cfg),
                "naive": partial(over, subset, naive_loop, bm.model, cfg),
            },
            repeats,
            once=("naive",),
        )
        fast = res["fast"].result
        d_step = max_diff(fast, res["per-step"].result)
        d_naive = max_diff(res["fast (naive subset)"].result, res["naive"].result)
        checks[flow] = (d_step, d_naive)
        rows.append(
            {
                "flow": f"{flow} ({common.KERNELS[flow]})",
                "words": n_words,
                "permuted steps": steps,
                "P": p_count,
                "fast s": res["fast"].best,
                "per-step s": res["per-step"].best,
                "naive words": naive_words,
                "fast s (naive words)": res["fast (naive subset)"].best,
                "naive s": res["naive"].best,
                "per-step / fast": res["per-step"].best / res["fast"].best,
                "naive / fast": res["naive"].best / res["fast (naive subset)"].best,
                "max abs diff per-step": d_step,
                "max abs diff naive": d_naive,
            }
        )
    notes = [f"model {flow}: {o}" for flow, o in origins.items()]
    for r in rows:
        notes.append(
            f"{r['flow']}: naive/fast {r['naive / fast']:.1f}× (target ≥ {TARGET_NAIVE:.0f}×, "
            f"{common.verdict(r['naive / fast'], TARGET_NAIVE)}); per-step/fast "
            f"{r['per-step / fast']:.1f}× (target ≥ {TARGET_PER_STEP:.0f}×, "
            f"{common.verdict(r['per-step / fast'], TARGET_PER_STEP)}); results agree to "
            f"{max(r['max abs diff per-step'], r['max abs diff naive']):.1e} (target ≤ 1e-6)"
        )
    if args.smoke:
        notes.append(
            "smoke mode: random weights and tiny sizes; the ratios say nothing about the targets"
        )
    common.report(
        "Local permutation: fast path vs per-step loop vs naive re-decoding",
        args,
        {
            "words": n_words,
            "P": p_count,
            "prefix": prefix,
            "batch size": 32,
            "chunk_rows": cfg.chunk_rows,
            "timing": f"best of {repeats} interleaved (naive: 1 run, on the first {NAIVE_BATCHES} batches)",
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
