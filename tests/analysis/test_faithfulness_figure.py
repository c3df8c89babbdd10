"""The faithfulness figure draws each model's interval on that model's bar, also where a model
lacks a ranking (the ``none`` baseline has no attention ranking)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest

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


def test_a_model_without_a_ranking_is_marked_n_a_with_the_reason_in_its_slot():
    """The ``none`` baseline has no attention ranking: its slot in the attention row says so,
    with the reason the ablation recorded, in both panels (no silent gap); the rankings are
    labelled by the registry."""
    from attnstudy.analysis.figures.faithfulness import faithfulness_aopc

    steps = _steps()
    steps.loc[steps["variant"] == "no-attention", "faithfulness_attention_reason"] = "no attention"
    fig = faithfulness_aopc(steps)
    for ax in fig.axes[:2]:
        assert [t.get_text() for t in ax.get_yticklabels()] == [
            "attention",
            "input × gradient",
            "leave-one-out",
            "random",
        ]
        (mark,) = [t for t in ax.texts if "n/a" in t.get_text()]
        assert mark.get_text().strip() == "n/a for no-attention: no attention"
        # the second hue slot of the first category: 0 − 0.4 + 1.5 × 0.4 = 0.2, where the
        # no-attention model's bars sit in the other rows
        assert mark.get_position()[1] == pytest.approx(0.2)
        (other,) = [
            b
            for c in ax.containers
            for b in c
            if np.isfinite(b.get_width())
            and 0.5 < b.get_y() + b.get_height() / 2 < 1.5
            and b.get_width() > 0.42  # input × gradient of the no-attention model (0.45)
        ]
        assert other.get_y() + other.get_height() / 2 == pytest.approx(1.2)


def test_without_a_recorded_reason_the_mark_says_undefined():
    from attnstudy.analysis.figures.faithfulness import faithfulness_aopc

    fig = faithfulness_aopc(_steps())
    texts = [t.get_text().strip() for t in fig.axes[0].texts if "n/a" in t.get_text()]
    assert texts == ["n/a for no-attention: undefined at every step"]
