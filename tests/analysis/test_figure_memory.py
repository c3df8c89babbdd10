"""Saving the heatmaps figure again and again holds no memory per figure: a field case saw the
resident memory grow by ~9.5 MB per 100 saves of ``attention_heatmaps`` with unique titles.
Python's allocations (tracemalloc: matplotlib's artists, text, caches keyed by a text) between
save 6 and save 26 must grow by less than :data:`BOUND_PER_FIGURE` a figure; the resident
memory over 500 saves is benchmarks/bench_figure_memory.py's."""

from __future__ import annotations

import gc
import io
import tracemalloc

import numpy as np
import pytest
from attnstudy.analysis import figures

BOUND_PER_FIGURE = 8 * 1024
"""Bytes of traced memory a saved and dropped figure may leave behind on average (measured: 0.7 kB
a figure; 1.8 MB a figure when each is kept alive)."""


def _save(i: int, rng: np.random.Generator) -> None:
    n = 5  # a title and source tokens of its own: caches keyed by a text would grow
    fig = figures.attention_heatmaps(
        [
            {
                "title": f"model {i}: example {i}",
                "source": [f"s{i}.{j}" for j in range(n)],
                "target": [f"t{i}.{j}" for j in range(n - 1)] + ["<eos>"],
                "attention": rng.dirichlet(np.ones(n), n).round(3).tolist(),
                "adversarial": rng.dirichlet(np.ones(n), n).round(3).tolist(),
                "gold": [[j, j] for j in range(n - 1)],
            }
        ]
    )
    fig.savefig(io.BytesIO(), format="png", dpi=30)


@pytest.mark.slow  # 20 saves under tracemalloc: ~1.2 CPU s each on an idle 2-core machine
def test_saved_heatmaps_leave_no_memory_behind():
    rng = np.random.default_rng(0)
    for i in range(6):  # matplotlib's bounded caches fill here (untraced: 4x faster)
        _save(i, rng)
    gc.collect()
    tracemalloc.start()
    try:
        at_6 = tracemalloc.get_traced_memory()[0]
        before = tracemalloc.take_snapshot()
        for i in range(6, 26):
            _save(i, rng)
        gc.collect()
        slope = (tracemalloc.get_traced_memory()[0] - at_6) / 20
        held = ""
        if slope >= BOUND_PER_FIGURE:  # who holds it: the largest growths by line
            stats = tracemalloc.take_snapshot().compare_to(before, "traceback")[:5]
            held = "\n".join(str(s) for s in stats)
    finally:
        tracemalloc.stop()
    assert slope < BOUND_PER_FIGURE, f"{slope / 1024:.1f} kB per figure held\n{held}"
