"""Benchmark 11 — one long example: the whole default battery on a single source of L tokens.

One copy-task example of exactly L tokens (L = 125, 250, 500, 1000 by default), the reference
prefix (so the trace has L + 1 decoder steps whatever the weights), a randomly initialised model
of the quickstart's sizes (the cost of a step does not depend on the weights), batch size 1, one
thread, the default battery (every default ablation of the catalogue: J&W defaults P = 100,
K = 5; the adversarial search's Adam iterations are stated in the settings, its cost is linear in
them). Each length runs in its own child process (``bench_scaling``'s child), whose peak RSS is
the child's ``ru_maxrss`` from ``os.wait4``; target ≤ 2 GB at L = 1000.

Time: every ablation's time per decoder step and the log-log slope against L. A replacement of
step t (a permuted row, an erased position, a deleted token, an adversarial candidate) costs work
∝ T_x (the context over the source positions), and the ablations whose replacements per step are
themselves ∝ T_x (erasure until the flip, leave-one-out) or whose gradient at step t flows back
through all t earlier steps (gradient × input) have per-step cost ∝ L²; the table divides each
ablation's time by steps × replacements so the constant per replacement can be read off.

The time per decoder step at short sources (10 … 80 tokens, a batch of examples per length) and
the ablations whose replacements grow with the source against one batched forward over all their
replacements are ``bench_steps`` (``run_all --only steps``, in the default list).

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_long [--smoke] [--lengths 125,250]``.
"""

from __future__ import annotations

from . import common
from .bench_scaling import RSS_PEAK_TARGET_GB, copy_of_length, slope, spawn

DEFAULT_LENGTHS = [125, 250, 500, 1000]


def replacements(name: str, length: int, p: int, k: int, adv_steps: int) -> tuple[int, str]:
    """Replacements per decoder step of one ablation on a source of ``length`` tokens.

    Returns:
        (count, what a replacement is). Leave-one-out's deletions are an upper bound (one per
        run of equal tokens); erasure until the flip evaluates every prefix of every order
        (it does not stop at the flip): 4 rankings + ``n_random_orders`` random orders (the
        default 5), T_x − 1 prefixes each (counted in ``bench_steps``).
    """
    from attnstudy.analysis.ablations.erase_until_flip import RANKINGS, EraseUntilFlipParams

    orders = len(RANKINGS) - 1 + EraseUntilFlipParams().n_random_orders
    table = {
        "permutation": (p, "permuted row"),
        "permutation_global": (1, "free-running step"),
        "uniform": (1, "uniform row"),
        "erase_max": (1, "erased row"),
        "erase_until_flip": (
            orders * (length - 1),
            f"erased prefix ({orders} orders, T_x − 1 each)",
        ),
        "adversarial": (k * adv_steps, "candidate × Adam iteration"),
        "importance": (2 * length, "deleted token or gradient position"),
        "alignment": (1, "argmax link"),
    }
    return table.get(name, (1, "–"))


def run(args) -> dict:
    lengths = (
        [int(s) for s in args.lengths.split(",")]
        if args.lengths
        else ([6, 12] if args.smoke else DEFAULT_LENGTHS)
    )
    p_count = 3 if args.smoke else 100
    k = 5
    adv_steps = args.adv_steps or (3 if args.smoke else 100)
    model_cfg = dict(common.QUICKSTART_MODEL, attention=common.FLOWS[args.flow], flow=args.flow)
    cfg = {
        "n_permutations": p_count,
        "seed": 0,
        "bootstrap_resamples": 50 if args.smoke else 1000,
        "prefix": "reference",
        "adversarial": {"k": k, "steps": adv_steps},
    }
    rows = []
    for length in lengths:
        r = spawn(
            {
                "label": f"L={length}",
                "n": 1,
                "data": copy_of_length(length, 1),
                "model_dir": None,
                "model": model_cfg,
                "cfg": cfg,
                "threads": args.threads,
            }
        )
        r["length"] = length
        rows.append(r)
        print(
            f"L={length}: {r['wall']:.1f} s, peak RSS {r['peak_rss_kb'] / 1024:.0f} MB", flush=True
        )

    names = list(rows[0]["ablations"])
    time_rows, unit_rows, peak_rows = [], [], []
    for r in rows:
        length, steps = r["length"], r["steps"]
        time_rows.append(
            {
                "L": length,
                "steps": steps,
                "battery s": r["wall"],
                **{f"{a} s": r["ablations"][a] for a in names},
                "peak RSS MB": r["peak_rss_kb"] / 1024,
                "RSS at start MB": r["rss_before_kb"] / 1024,
            }
        )
        peaks = r.get("ablation_peak_rss_kb", {})
        # n/a: the ablation ended before the first sample
        peak_rows.append(
            {"L": length, **{f"{a} MB": peaks.get(a, float("nan")) / 1024 for a in names}}
        )
        unit = {"L": length}
        for a in names:
            n_rep, _ = replacements(a, length, p_count, k, adv_steps)
            unit[f"{a} µs"] = 1e6 * r["ablations"][a] / (steps * n_rep)
        unit_rows.append(unit)
    xs = [r["length"] for r in rows]
    slopes = {"battery": slope(xs, [r["wall"] for r in rows])}
    slopes |= {a: slope(xs, [r["ablations"][a] for r in rows]) for a in names}
    what = {a: replacements(a, lengths[-1], p_count, k, adv_steps) for a in names}
    peak_gb = max(r["peak_rss_kb"] for r in rows) / 2**20
    notes = [
        f"largest peak RSS {peak_gb:.2f} GB at L = {lengths[-1]} (target ≤ {RSS_PEAK_TARGET_GB} GB, "
        f"{common.verdict(peak_gb, RSS_PEAK_TARGET_GB, higher_is_better=False)})",
        "µs per replacement = ablation time / (decoder steps × replacements per step); "
        "replacements per step: "
        + "; ".join(
            f"{a}: {n if a not in ('erase_until_flip', 'importance') else '∝ T_x'} ({w})"
            for a, (n, w) in what.items()
        ),
        f"adversarial search at {adv_steps} Adam iterations (the default 500 is "
        f"{500 / adv_steps:.0f}× its time; cost is linear in the iterations)",
    ]
    if args.smoke:
        notes.append(
            "smoke mode: tiny lengths and settings; the slopes say nothing about the targets"
        )
    common.report(
        "One long example: the whole battery on a single source",
        args,
        {
            "lengths": ",".join(map(str, lengths)),
            "model": f"{args.flow} (random init, quickstart sizes)",
            "P": p_count,
            "K": k,
            "Adam iterations": adv_steps,
            "prefix": "reference",
            "threads": args.threads,
        },
        [
            ("Time and peak memory per length", common.table(time_rows)),
            ("Peak RSS while each ablation ran (sampled every 5 ms)", common.table(peak_rows)),
            (
                "µs per replacement (ablation time / (steps × replacements))",
                common.table(unit_rows),
            ),
            ("Log-log slope of time against L", common.table([slopes])),
        ],
        notes,
    )
    return {"rows": rows, "slopes": slopes, "peak_gb": peak_gb}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--lengths", default=None, help="comma-separated source lengths")
    p.add_argument("--flow", default="bahdanau", choices=sorted(common.FLOWS))
    p.add_argument("--adv-steps", type=int, default=None, help="Adam iterations (default 100)")
    args = p.parse_args(argv)
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
