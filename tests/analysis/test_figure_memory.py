"""Saving the heatmaps figure again and again holds no memory per figure: a field case saw the
resident memory grow by ~9.5 MB per 100 saves of ``attention_heatmaps`` with unique titles.
Python's live small-object blocks (``sys.getallocatedblocks``: matplotlib's artists, text, caches
keyed by a text) between save 6 and save 26 must grow by less than :data:`BOUND_PER_FIGURE` a
figure; where they do, tracemalloc names the lines that hold them. The resident memory over 500
saves is benchmarks/bench_figure_memory.py's."""

from __future__ import annotations

import gc
import io
import sys
import tracemalloc

import numpy as np
import pytest
from attnstudy.analysis import figures

BOUND_PER_FIGURE = 100
"""Python blocks a saved and dropped figure may leave behind on average (measured on Python 3.11:
-5 to 13 blocks a figure; 16,224 a figure when each is kept alive; the field case's 95 kB a
figure is ~1,000 blocks of 100 B).
Counting blocks adds nothing to a save; tracing every allocation made each save ~5x slower."""


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


@pytest.mark.slow  # 26 saves: ~0.3 CPU s each on an idle 2-core machine
def test_saved_heatmaps_leave_no_memory_behind():
    rng = np.random.default_rng(0)
    for i in range(6):  # matplotlib's bounded caches fill here
        _save(i, rng)
    gc.collect()
    at_6 = sys.getallocatedblocks()
    for i in range(6, 26):
        _save(i, rng)
    gc.collect()
    slope = (sys.getallocatedblocks() - at_6) / 20
    assert slope < BOUND_PER_FIGURE, f"{slope:.0f} blocks per figure held\n{_holders(rng)}"


def _holders(rng: np.random.Generator) -> str:
    """The five lines whose allocations grew most over five more saves (tracemalloc)."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for i in range(26, 31):
            _save(i, rng)
        gc.collect()
        stats = tracemalloc.take_snapshot().compare_to(before, "traceback")[:5]
    finally:
        tracemalloc.stop()
    return "\n".join(str(s) for s in stats)
