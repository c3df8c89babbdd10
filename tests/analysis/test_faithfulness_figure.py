"""The faithfulness figure draws each model's interval on that model's bar, also where a model
lacks a ranking (the ``none`` baseline has no attention ranking)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")

RANKINGS = ("attention", "input_x_gradient", "leave_one_out", "random")


def _steps() -> pd.DataFrame:
    """Two models, 30 examples of 4 steps: ``with-attention`` has every ranking, ``no-attention``
    no attention ranking (NaN); each ranking's AOPC is a constant apart from small seeded noise, so
    each bar's interval lies tightly around its own value and far from every other bar's."""
    rng = np.random.default_rng(0)
    level = {"attention": 0.2, "input_x_gradient": 0.4, "leave_one_out": 0.6, "random": 0.8}
    rows = []
    for variant, shift in (("with-attention", 0.0), ("no-attention", 0.05)):
        for ex in range(30):
            for step in range(4):
                row = {"variant": variant, "example_id": f"e{ex}", "step": step}
                for r in RANKINGS:
                    for mode in ("comprehensiveness", "sufficiency"):
                        value = level[r] + shift + rng.normal(0, 0.005)
                        if variant == "no-attention" and r == "attention":
                            value = np.nan
                        row[f"faithfulness_{mode}_{r}"] = value
                rows.append(row)
    return pd.DataFrame(rows)


def test_each_interval_sits_on_its_own_bar_when_a_model_lacks_a_ranking():
    from attnstudy.analysis.figures.faithfulness import faithfulness_aopc

    fig = faithfulness_aopc(_steps())
    for ax in fig.axes[:2]:
        bars = [b for c in ax.containers for b in c if np.isfinite(b.get_width())]
        lines = [ln for ln in ax.lines if len(set(ln.get_xdata())) == 2]  # not the x = 0 rule
        # every (model, ranking) with a value: 4 + 3
        assert len(bars) == 7 and len(lines) == 7
        for ln in lines:
            low, high = sorted(ln.get_xdata())
            y = ln.get_ydata()[0]
            (bar,) = [b for b in bars if b.get_y() <= y <= b.get_y() + b.get_height()]
            assert low <= bar.get_width() <= high, (bar.get_width(), low, high)
            assert high - low < 0.02
