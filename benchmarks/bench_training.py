"""Benchmark 6 — training throughput.

Target-side tokens per second (real tokens, the ``<eos>`` step included; padding not counted)
of the training step of :func:`attnstudy.models.training.train` (forward, summed cross-entropy,
backward, gradient clipping, Adam step) on G2P, for each decoder flow at the quickstart sizes,
with length-bucketed batches (``bucket_batches = true``, the default) against batches padded to
the longest sequence of a random set (``bucket_batches = false``). Epochs of the two batchings
alternate (interleaved) on the same model; the best epoch of each counts. The full-CMUdict epoch
time is the full training split's token count divided by the bucketed rate (``--full-epoch``
measures one real epoch instead).

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_training [--smoke] [--full-epoch]``.
"""

from __future__ import annotations

import time
from functools import partial

import torch
from torch import nn

from attnstudy.api import load_data
from attnstudy.data.batching import make_batches
from attnstudy.data.vocab import PAD_ID
from attnstudy.models import build_model

from . import common


def epoch(
    model,
    optimizer,
    examples,
    src_vocab,
    tgt_vocab,
    batch_size: int,
    bucket: bool,
    seed: int,
    clip: float = 1.0,
) -> dict:
    """One training epoch as in :func:`attnstudy.models.training.train`; returns tokens, padded cells, seconds."""
    batches = make_batches(
        examples, src_vocab, tgt_vocab, batch_size, shuffle=True, seed=seed, bucket=bucket
    )
    model.train()
    tokens = cells = 0
    t0 = time.perf_counter()
    for batch in batches:
        logits = model(batch.src, batch.src_lengths, batch.tgt_in)
        n_tok = int((batch.tgt_out != PAD_ID).sum())
        loss = nn.functional.cross_entropy(
            logits.transpose(1, 2), batch.tgt_out, ignore_index=PAD_ID, reduction="sum"
        )
        optimizer.zero_grad(set_to_none=True)
        (loss / n_tok).backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        tokens += n_tok
        cells += batch.tgt_out.numel()
    secs = time.perf_counter() - t0
    model.eval()
    return {"tokens": tokens, "cells": cells, "seconds": secs, "batches": len(batches)}


def _epoch_seeded(model, opt, examples, src_vocab, tgt_vocab, bs, bucket, counter):
    return epoch(model, opt, examples, src_vocab, tgt_vocab, bs, bucket, next(counter))


def run(args) -> dict:
    n_train = 200 if args.smoke else 8000
    repeats = args.repeats or (2 if args.smoke else 3)
    rows, notes = [], []
    full_spec = common.run_spec("bahdanau", n_train=None, n_test=1000)
    full_splits, _, _ = load_data(full_spec)
    full_tokens = sum(len(ex.tgt) + 1 for ex in full_splits.train)
    out = {}
    for flow in common.FLOWS:
        spec = common.run_spec(flow, n_train=n_train, n_dev=20 if args.smoke else 200, n_test=100)
        splits, src_vocab, tgt_vocab = load_data(spec)
        torch.manual_seed(spec.seed)
        model = build_model(spec.model, len(src_vocab), len(tgt_vocab))
        opt = torch.optim.Adam(model.parameters(), lr=spec.training.lr)
        bs = spec.training.batch_size
        counter = iter(range(10**6))
        res = common.interleaved(
            {
                kind: partial(
                    _epoch_seeded,
                    model,
                    opt,
                    splits.train,
                    src_vocab,
                    tgt_vocab,
                    bs,
                    kind == "bucketed",
                    counter,
                )
                for kind in ("bucketed", "padded")
            },
            repeats,
        )
        rates = {}
        for kind in ("bucketed", "padded"):
            r = res[kind].result
            rates[kind] = r["tokens"] / res[kind].best
            rows.append(
                {
                    "flow": f"{flow} ({common.FLOWS[flow]})",
                    "batching": kind,
                    "words": len(splits.train),
                    "batches": r["batches"],
                    "real tokens": r["tokens"],
                    "padding share": 1 - r["tokens"] / r["cells"],
                    "best epoch s": res[kind].best,
                    "tokens / s": rates[kind],
                }
            )
        full_s = full_tokens / rates["bucketed"]
        measured = None
        if args.full_epoch:
            measured = epoch(model, opt, full_splits.train, src_vocab, tgt_vocab, bs, True, 0)[
                "seconds"
            ]
        out[flow] = {
            "bucketed": rates["bucketed"],
            "padded": rates["padded"],
            "full_epoch_s": full_s,
            "measured_full_epoch_s": measured,
        }
        notes.append(
            f"{flow}: bucketed / padded throughput {rates['bucketed'] / rates['padded']:.2f}×; "
            f"full-CMUdict epoch ({len(full_splits.train):,} words, {full_tokens:,} target tokens) "
            f"≈ {full_s:.0f} s estimated from the bucketed rate"
            + (f", {measured:.0f} s measured" if measured is not None else "")
        )
    notes.append(
        "layer sizes from the subset's vocabularies (the full split's differ by a few symbols at most)"
    )
    if args.smoke:
        notes.append("smoke mode: tiny subset; rates say nothing about a real run")
    common.report(
        "Training throughput: bucketed vs padded batches",
        args,
        {
            "task": "g2p",
            "train words": n_train,
            "batch size": 64,
            "threads": torch.get_num_threads(),
            "timing": f"best of {repeats} interleaved epochs",
        },
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows, "flows": out}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument(
        "--full-epoch", action="store_true", help="also time one real full-CMUdict epoch per flow"
    )
    args = p.parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
