"""Benchmark 13 — long sequences: the battery's time per decoder step as the source grows.

Copy-task examples of exactly L tokens (L = 10, 20, 40, 80 by default), the reference prefix (so
an example has L + 1 decoder steps whatever the weights), a randomly initialised model of the
quickstart's sizes (the cost of a step does not depend on the weights), one batch of ``--batch``
examples, one thread. Every ablation of the default battery is timed on its own (its ``run``,
best of ``--repeats`` interleaved rounds); its time per decoder step = time / real steps, and
the log-log slope of that against L says how it grows (0: constant per step; 1: ∝ T_x).

Three ratios, each against the least work its replacements need, timed in the same round:

* **leave-one-out** (``importance.loo_importance``: one source token deleted at a time, every
  step re-decoded) against **one batched forward over all its replacements**: one
  ``model.trace`` of every deleted source at once, no chunks, no TVD;
* **erase until the flip** (the whole ablation: rankings, erasures, one local forward per
  chunk) against **one batched forward over all its replacements**: one
  ``logits_given_attention`` call with the five rankings' n_valid − 1 erased rows per step
  (5 · (L − 1) rows, built beforehand);
* **gradient** (``importance.gradient_importance``: one backward per decoder step) against
  **one forward + backward per step**: T_y × the time of one forward and one backward of the
  whole trace (Σ_t log p_t(ŷ_t)), the cost of a per-step gradient computed naively.

Targets: each ratio ≤ 2. Run with ``.venv/bin/python -m benchmarks.run_all --only steps`` or
``PYTHONPATH=src:. python -m benchmarks.bench_steps [--smoke] [--lengths 10,20]``.
"""

from __future__ import annotations

import importlib

import torch

from . import common
from .bench_scaling import copy_of_length, slope

DEFAULT_LENGTHS = [10, 20, 40, 80]
TARGET_RATIO = 2.0
RANKINGS = 5
"""Erasure orders per step of ``erase_until_flip`` (attention, gradient, random × n_random_orders
…): the replacement count its reference forward is sized with."""


def _setting(length: int, n: int, flow: str):
    """(model, batch) of ``n`` copy examples of ``length`` tokens, random init, reference prefix."""
    from attnstudy.analysis.batch import prepare_batches

    from attnstudy.config import ModelConfig, validate_data_config
    from attnstudy.data.tasks import load_task
    from attnstudy.data.vocab import Vocab
    from attnstudy.models import build_model

    splits = load_task(validate_data_config(copy_of_length(length, n)))
    src_vocab = Vocab.build(ex.src for ex in splits.train)
    tgt_vocab = Vocab.build(ex.tgt for ex in splits.train)
    torch.manual_seed(1)
    cfg = ModelConfig(**common.QUICKSTART_MODEL, attention=common.FLOWS[flow], flow=flow)
    model = build_model(cfg, len(src_vocab), len(tgt_vocab)).eval()
    batch = next(
        prepare_batches(model, list(splits.test)[:n], src_vocab, tgt_vocab, "reference", n)
    )
    return model, batch


def _references(model, batch, chunk_rows: int) -> dict:
    """The three least-work references (callables), see the module docstring."""
    from attnstudy.analysis.ablations.importance import _deleted_sources
    from attnstudy.analysis.interventions import erase_ranked

    from attnstudy.models import eval_mode, gradients_in_eval

    tr = batch.trace
    rows_b, _, src_del, len_del = _deleted_sources(tr.src, tr.src_lengths)
    b, h, t_y, t_x = tr.attention.shape
    k_max = max(int(tr.src_lengths.max()) - 1, 1)
    order = torch.stack([torch.randperm(t_x) for _ in range(b * t_y)]).view(b, 1, 1, t_y, t_x)
    k = torch.arange(1, k_max + 1).repeat(RANKINGS).view(1, RANKINGS * k_max, 1, 1)
    erased = erase_ranked(
        tr.attention.unsqueeze(1).expand(b, RANKINGS * k_max, h, t_y, t_x), order, k
    ).weights

    def loo_forward():
        with eval_mode(model), torch.no_grad():
            return model.trace(src_del, len_del, tr.tgt_in[rows_b], tr.tgt_out[rows_b]).logits

    def erase_forward():
        with eval_mode(model), torch.no_grad():
            return model.logits_given_attention(tr, erased, chunk_rows * 1000)

    def forward_backward():
        with eval_mode(model), gradients_in_eval():
            leaf = model.embed(tr.src).detach().requires_grad_(True)
            out = model.trace(tr.src, tr.src_lengths, tr.tgt_in, tr.tgt_out, embedded=leaf)
            logp = torch.log_softmax(out.logits, -1).gather(-1, tr.tgt_out.unsqueeze(-1))
            (g,) = torch.autograd.grad(logp[tr.step_mask].sum(), leaf)
            return g

    return {"loo_forward": loo_forward, "erase_forward": erase_forward, "fwd_bwd": forward_backward}


