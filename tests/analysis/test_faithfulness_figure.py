"""The faithfulness figure draws each model's interval on that model's bar, also where a model
lacks a ranking (the ``none`` baseline has no attention ranking)."""

from __future__ import annotations

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

RANKINGS = ("attention", "input_x_gradient", "leave_one_out", "random")


def _steps(soft: bool = False) -> pd.DataFrame:
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
                        if soft:  # soft erasure: the reverse order, 1 − the hard level
                            row[f"faithfulness_soft_{mode}_{r}"] = (
                                np.nan if np.isnan(value) else 1.0 - value
                            )
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


def _bars(ax) -> dict[str, float]:
    """Each drawn bar's width by its ranking label (one model per category in these tests)."""
    names = [t.get_text() for t in ax.get_yticklabels()]
    out: dict[str, list[float]] = {}
    for c in ax.containers:
        for b in c:
            if np.isfinite(b.get_width()):
                y = b.get_y() + b.get_height() / 2
                out.setdefault(names[int(round(y))], []).append(b.get_width())
    return {k: v[0] for k, v in out.items()}


def test_soft_erasure_is_drawn_beside_deletion_where_it_was_measured():
    """With soft columns, a second row of panels draws Soft-NC and Soft-NS of the same rankings
    (their own values, intervals on their bars, the n/a mark for the missing ranking); without
    them the figure keeps deletion's two panels."""
    from attnstudy.analysis.figures.faithfulness import faithfulness_aopc

    assert len(faithfulness_aopc(_steps()).axes) == 2
    steps = _steps(soft=True)
    fig = faithfulness_aopc(steps)
    assert len(fig.axes) == 4
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == [
        "comprehensiveness (AOPC)",
        "sufficiency (AOPC)",
        "soft comprehensiveness (Soft-NC)",
        "soft sufficiency (Soft-NS)",
    ]
    hard, soft = _bars(fig.axes[0]), _bars(fig.axes[2])
    # the first bar of each category is the with-attention model's: soft = 1 − hard
    for r in ("input × gradient", "leave-one-out", "random"):
        assert soft[r] == pytest.approx(1.0 - hard[r], abs=0.01)
    assert soft["attention"] == pytest.approx(0.8, abs=0.01)
    for ax in fig.axes[2:]:
        lines = [ln for ln in ax.lines if len(set(ln.get_xdata())) == 2]
        assert len(lines) == 7  # 4 + 3 intervals, each on its bar
        texts = [t.get_text().strip() for t in ax.texts if "n/a" in t.get_text()]
        assert texts == ["n/a for no-attention: undefined at every step"]


def test_a_model_without_embeddings_says_so_in_the_soft_panels():
    from attnstudy.analysis.figures.faithfulness import faithfulness_aopc

    steps = _steps(soft=True)
    cols = [c for c in steps.columns if c.startswith("faithfulness_soft_")]
    steps.loc[steps["variant"] == "no-attention", cols] = np.nan
    steps.loc[steps["variant"] == "no-attention", "faithfulness_soft_reason"] = "no embeddings"
    fig = faithfulness_aopc(steps)
    texts = [t.get_text().strip() for t in fig.axes[2].texts if "n/a" in t.get_text()]
    assert texts == ["n/a for no-attention: no embeddings"] * 4  # a slot of every ranking
    hard = [
        (t.get_text().strip(), t.get_position()[1])
        for t in fig.axes[0].texts
        if "n/a" in t.get_text()
    ]
    soft = [(t.get_position()[1]) for t in fig.axes[2].texts if "n/a" in t.get_text()]
    # the model's slot: the second of two in each category, as in deletion's panel
    assert soft == pytest.approx([i + 0.2 for i in range(4)])
    assert hard == [("n/a for no-attention: undefined at every step", pytest.approx(0.2))]
    widths = _bars(fig.axes[2])
    assert widths["leave-one-out"] == pytest.approx(0.4, abs=0.01)  # with-attention's own
    # its bars keep the first of the two slots (not the whole category, over the marks)
    drawn = [b for c in fig.axes[2].containers for b in c if b.get_width() > 0]
    assert len(drawn) == 4
    for i, b in enumerate(sorted(drawn, key=lambda b: b.get_y())):
        assert b.get_height() == pytest.approx(0.4)
        assert b.get_y() + b.get_height() / 2 == pytest.approx(i - 0.2)
