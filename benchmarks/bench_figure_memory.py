"""Benchmark — resident memory while the heatmaps figure is saved over and over.

One process builds :func:`attnstudy.analysis.figures.attention_heatmaps` for one example (a
G2P-sized word: 8 source letters, 7 phones and ``<eos>``, its attention, an adversarial row and
gold links) with a title of its own each time, saves it as PNG (``Figure.savefig``, as
``Tracker.log_figure`` and the report do) and drops it: 500 times. Every 50 saves it reads the
process's resident memory from ``/proc/self/status`` — ``VmRSS`` and its parts ``RssAnon``
(heap and anonymous maps: what a holder of figures grows) and ``RssFile`` (mapped files:
libraries paged in) — and the number of objects the garbage collector tracks. Nothing is
collected by hand: the curve is what a long-running process (a report of many models, a
server) sees.

Target: at most 1 MB of ``VmRSS`` per 100 saves from save 100 to the last (the first 100 fill
matplotlib's and the allocator's caches). A field case had measured +9.5 MB per 100 saves.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_figure_memory [--saves 500] [--every 50]``.
"""

from __future__ import annotations

import gc
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from . import common

TARGET_MB_PER_100 = 1.0
"""Largest acceptable growth of ``VmRSS`` per 100 saves after the first 100 (MB)."""


def status_mb() -> dict[str, float]:
    """``VmRSS``, ``RssAnon`` and ``RssFile`` of this process from ``/proc/self/status`` (MB)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def example(i: int, rng: np.random.Generator) -> dict:
    """The ``i``-th heatmap record: a word of 8 letters, 7 phones and ``<eos>``, its attention
    (Dirichlet rows), an adversarial attention and gold links, titled ``model i: example i``."""
    n = 8
    return {
        "title": f"model {i}: example {i}",
        "source": list("abstract"),
        "target": ["AE", "B", "S", "T", "R", "AE", "K", "<eos>"],
        "attention": rng.dirichlet(np.ones(n), n).round(3).tolist(),
        "adversarial": rng.dirichlet(np.ones(n), n).round(3).tolist(),
        "gold": [[j, j] for j in range(n - 1)],
    }


def curve(saves: int, every: int, out: Path) -> list[dict[str, object]]:
    """Save ``saves`` heatmap figures to ``out``; a row after the first save and every
    ``every`` saves: the count, ``VmRSS`` / ``RssAnon`` / ``RssFile`` (MB), the objects the
    garbage collector tracks and the seconds since the first save."""
    from attnstudy.analysis import figures

    rng = np.random.default_rng(0)
    rows, t0 = [], time.perf_counter()
    for i in range(1, saves + 1):
        fig = figures.attention_heatmaps([example(i, rng)])
        fig.savefig(out, format="png")
        del fig
        if i == 1 or i % every == 0 or i == saves:
            mem = status_mb()
            rows.append(
                {
                    "saves": i,
                    "VmRSS MB": mem["VmRSS"],
                    "RssAnon MB": mem["RssAnon"],
                    "RssFile MB": mem["RssFile"],
                    "gc objects": len(gc.get_objects()),
                    "s": time.perf_counter() - t0,
                }
            )
            print(" ".join(f"{k} {common.fmt(v)}" for k, v in rows[-1].items()), flush=True)
    return rows


def growth_per_100(rows: list[dict[str, object]], key: str, start: int = 100) -> float:
    """Growth of ``key`` per 100 saves from the row at ``start`` saves (the first row when the
    run is shorter) to the last row; NaN with fewer than two rows."""
    later = [r for r in rows if r["saves"] >= start] or rows
    first, last = later[0], rows[-1]
    if last["saves"] == first["saves"]:
        return float("nan")
    return 100 * (last[key] - first[key]) / (last["saves"] - first["saves"])


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--saves", type=int, default=None, help="figures saved (500; smoke: 20)")
    p.add_argument("--every", type=int, default=None, help="a row every N saves (50; smoke: 5)")
    args = p.parse_args(argv)
    common.setup(args)
    saves = args.saves or (20 if args.smoke else 500)
    every = args.every or (5 if args.smoke else 50)
    with tempfile.TemporaryDirectory(prefix="attnstudy-figmem-") as tmp:
        rows = curve(saves, every, Path(tmp) / "heatmaps.png")
    start = 100 if saves > 100 else 1
    per_100 = {k: growth_per_100(rows, k, start) for k in ("VmRSS MB", "RssAnon MB", "RssFile MB")}
    notes = [
        f"VmRSS grows {per_100['VmRSS MB']:.2f} MB per 100 saves from save {start} to save "
        f"{rows[-1]['saves']} (RssAnon {per_100['RssAnon MB']:.2f}, RssFile "
        f"{per_100['RssFile MB']:.2f}); target ≤ {TARGET_MB_PER_100:g} MB: "
        + (
            common.verdict(per_100["VmRSS MB"], TARGET_MB_PER_100, higher_is_better=False)
            if saves > 100
            else "not judged (no save past the first 100, which fill the caches)"
        ),
        common.load_note(args),
        f"pid {os.getpid()}; nothing collected by hand (gc at its own thresholds)",
    ]
    common.report(
        "Figure memory: resident memory over repeated heatmap saves",
        args,
        {"saves": saves, "row every": every, "figure": "attention_heatmaps, one example, PNG"},
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows, "per_100": per_100}


if __name__ == "__main__":
    main()