def run(args) -> dict:
    from attnstudy.analysis.ablations import importance
    from attnstudy.analysis.batch import AblationContext
    from attnstudy.analysis.catalogue import AblationConfig, get_ablation

    lengths = (
        [int(s) for s in args.lengths.split(",")]
        if args.lengths
        else ([4, 8] if args.smoke else DEFAULT_LENGTHS)
    )
    n = 2 if args.smoke else args.batch
    adv_steps = args.adv_steps or (2 if args.smoke else 20)
    p_count = 3 if args.smoke else 100
    repeats = args.repeats or (1 if args.smoke else 2)
    cfg = AblationConfig(
        n_permutations=p_count,
        seed=0,
        prefix="reference",
        n_examples=n,
        adversarial={"steps": adv_steps},
    )
    ctx = AblationContext.of(cfg)
    names = list(cfg.ablations)
    per_step, ratios, raw = [], [], []
    for length in lengths:
        model, batch = _setting(length, n, args.flow)
        steps = int(batch.trace.step_mask.sum())
        fns = {}
        for name in names:
            module, _, attr = get_ablation(name).run.partition(":")
            fn = getattr(importlib.import_module(module), attr)
            fns[name] = lambda fn=fn, name=name, m=model, b=batch: fn(
                m, b, cfg.params_for(name), ctx
            )
        fns["loo"] = lambda m=model, b=batch: importance.loo_importance(m, b, cfg.chunk_rows)
        fns["gradient"] = lambda m=model, b=batch: importance.gradient_importance(m, b)
        fns |= _references(model, batch, cfg.chunk_rows)
        res = common.interleaved(fns, repeats)
        best = {k: v.best for k, v in res.items()}
        raw.append((length, steps, best))
        per_step.append(
            {"L": length, "steps": steps, **{f"{a} ms": 1e3 * best[a] / steps for a in names}}
        )
        ratios.append(
            {
                "L": length,
                "LOO s": best["loo"],
                "one forward, all deletions s": best["loo_forward"],
                "LOO ratio": best["loo"] / best["loo_forward"],
                "erase until flip s": best["erase_until_flip"],
                "one forward, all erasures s": best["erase_forward"],
                "erase ratio": best["erase_until_flip"] / best["erase_forward"],
                "gradient s": best["gradient"],
                "steps × (forward + backward) s": steps / n * best["fwd_bwd"],
                "gradient ratio": best["gradient"] / (steps / n * best["fwd_bwd"]),
                "gradient / one (forward + backward)": best["gradient"] / best["fwd_bwd"],
            }
        )
        print(f"L={length}: {steps} steps timed", flush=True)
    xs = [length for length, _, _ in raw]
    slopes = {
        a: slope(xs, [best[a] / steps for _, steps, best in raw])
        for a in [*names, "loo", "gradient"]
    }
    worst = {
        key: max(r[key] for r in ratios) for key in ("LOO ratio", "erase ratio", "gradient ratio")
    }
    notes = [
        f"{key}: worst {value:.2f} over the lengths (target ≤ {TARGET_RATIO:g}, "
        f"{common.verdict(value, TARGET_RATIO, higher_is_better=False)})"
        for key, value in worst.items()
    ]
    notes += [
        "time per step = the ablation's time / real decoder steps (L + 1 per example); slope = "
        "log-log slope of the time per step against L (0: constant per step, 1: ∝ T_x)",
        f"adversarial search at {adv_steps} Adam iterations (the default 500 is "
        f"{500 / adv_steps:.0f}× its time; its cost is linear in the iterations)",
        "the gradient's reference is (decoder steps per example) × one forward + backward of the "
        "whole batch: one backward per step, each through the whole sequence",
        common.load_note(args),
    ]
    if args.smoke:
        notes.append("smoke mode: tiny lengths and settings; the ratios say nothing")
    common.report(
        "Long sequences: the battery's time per decoder step as the source grows",
        args,
        {
            "lengths": ",".join(map(str, lengths)),
            "model": f"{args.flow} (random init, quickstart sizes)",
            "examples per length": n,
            "P": p_count,
            "Adam iterations": adv_steps,
            "prefix": "reference",
            "threads": args.threads,
            "timing": f"best of {repeats} interleaved",
        },
        [
            ("Time per decoder step (ms) per ablation", common.table(per_step)),
            ("Log-log slope of the time per step against L", common.table([slopes])),
            (
                "Ablations whose replacements grow with the source, against the least work",
                common.table(ratios),
            ),
        ],
        notes,
    )
    return {"per_step": per_step, "slopes": slopes, "ratios": ratios, "worst": worst}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--lengths", default=None, help="comma-separated source lengths")
    p.add_argument("--flow", default="bahdanau", choices=sorted(common.FLOWS))
    p.add_argument("--batch", type=int, default=8, help="examples per length (default 8)")
    p.add_argument("--adv-steps", type=int, default=None, help="Adam iterations (default 20)")
    args = p.parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
