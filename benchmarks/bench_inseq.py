"""Benchmark — attnstudy against inseq 0.7.1, side by side, on one Hugging Face model.

The same tiny Marian model folder (:mod:`attnstudy.models.hf_tiny`, word-level tokenizer, built
here unless ``--model`` names one), the same sentences (``--sentences``, seeded copy-task
sentences), one process, one thread. Each sentence's target is the model's own greedy output
(attnstudy's greedy prefix, its ``<eos>`` step included), given to both tools: to attnstudy as the
reference prefix, to inseq as ``generated_texts`` (forced decoding). Timed interleaved, best of 3,
from the texts and their targets to the scores (tokenisation, batching and the teacher-forced
trace included for both):

* **attention** — the cross-attention of every layer and head (inseq ``attention``; attnstudy's
  trace);
* **saliency**, **input × gradient**, **integrated gradients** (``--ig-steps`` Gauss–Legendre
  points, baseline the ``<unk>`` embedding at every source position) — with respect to the source
  embeddings, summed over the embedding dimension;
* **occlusion** — each source token replaced by ``<unk>``.

What both attribute, so that the numbers can agree: the log-probability of the emitted token
under attnstudy's output distribution, which never predicts the padding / decoder-start token
(its logit is banned, so p_t is the model's softmax renormalised over the other tokens; inseq's
default target is the probability over every column: a step function ``attnstudy_logprob`` with
the same column banned is registered and passed as ``attributed_fn``); the gradient through the
attention weights too (attnstudy's ``detach_attention=False``; its default detaches them); the
``<unk>`` baseline on the source's ``</s>`` as well (inseq's ``include_eos_baseline=True``; by
default inseq keeps ``</s>`` in its baseline); the raw per-element scores summed over the
embedding dimension (inseq's aggregated output is instead a norm over it, normalised per step);
occlusion's absolute value (inseq keeps |f(x) − f(x̃)|, attnstudy the signed drop). Agreement is
the largest absolute difference over every example's real (step, source position) cells, judged
against the method's largest absolute score (:data:`AGREE`). With
each tool's defaults the scores differ by definition; the report gives those differences too.

Two batchings: inseq's default (every sentence in one batch) against attnstudy's default
(``--batch-size``), and both at ``--batch-size``. Target: attnstudy ≥ 5× inseq on every method.

Set-up (not in CI: inseq declares multi-GB CUDA packages): ``benchmarks/inseq_env.sh`` makes
``.venv-inseq`` with attnstudy (editable) and inseq ``--no-deps`` plus its runtime requirements.

Run: ``.venv-inseq/bin/python -m benchmarks.bench_inseq [--smoke] [--tools attnstudy]``.
``--tools attnstudy`` times attnstudy's half alone (no inseq needed: the test suite's smoke run).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from pathlib import Path

import torch

from . import common

METHODS = ("attention", "saliency", "input_x_gradient", "integrated_gradients", "occlusion")
"""The methods both tools compute, in the report's order."""
TARGET = 5.0
"""attnstudy / inseq speed target (inseq s / attnstudy s ≥ 5)."""
AGREE = 1e-5
"""Two float32 results count as equal when their largest absolute difference is at most
AGREE × max(1, the method's largest absolute score) (``allclose`` with atol = rtol = AGREE on the
largest score): sums of float32 products of magnitude ~10 carry errors of ~1e-5, and a difference
of two log-probabilities of magnitude ~1 errors of ~1e-7 however small the difference."""
SENTENCE_SEED = 41
CSV = common.HERE.parent / "experiments" / "results" / "inseq-side-by-side.csv"
"""The committed table that docs/benchmarks.md's section is generated from (``make docs``)."""


