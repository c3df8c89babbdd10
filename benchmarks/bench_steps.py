"""Benchmark 13 — long sequences: the battery's time per decoder step as the source grows.

Copy-task examples of exactly L tokens (L = 10, 20, 40, 80 by default), the reference prefix (so
an example has L + 1 decoder steps whatever the weights), a randomly initialised model of the
quickstart's sizes (``--flow`` bahdanau, luong or transformer; the cost of a step does not depend
on the weights), one batch of ``--batch`` examples (32 by default, so that fixed per-call costs do
not dominate), one thread. Each length runs in its own child process (its peak RSS from
``os.wait4``); in it, every ablation of the default battery is timed on its own (its ``run``), and
the two parts of ``importance`` as well (``importance.loo_importance`` and
``importance.gradient_importance``, called directly: the ablation's results are untouched), best
of ``--repeats`` interleaved rounds (3 by default). Time per decoder step = time / real steps; the
log-log slope of that against L says how it grows (0: constant per step; 1: ∝ T_x).

Three ratios, each against the least work its replacements need, timed in the same child, on the
same model and batch, in the same interleaved rounds (target ≤ 2 each):

* **leave-one-out** (``loo_importance``: R deleted sources, R ≤ B · L, every step re-decoded, TVD)
  against **one batched forward over all its replacements**: one ``model.trace`` of the same R
  deleted sources at once, no chunks, no TVD;
* **erase until the flip** (the whole ablation: base output, the gradient of the gradient
  rankings, the orders, every erased prefix) against **one batched forward over all its
  replacements**: one ``logits_given_attention`` call over every erased row the ablation
  evaluates — O orders (4 rankings + ``n_random_orders`` random ones, 9 by default) × (n_valid − 1)
  prefixes per step; the ablation evaluates every prefix (it does not stop at the flip), so this
  is the exact count, not a bound — built beforehand; split into calls over groups of examples
  only where the erased weights would exceed ``--ref-budget`` elements (the table says how many
  calls);
* **gradient** (``gradient_importance``: one forward, then one backward per decoder step) against
  **one forward + backward per step**: for each step t, one forward of the batch and one backward
  of Σ_b log p_t(ŷ_t) to the source embeddings (T_y forward + backward pairs, all timed; the
  backward from step t's own logits where the model keeps them, as the ablation does).

The replacements are counted, not assumed: a counting wrapper on ``model.trace`` (leave-one-out)
and on ``model.logits_given_attention`` (erasure: P × computed steps of each call with a P axis)
runs once before the timed rounds, and the references are built with the same counts. Two
checks, outside the timing: the leave-one-out reference's TVDs and the gradient reference's
|gradient × input| equal the ablation's (max absolute difference reported).

Run with ``.venv/bin/python -m benchmarks.run_all --only steps`` or
``PYTHONPATH=src:. python -m benchmarks.bench_steps [--smoke] [--lengths 10,20] [--flow luong]``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import time

import torch

from . import common
from .bench_scaling import copy_of_length, slope, spawn

DEFAULT_LENGTHS = [10, 20, 40, 80]
TARGET_RATIO = 2.0
REF_BUDGET = 2**28
"""Elements of the erasure reference's weights (B', P, H, T_y, T_x) per ``logits_given_attention``
call (1 GiB in float32): above it the reference is split into calls over groups of examples."""
RATIOS = {
    "leave-one-out": ("loo", "ref_loo", "loo", "one trace of all deleted sources"),
    "erase until flip": (
        "erase_until_flip",
        "ref_erase",
        "erase_until_flip",
        "logits_given_attention over all erased rows",
    ),
    "gradient": ("gradient", "ref_grad", None, "T_y × (forward + backward of step t)"),
}
"""Ratio name → (timed ablation, timed reference, key of the counted replacements (None: the
decoder steps), what the reference is)."""


# ----------------------------------------------------------------------------- child


def model_config(flow: str) -> dict:
    """The quickstart-size model of ``flow`` (bahdanau, luong or transformer) as a config dict."""
    if flow == "transformer":
        return dict(common.QUICKSTART_TRANSFORMER, architecture="transformer")
    return dict(common.QUICKSTART_MODEL, attention=common.FLOWS[flow], flow=flow)


def _setting(length: int, n: int, flow: str):
    """(model, batch) of ``n`` copy examples of ``length`` tokens, random init, reference prefix."""
    from attnstudy.analysis.batch import prepare_batches

    from attnstudy.config import ModelConfig, TransformerConfig, validate_data_config
    from attnstudy.data.tasks import load_task
    from attnstudy.data.vocab import Vocab
    from attnstudy.models import build_model

    splits = load_task(validate_data_config(copy_of_length(length, n)))
    src_vocab = Vocab.build(ex.src for ex in splits.train)
    tgt_vocab = Vocab.build(ex.tgt for ex in splits.train)
    torch.manual_seed(1)
    kind = TransformerConfig if flow == "transformer" else ModelConfig
    model = build_model(kind(**model_config(flow)), len(src_vocab), len(tgt_vocab)).eval()
    batch = next(
        prepare_batches(model, list(splits.test)[:n], src_vocab, tgt_vocab, "reference", n)
    )
    return model, batch


@contextlib.contextmanager
def counting(model, method: str, count):
    """Count what each call of ``model.<method>`` computes while the block runs.

    Args:
        model: the model; an instance attribute shadows the method inside the block and is
            removed afterwards (the results are those of the method itself).
        method: the method's name. count: ``count(*args, **kwargs) -> int`` for one call.

    Yields:
        A list that receives one count per call.
    """
    original = getattr(model, method)
    counts: list[int] = []

    def wrapper(*args, **kwargs):
        counts.append(int(count(*args, **kwargs)))
        return original(*args, **kwargs)

    setattr(model, method, wrapper)
    try:
        yield counts
    finally:
        delattr(model, method)


def _erased_rows(trace, weights, chunk_rows=4096, steps=None, plain=False) -> int:
    """Rows (example, replacement, step) one ``logits_given_attention`` call computes: P × the
    computed steps for weights with a P axis, 0 for a single row per step (the base output and
    the attention gradient, not replacements)."""
    if weights.dim() != 5:
        return 0
    mask = trace.step_mask if steps is None else steps & trace.step_mask
    return weights.size(1) * int(mask.sum())


def count_replacements(model, batch, cfg, ctx) -> dict[str, int]:
    """The replacements leave-one-out and erase-until-flip make on ``batch``, counted.

    Returns:
        ``{"loo": deleted sources traced, "erase_until_flip": erased rows computed}``.
    """
    from attnstudy.analysis.ablations import erase_until_flip, importance

    with counting(model, "trace", lambda src, *a, **k: src.size(0)) as loo:
        importance.loo_importance(model, batch, cfg.chunk_rows)
    with counting(model, "logits_given_attention", _erased_rows) as erase:
        erase_until_flip.run(model, batch, cfg.params_for("erase_until_flip"), ctx)
    return {"loo": sum(loo), "erase_until_flip": sum(erase)}


def references(model, batch, cfg, budget: int = REF_BUDGET) -> tuple[dict, dict]:
    """The three least-work references of the module docstring, built on ``batch``.

    Args:
        model: the model. batch: the prepared batch (B, T_y, T_x). cfg: the ablation config
            (``n_random_orders`` of erase-until-flip sizes its reference).
        budget: elements of erased weights per reference call (see :data:`REF_BUDGET`).

    Returns:
        ``(fns, info)``: callables ``ref_loo``, ``ref_erase``, ``ref_grad`` (to time) and
        ``{"loo": deleted sources, "erase_until_flip": erased rows, "erase_calls": calls,
        "orders": erasure orders per step}``.
    """
    from attnstudy.analysis.ablations.erase_until_flip import RANKINGS
    from attnstudy.analysis.ablations.importance import _deleted_sources
    from attnstudy.analysis.interventions import erase_ranked

    from attnstudy.models import eval_mode, gradients_in_eval

    tr = batch.trace
    rows_b, _, src_del, len_del = _deleted_sources(tr.src, tr.src_lengths)
    b, h, t_y, t_x = tr.attention.shape
    nv = (~tr.pad_mask).sum(-1)
    orders = len(RANKINGS) - 1 + cfg.params_for("erase_until_flip").n_random_orders
    k_max = max(int(nv.max()) - 1, 1)
    p = orders * k_max
    per_example = p * h * t_y * t_x
    size = max(1, budget // per_example)
    gen = torch.Generator().manual_seed(0)
    parts = []
    for start in range(0, b, size):
        rows = torch.arange(start, min(b, start + size))
        sub = tr.select(rows)
        # any order with the valid positions first costs the same; the sources have no padding
        order = torch.rand(rows.numel(), 1, 1, t_y, t_x, generator=gen).argsort(-1)
        k = torch.arange(1, k_max + 1).repeat(orders).view(1, p, 1, 1)
        weights = erase_ranked(
            sub.attention.unsqueeze(1).expand(rows.numel(), p, h, t_y, t_x), order, k
        ).weights
        steps = sub.step_mask & (nv[rows] >= 2)[:, None]
        parts.append((sub, weights, steps))

    def ref_loo():
        with eval_mode(model), torch.no_grad():
            return model.trace(src_del, len_del, tr.tgt_in[rows_b], tr.tgt_out[rows_b]).logits

    def ref_erase():
        with eval_mode(model), torch.no_grad():
            return [
                model.logits_given_attention(sub, w, cfg.chunk_rows, steps)
                for sub, w, steps in parts
            ]

    def ref_grad():
        grads = []
        with eval_mode(model), gradients_in_eval():
            for t in range(t_y):
                leaf = model.embed(tr.src).detach().requires_grad_(True)
                out = model.trace(
                    tr.src,
                    tr.src_lengths,
                    tr.tgt_in,
                    tr.tgt_out,
                    embedded=leaf,
                    detach_attention=True,
                )
                step = out.step_logits[t] if out.step_logits else out.logits[:, t]
                logp = torch.log_softmax(step, -1).gather(-1, tr.tgt_out[:, t : t + 1])
                (g,) = torch.autograd.grad(logp.sum(), leaf)
                grads.append((g * leaf).sum(-1).abs().detach())
        return torch.stack(grads, 1)  # (B, T_y, T_x)

    info = {
        "loo": int(rows_b.numel()),
        "erase_until_flip": sum(w.size(1) * int(s.sum()) for _, w, s in parts),
        "erase_calls": len(parts),
        "orders": orders,
    }
    return {"ref_loo": ref_loo, "ref_erase": ref_erase, "ref_grad": ref_grad}, info


def _checks(batch, results: dict) -> dict[str, float]:
    """Max |reference − ablation| of leave-one-out (TVD) and gradient (|gradient × input|) over
    the real steps and positions."""
    from attnstudy.analysis.ablations.importance import _deleted_sources
    from attnstudy.analysis.step_scores import step_score

    tr = batch.trace
    rows_b, rows_j, _, _ = _deleted_sources(tr.src, tr.src_lengths)
    p = torch.softmax(tr.logits, -1)
    div = step_score("tvd", p[rows_b], torch.softmax(results["ref_loo"], -1))  # (R, T_y)
    loo = results["loo"][rows_b, :, rows_j]  # (R, T_y)
    real = tr.step_mask[rows_b]
    grad_ref, grad = results["ref_grad"], results["gradient"]
    valid = tr.step_mask[:, :, None] & ~tr.pad_mask[:, None, :]
    return {
        "loo": float((div - loo)[real].abs().max()),
        "gradient": float((grad_ref - grad)[valid].abs().max()),
    }


def _profile(fns: dict, names: list[str], top: int = 12) -> dict[str, list[dict]]:
    """cProfile of one call of each of ``names``: the ``top`` functions by own time."""
    import cProfile
    import pstats

    out = {}
    for name in names:
        prof = cProfile.Profile()
        prof.enable()
        fns[name]()
        prof.disable()
        stats = pstats.Stats(prof)
        total = stats.total_tt
        rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
        out[name] = [
            {
                "function": f"{fn[0].rsplit('/', 1)[-1]}:{fn[1]}({fn[2]})",
                "calls": st[1],
                "own s": st[2],
                "cumulative s": st[3],
                "share of the call": st[2] / total if total else math.nan,
            }
            for fn, st in rows
        ]
    return out


def child(params: dict) -> dict:
    """One length, in the child process: count, time (interleaved best of ``repeats``), check.

    Args:
        params: ``length``, ``n`` (examples), ``flow``, ``cfg`` (AblationConfig fields),
            ``repeats``, ``threads``, ``budget`` (:data:`REF_BUDGET`), ``profile`` (bool).

    Returns:
        A JSON-able dict: ``length``, ``n``, ``steps`` (real decoder steps), ``best`` and
        ``times`` (s per timed name), ``counted`` (the ablations' replacements),
        ``reference`` (the references' replacements, erase calls, orders), ``checks``,
        ``profile``.
    """
    from attnstudy.analysis.ablations import importance
    from attnstudy.analysis.batch import AblationContext
    from attnstudy.analysis.catalogue import AblationConfig, get_ablation

    torch.set_num_threads(params["threads"])
    cfg = AblationConfig.model_validate(params["cfg"] | {"n_examples": params["n"]})
    ctx = AblationContext.of(cfg)
    model, batch = _setting(params["length"], params["n"], params["flow"])
    steps = int(batch.trace.step_mask.sum())
    counted = count_replacements(model, batch, cfg, ctx)
    fns = {}
    for name in cfg.ablations:
        module, _, attr = get_ablation(name).run.partition(":")
        fn = getattr(importlib.import_module(module), attr)
        fns[name] = lambda fn=fn, name=name: fn(model, batch, cfg.params_for(name), ctx)
    fns["loo"] = lambda: importance.loo_importance(model, batch, cfg.chunk_rows)
    fns["gradient"] = lambda: importance.gradient_importance(model, batch)
    refs, info = references(model, batch, cfg, params["budget"])
    fns |= refs
    res = common.interleaved(fns, params["repeats"])
    checks = _checks(batch, {k: res[k].result for k in ("loo", "gradient", "ref_loo", "ref_grad")})
    profile = {}
    if params.get("profile"):
        profile = _profile(fns, ["loo", "ref_loo", "erase_until_flip", "ref_erase", "gradient"])
    return {
        "length": params["length"],
        "n": params["n"],
        "steps": steps,
        "best": {k: v.best for k, v in res.items()},
        "times": {k: v.times for k, v in res.items()},
        "counted": counted,
        "reference": info,
        "checks": checks,
        "profile": profile,
    }


# ----------------------------------------------------------------------------- parent


def run(args) -> dict:
    from attnstudy.analysis.catalogue import list_ablations

    lengths = (
        [int(s) for s in args.lengths.split(",")]
        if args.lengths
        else ([4, 8] if args.smoke else DEFAULT_LENGTHS)
    )
    n = args.batch or (2 if args.smoke else 32)
    adv_steps = args.adv_steps or (2 if args.smoke else 20)
    p_count = 3 if args.smoke else 100
    repeats = args.repeats or (1 if args.smoke else 3)
    cfg = {
        "n_permutations": p_count,
        "seed": 0,
        "prefix": "reference",
        "adversarial": {"steps": adv_steps},
    }
    names = list_ablations(default_only=True)
    rows = []
    for length in lengths:
        t0 = time.perf_counter()
        r = spawn(
            {
                "label": f"L={length}",
                "length": length,
                "n": n,
                "flow": args.flow,
                "cfg": cfg,
                "repeats": repeats,
                "threads": args.threads,
                "budget": args.ref_budget,
                "profile": args.profile and length == lengths[-1],
            },
            module="benchmarks.bench_steps",
        )
        rows.append(r)
        print(
            f"L={length}: {r['steps']} steps, {time.perf_counter() - t0:.0f} s, "
            f"peak RSS {r['peak_rss_kb'] / 1024:.0f} MB",
            flush=True,
        )

    timed_names = [*names, "loo", "gradient"]
    per_step = [
        {
            "L": r["length"],
            "steps": r["steps"],
            **{f"{a} ms": 1e3 * r["best"][a] / r["steps"] for a in timed_names},
            "peak RSS MB": r["peak_rss_kb"] / 1024,
        }
        for r in rows
    ]
    xs = [r["length"] for r in rows]
    slopes = {a: slope(xs, [r["best"][a] / r["steps"] for r in rows]) for a in timed_names}
    ratios = []
    for r in rows:
        for label, (abl, ref, key, what) in RATIOS.items():
            value = r["best"][abl] / r["best"][ref]
            ratios.append(
                {
                    "L": r["length"],
                    "ablation": label,
                    "replacements (counted)": r["counted"][key] if key else r["steps"],
                    "reference replacements": r["reference"][key] if key else r["steps"],
                    "ablation s": r["best"][abl],
                    "reference": what
                    + (
                        f" ({r['reference']['erase_calls']} calls)"
                        if key == "erase_until_flip" and r["reference"]["erase_calls"] > 1
                        else ""
                    ),
                    "reference s": r["best"][ref],
                    "ratio": value,
                    "verdict": common.verdict(value, TARGET_RATIO, higher_is_better=False),
                }
            )
    worst = {label: max(x["ratio"] for x in ratios if x["ablation"] == label) for label in RATIOS}
    checks = {k: max(r["checks"][k] for r in rows) for k in ("loo", "gradient")}
    orders = rows[0]["reference"]["orders"]
    notes = [
        f"{label}: worst ratio {value:.2f} over the lengths (target ≤ {TARGET_RATIO:g}, "
        f"{common.verdict(value, TARGET_RATIO, higher_is_better=False)})"
        for label, value in worst.items()
    ]
    notes += [
        "time per step = the ablation's time / real decoder steps (L + 1 per example); slope = "
        "log-log slope of the time per step against L (0: constant per step, 1: ∝ T_x); "
        "loo and gradient are the two parts of importance, timed on their own",
        "ratio = the ablation's best time / its reference's best time, timed interleaved in the "
        "same child process on the same model and batch",
        "leave-one-out: replacements = deleted sources (one per run of equal tokens, ≤ B · L), "
        "counted on model.trace; reference = one model.trace of all of them at once (no chunks, "
        "no TVD)",
        f"erase until flip: replacements = erased rows (example, prefix, step) computed, counted "
        f"on logits_given_attention: {orders} orders (4 rankings + {orders - 4} random) × "
        f"(n_valid − 1) prefixes per step, every prefix evaluated (exact, not a bound); reference "
        f"= the same number of erased rows, built beforehand, through logits_given_attention "
        "(output layers 4,096 rows at a time, the ablation's chunk_rows), "
        f"one call unless the weights exceed {args.ref_budget:,} elements",
        "gradient: replacements = decoder steps (one backward each); reference = for every step t "
        "one forward of the batch and one backward of Σ_b log p_t(ŷ_t) to the source embeddings "
        "(from step t's own logits where the model keeps them)",
        f"checks (outside the timing): reference against ablation, max |Δ| leave-one-out TVD "
        f"{checks['loo']:.1e}, |gradient × input| {checks['gradient']:.1e}",
        f"adversarial search at {adv_steps} Adam iterations (the default 500 is "
        f"{500 / adv_steps:.0f}× its time; its cost is linear in the iterations)",
        common.load_note(args),
    ]
    if args.smoke:
        notes.append("smoke mode: tiny lengths and settings; the ratios say nothing")
    sections = [
        ("Time per decoder step (ms) per ablation", common.table(per_step)),
        ("Log-log slope of the time per step against L", common.table([slopes])),
        (
            "Ablations whose replacements grow with the source, against one batched forward "
            "(leave-one-out, erasure) or one forward + backward per step (gradient)",
            common.table(ratios),
        ),
    ]
    for name, prof in (rows[-1].get("profile") or {}).items():
        sections.append(
            (f"Profile of {name} at L = {rows[-1]['length']} (cProfile)", common.table(prof))
        )
    common.report(
        "Long sequences: the battery's time per decoder step as the source grows",
        args,
        {
            "lengths": ",".join(map(str, lengths)),
            "model": f"{args.flow} (random init, quickstart sizes)",
            "batch": f"{n} copy-task sources of exactly L tokens per length",
            "P": p_count,
            "Adam iterations": adv_steps,
            "erasure orders": orders,
            "prefix": "reference",
            "threads": args.threads,
            "timing": f"best of {repeats} interleaved, one child process per length",
        },
        sections,
        notes,
    )
    return {
        "rows": rows,
        "per_step": per_step,
        "slopes": slopes,
        "ratios": ratios,
        "worst": worst,
        "checks": checks,
    }


def main(argv=None) -> dict | None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--lengths", default=None, help="comma-separated source lengths")
    p.add_argument("--flow", default="bahdanau", choices=sorted(common.KERNELS))
    p.add_argument("--batch", type=int, default=None, help="examples per length (default 32)")
    p.add_argument("--adv-steps", type=int, default=None, help="Adam iterations (default 20)")
    p.add_argument(
        "--ref-budget",
        type=int,
        default=REF_BUDGET,
        help="erased-weight elements per call of the erasure reference (default 2^28)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile the three ablations and their references at the largest length",
    )
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return None
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
