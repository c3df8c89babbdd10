"""Benchmark 8 — a pretrained Hugging Face model: the local-intervention fast path against a naive
re-decode.

On a tiny Marian model built and fine-tuned here (:func:`attnstudy.models.hf_tiny.build_tiny`,
word-level tokenizer; no download), P random replacement rows per step at the last layer (all
heads) for the copy sentences of the shipped example, computed two ways from one trace:

* **fast** — :meth:`attnstudy.models.hf.HFSeq2Seq.logits_given_attention`: one decoder call per
  step from the traced key/value cache, every (example, replacement) row of the step in one batch;
* **naive** — :func:`attnstudy.models.references.hf_logits_given_attention`: the whole model run again
  on the prefix for every (example, replacement, step), no cache.

They must agree to ≤ 1e-5. Target: naive / fast ≥ 10×.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_hf [--smoke]`` (needs the ``[hf]`` extra).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from . import common

TARGET = 10.0


def _batch(model, texts):
    from attnstudy.data.vocab import BOS_ID, EOS_ID, PAD_ID

    src = [model.vocab.encode(model.source_tokens(s)) for s in texts]
    tgt = [model.vocab.encode(model.target_tokens(s)) for s in texts]
    w, t_y = max(map(len, src)), max(map(len, tgt)) + 1
    return (
        torch.tensor([s + [PAD_ID] * (w - len(s)) for s in src]),
        torch.tensor([len(s) for s in src]),
        torch.tensor([[BOS_ID] + t + [PAD_ID] * (t_y - len(t) - 1) for t in tgt]),
        torch.tensor([t + [EOS_ID] + [PAD_ID] * (t_y - len(t) - 1) for t in tgt]),
    )


def run(args) -> dict:
    from attnstudy.models.hf import load_pretrained
    from attnstudy.models.hf_tiny import build_tiny, copy_pairs
    from attnstudy.models.references import hf_logits_given_attention

    n_words, p = (4, 3) if args.smoke else (32, 20)
    steps = 20 if args.smoke else 300
    repeats = args.repeats or (1 if args.smoke else 3)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_pretrained(
            build_tiny(Path(tmp) / "marian", family="marian", tokenizer="word", steps=steps)
        )
    texts = copy_pairs(n_words, seed=11)
    with torch.no_grad():
        tr = model.trace(*_batch(model, texts))
        g = torch.Generator().manual_seed(0)
        w = torch.rand(tr.attention.size(0), p, *tr.attention.shape[1:], generator=g)
        w = w.masked_fill(tr.pad_mask[:, None, None, None, :], 0.0)
        w = w / w.sum(-1, keepdim=True)
        timings = common.interleaved(
            {
                "fast": lambda: model.logits_given_attention(tr, w),
                "naive": lambda: hf_logits_given_attention(model, tr, w),
            },
            repeats,
            once=("naive",),
        )
    fast, naive = timings["fast"], timings["naive"]
    diff = float((fast.result - naive.result).abs().max())
    ratio = naive.best / fast.best
    real = int(tr.step_mask.sum())
    rows = [
        {
            "model": "marian L2H2 d32",
            "sentences": n_words,
            "steps": real,
            "replacements per step": p,
            "fast s": fast.best,
            "naive s": naive.best,
            "naive / fast": ratio,
            "max abs diff": diff,
        }
    ]
    notes = [
        f"naive/fast {ratio:.1f}× (target ≥ {TARGET:.0f}×, {common.verdict(ratio, TARGET)}); "
        f"max abs diff {diff:.1e} (target ≤ 1e-5, "
        f"{common.verdict(diff, 1e-5, higher_is_better=False)})"
    ]
    if args.smoke:
        notes.append("smoke mode: tiny sizes; the ratio says nothing about the target")
    common.report(
        "Hugging Face model: local intervention vs naive re-decode",
        args,
        {"threads": torch.get_num_threads(), "timing": f"best of {repeats} (naive once)"},
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows, "diff": diff, "ratio": ratio}


def main(argv=None) -> dict:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
