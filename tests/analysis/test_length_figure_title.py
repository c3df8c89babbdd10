"""The accuracy-by-length figure names each panel as a task, never as a model: a TSV study with
the no-attention baseline titled its panel "tsv (none: the no-attention baseline)"."""

from __future__ import annotations

import pandas as pd
from attnstudy.analysis import figures


def test_each_panel_is_titled_by_its_task_and_the_baseline_is_named_in_the_legend():
    preds = pd.DataFrame(
        {
            "task": ["tsv"] * 6,
            "variant": ["tsv additive-bahdanau"] * 3 + ["tsv none-bahdanau"] * 3,
            "src_len": [3, 8, 12] * 2,
            "correct": [True, True, False, True, False, False],
        }
    )
    fig = figures.accuracy_by_length(preds)
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["task: tsv"]
    note = " ".join(fig.legends[0].get_title().get_text().split())
    assert note.endswith("models named none-…: the no-attention baseline")
    without = figures.accuracy_by_length(preds[preds["variant"] == "tsv additive-bahdanau"])
    assert "baseline" not in without.legends[0].get_title().get_text()