def parse(argv=None) -> argparse.Namespace:
    """The benchmark's arguments (:func:`benchmarks.common.parser`'s and its own).

    Raises:
        SystemExit: (exit code 2) an unknown method or tool, or a size below 1.
    """
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a Hugging Face model folder (default: build one)")
    p.add_argument("--sentences", type=int, default=None, help="sentences (default 100; smoke 4)")
    p.add_argument(
        "--batch-size", type=int, default=32, help="attnstudy's batch (and the equal one)"
    )
    p.add_argument("--ig-steps", type=int, default=None, help="IG points (default 50; smoke 4)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    p.add_argument(
        "--tools",
        choices=("both", "attnstudy"),
        default="both",
        help="'attnstudy': time attnstudy alone (no inseq needed)",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="comma-separated methods to profile once per tool (cProfile, top functions by "
        "own time, and torch.profiler's top operators) after the timings",
    )
    p.add_argument(
        "--csv",
        default=None,
        help=f"the table as CSV for docs/benchmarks.md (default: {CSV} in full mode with both "
        "tools; then `make docs`)",
    )
    args = p.parse_args(argv)
    args.methods = args.methods.split(",")
    args.profile = args.profile.split(",") if args.profile else []
    unknown = [m for m in args.methods + args.profile if m not in METHODS]
    if unknown:
        p.error(f"unknown method(s) {', '.join(unknown)}; valid: {', '.join(METHODS)}")
    if args.sentences is None:
        args.sentences = 4 if args.smoke else 100
    if args.ig_steps is None:
        args.ig_steps = 4 if args.smoke else 50
    for name in ("sentences", "batch_size", "ig_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


# ----------------------------------------------------------------------------- attnstudy's half


def forced_examples(model, texts: list[str], batch_size: int):
    """The sentences as attnstudy examples whose target is the model's greedy output.

    Returns:
        (examples, targets): :class:`~attnstudy.data.types.Example` objects with the greedy tokens
        (no ``<eos>``) as ``tgt``, and the same targets as texts for inseq. A sentence whose greedy
        output stops at the length limit without ``<eos>`` is left out (inseq's forced decoding
        always ends its target with ``</s>``).
    """
    from attnstudy.analysis.batch import prepare_batches

    from attnstudy.data.types import Example
    from attnstudy.data.vocab import EOS_ID

    examples = [
        Example(f"s{i}", model.source_tokens(t), model.target_tokens(t))
        for i, t in enumerate(texts)
    ]
    out, targets = [], []
    for batch in prepare_batches(model, examples, model.vocab, model.vocab, "greedy", batch_size):
        tr = batch.trace
        for b in range(tr.src.size(0)):
            ids = tr.tgt_out[b, : int(tr.step_mask[b].sum())].tolist()
            if ids[-1] != EOS_ID:
                continue
            ex = batch.examples[b]
            tokens = tuple(model.vocab.itos[i] for i in ids[:-1])
            out.append(Example(ex.id, ex.src, tokens))
            targets.append(model.detokenize(ids[:-1]))
    return out, targets


def attnstudy_scores(model, examples, method: str, batch_size: int, ig_steps: int) -> list:
    """attnstudy's scores of every example, each a tensor (T_y, T_x) — (T_y, T_x, L, H) for
    attention — over its real steps (the ``<eos>`` step included) and source tokens (``</s>``
    included)."""
    from attnstudy.analysis.attribution import attribute
    from attnstudy.analysis.batch import prepare_batches

    params = {
        "saliency": {"detach_attention": False},
        "input_x_gradient": {"detach_attention": False},
        "integrated_gradients": {
            "detach_attention": False,
            "n_steps": ig_steps,
            "baseline": "unk",
        },
        "occlusion": {"replacement": "unk", "score": "log_probability_drop"},
    }
    out = []
    batches = prepare_batches(model, examples, model.vocab, model.vocab, "reference", batch_size)
    for batch in batches:
        tr = batch.trace
        if method == "attention":
            grid = tr.cross.permute(0, 3, 4, 1, 2)  # (B, T_y, T_x, L, H)
        else:
            grid = attribute(model, batch, method, **params[method])
        for b in range(tr.src.size(0)):
            n_y, n_x = int(tr.step_mask[b].sum()), int(tr.src_lengths[b])
            out.append(grid[b, :n_y, :n_x].detach())
    return out


# ----------------------------------------------------------------------------- inseq's half


def inseq_grid(source_attributions: torch.Tensor, method: str) -> torch.Tensor:
    """One inseq sequence's raw ``source_attributions`` in attnstudy's layout.

    Args:
        source_attributions: inseq's layout, source first: (T_x, T_y, d) per embedding element
            for the gradient methods, (T_x, T_y) for occlusion (inseq keeps one element of
            Captum's window, whose elements are equal, and its absolute value), (T_x, T_y, L, H)
            for attention.
        method: one of :data:`METHODS`.

    Returns:
        (T_y, T_x) token scores — for the gradient methods the sum over d, as attnstudy sums
        Captum's per-element attribution — or (T_y, T_x, L, H) for attention.

    Raises:
        ValueError: a shape that is not inseq 0.7.1's for the method.
    """
    dims = {"attention": 4, "occlusion": 2}.get(method, 3)
    if source_attributions.dim() != dims:
        raise ValueError(
            f"inseq's {method} scores have shape {tuple(source_attributions.shape)}; "
            f"expected {dims} dimensions (inseq 0.7.1)"
        )
    x = source_attributions.detach().to(torch.float32).transpose(0, 1)
    return x.sum(-1) if dims == 3 else x


def comparable(method: str, scores: list) -> list:
    """attnstudy's scores as inseq defines the method: occlusion's absolute value (inseq keeps
    |f(x) − f(x̃)|; attnstudy the signed drop), the rest unchanged."""
    return [s.abs() for s in scores] if method == "occlusion" else scores


def max_abs_diff(ours: list, theirs: list) -> float:
    """Largest absolute difference over every cell of paired per-example tensors (NaN where a
    pair's shapes differ: the tools did not attribute the same tokens)."""
    worst = 0.0
    for a, b in zip(ours, theirs, strict=True):
        if a.shape != b.shape:
            return math.nan
        worst = max(worst, float((a.double() - b.double()).abs().max()))
    return worst


def require_inseq():
    """The inseq module.

    Raises:
        SystemExit: inseq is not importable (one line: how to make its virtualenv).
    """
    try:
        import inseq
    except ImportError as err:
        raise SystemExit(
            f"attnstudy: error: inseq cannot be imported here ({err}); run "
            "benchmarks/inseq_env.sh and use .venv-inseq/bin/python, or pass --tools attnstudy"
        ) from None
    return inseq


def banned_columns(model) -> list[int]:
    """The model's output columns attnstudy never predicts (its padding / decoder-start token):
    their logits are :data:`attnstudy.models.hf.BANNED_LOGIT`, so attnstudy's p_t is the model's
    softmax renormalised over the other tokens."""
    return sorted(set(model.ids.columns[model.ids.banned].tolist()))


def load_inseq(folder: str, methods: list[str], banned: list[int]) -> dict:
    """inseq's models, one per method (its attribution method is part of the model object), with
    the step function ``attnstudy_logprob`` registered: log p_t(ŷ_t) with the ``banned`` output
    columns at attnstudy's banned logit, so both tools attribute the same number.

    Raises:
        SystemExit: inseq is not importable (one line: how to make its virtualenv).
    """
    inseq = require_inseq()

    from attnstudy.models.hf import BANNED_LOGIT

    def attnstudy_logprob(args):
        logits = args.attribution_model.output2logits(args.forward_output).clone()
        logits[..., banned] = BANNED_LOGIT
        target = args.target_ids.reshape(logits.shape[0], 1).to(logits.device)
        return logits.log_softmax(-1).gather(-1, target).squeeze(-1)

    inseq.register_step_function(attnstudy_logprob, "attnstudy_logprob", overwrite=True)
    return {m: inseq.load_model(folder, m) for m in methods}


def inseq_scores(
    model,
    texts,
    targets,
    method: str,
    *,
    batch_size: int | None,
    ig_steps: int,
    target="attnstudy_logprob",
) -> list:
    """inseq's scores of every sentence in attnstudy's layout (:func:`inseq_grid`).

    ``target``: inseq's ``attributed_fn`` (``"attnstudy_logprob"``, or ``None`` for its default,
    the probability over every output column); with a target the baseline covers ``</s>`` too
    (``include_eos_baseline``), with None inseq's default (``</s>`` kept).
    """
    kw = {}
    if method == "integrated_gradients":
        kw["n_steps"] = ig_steps
    if method != "attention":
        kw["attributed_fn"] = target
        kw["include_eos_baseline"] = target is not None
    out = model.attribute(
        texts,
        generated_texts=targets,
        batch_size=batch_size,
        show_progress=False,
        pretty_progress=False,
        **kw,
    )
    return [inseq_grid(s.source_attributions, method) for s in out.sequence_attributions]


# ----------------------------------------------------------------------------- the benchmark


def model_folder(args, tmp: str) -> str:
    from attnstudy.models.hf_tiny import build_tiny

    if args.model:
        if not (Path(args.model) / "config.json").is_file():
            raise SystemExit(f"attnstudy: error: {args.model} is not a Hugging Face model folder")
        return args.model
    steps = 20 if args.smoke else 150
    return str(build_tiny(Path(tmp) / "marian", family="marian", tokenizer="word", steps=steps))


def run(args: argparse.Namespace) -> dict:
    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import copy_pairs

    repeats = args.repeats or (1 if args.smoke else 3)
    both = args.tools == "both"
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args, tmp)
        model = load_pretrained(folder)
        texts = copy_pairs(args.sentences, seed=SENTENCE_SEED)
        examples, targets = forced_examples(model, texts, args.batch_size)
        kept = {ex.id for ex in examples}
        texts = [t for i, t in enumerate(texts) if f"s{i}" in kept]
        tools = load_inseq(folder, args.methods, banned_columns(model)) if both else {}
    bs = args.batch_size
    batchings = [("inseq default (all at once)", None), (f"both {bs}", bs)] if both else [("", bs)]
    rows, checks = [], {}
    for label, inseq_bs in batchings:
        for method in args.methods:
            fns = {
                "attnstudy": lambda m=method: attnstudy_scores(
                    model, examples, m, bs, args.ig_steps
                )
            }
            if both:
                fns["inseq"] = lambda m=method, b=inseq_bs: inseq_scores(
                    tools[m], texts, targets, m, batch_size=b, ig_steps=args.ig_steps
                )
            t = common.interleaved(fns, repeats)
            row = {"batching": label, "method": method, "attnstudy s": t["attnstudy"].best}
            if both:
                ours = comparable(method, t["attnstudy"].result)
                diff = max_abs_diff(ours, t["inseq"].result)
                scale = max(float(a.abs().max()) for a in t["attnstudy"].result)
                row = {
                    "batching": label,
                    "method": method,
                    "inseq s": t["inseq"].best,
                    "attnstudy s": t["attnstudy"].best,
                    "inseq / attnstudy": t["inseq"].best / t["attnstudy"].best,
                    "max abs diff": diff,
                    "largest abs score": scale,
                    "relative diff": diff / scale,
                }
                checks[(label, method)] = diff
            else:
                row["scores"] = sum(a.numel() for a in t["attnstudy"].result)
            rows.append(row)
    defaults = default_differences(model, tools, examples, texts, targets, args) if both else []
    notes = verdicts(rows) if both else ["attnstudy's half alone (--tools attnstudy): no ratio"]
    if args.smoke:
        notes.append("smoke mode: tiny sizes; the ratios say nothing about the target")
    settings = {
        "model": "tiny Marian (hf_tiny, word tokenizer)" + (f" {args.model}" if args.model else ""),
        "sentences": len(examples),
        "left out (no <eos> in the greedy output)": args.sentences - len(examples),
        "target": "greedy output, forced",
        "attnstudy batch": bs,
        "IG steps": args.ig_steps,
        "IG baseline / occlusion replacement": "<unk> (every source position)",
        "threads": torch.get_num_threads(),
        "timing": f"best of {repeats} interleaved",
        "load average now (1/5/15 min)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    if both:
        from importlib.metadata import version

        settings["inseq"] = version("inseq")
        settings["captum"] = version("captum")
        settings["transformers"] = version("transformers")
    sections = [("", common.table(rows))]
    if defaults:
        sections.append(("With each tool's defaults (definitions differ)", common.table(defaults)))
    for method in args.profile:
        calls = {
            "attnstudy": lambda m=method: attnstudy_scores(model, examples, m, bs, args.ig_steps)
        }
        if both:
            calls["inseq"] = lambda m=method: inseq_scores(
                tools[m], texts, targets, m, batch_size=bs, ig_steps=args.ig_steps
            )
        for tool, fn in calls.items():
            sections.append((f"Profile: {tool}, {method}, batch {bs}", profile(fn)))
    common.report(
        "Side by side with inseq", args, settings, sections, [*notes, common.load_note(args)]
    )
    csv_path = args.csv or (CSV if both and not args.smoke and not args.no_results else None)
    if csv_path:
        write_csv(Path(csv_path), rows)
    return {"rows": rows, "checks": checks, "defaults": defaults, "sentences": len(examples)}


def default_differences(model, tools, examples, texts, targets, args) -> list[dict]:
    """How far the tools are apart at their defaults (inseq: probability target, ``</s>`` kept in
    the baseline; attnstudy: attention detached, log-probability, zero IG baseline, ``<pad>``
    occlusion)."""
    from attnstudy.analysis.attribution import attribute
    from attnstudy.analysis.batch import prepare_batches

    rows = []
    bs = args.batch_size
    for method in [m for m in args.methods if m != "attention"]:
        theirs = inseq_scores(
            tools[method],
            texts,
            targets,
            method,
            batch_size=bs,
            ig_steps=args.ig_steps,
            target=None,
        )
        ours = []
        for batch in prepare_batches(model, examples, model.vocab, model.vocab, "reference", bs):
            tr = batch.trace
            kw = {"n_steps": args.ig_steps} if method == "integrated_gradients" else {}
            grid = attribute(model, batch, method, **kw)
            for b in range(tr.src.size(0)):
                ours.append(grid[b, : int(tr.step_mask[b].sum()), : int(tr.src_lengths[b])])
        row = {
            "method": method,
            "max abs diff at defaults": max_abs_diff(comparable(method, ours), theirs),
            "largest abs score (inseq)": max(float(a.abs().max()) for a in theirs),
        }
        rows.append(row)
    return rows


def profile(fn, top: int = 12) -> str:
    """One call of ``fn`` under cProfile (the functions of most own time) and torch.profiler (the
    operators of most self CPU time), as a fenced text block."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.runcall(fn)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    total = stats.total_tt
    stats.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
        fn()
    ops = tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)
    return "\n".join(
        ["```", f"cProfile: {total:.2f} s in all", *lines[start:], "", ops.rstrip(), "```"]
    )


def write_csv(path: Path, rows: list[dict]) -> None:
    """The comparison table as CSV (numbers as the report prints them), for
    :mod:`attnstudy.report.results` to put into docs/benchmarks.md."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: common.fmt(v) for k, v in r.items()})
    print(f"wrote {path}", flush=True)


def verdicts(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        ratio, diff, rel = r["inseq / attnstudy"], r["max abs diff"], r["relative diff"]
        agree = "agree" if diff <= AGREE * max(1.0, r["largest abs score"]) else "DIFFER"
        out.append(
            f"{r['batching']}, {r['method']}: attnstudy {ratio:.1f}× inseq (target ≥ {TARGET:.0f}×, "
            f"{common.verdict(ratio, TARGET)}); max abs diff {diff:.1e}, relative to the largest "
            f"score {rel:.1e} ({agree} at {AGREE:.0e} × max(1, largest score))"
        )
    return out


def main(argv=None) -> dict:
    args = parse(argv)
    if args.tools == "both":
        require_inseq()  # before the model is built and the load has settled
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
