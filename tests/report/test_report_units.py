"""The report says which unit of cross-attention a model's numbers are: the ablation run's
``ablation.primary_unit`` tag, or for a run stored without it, the unit read from its per-step
table (the first unit where heads were analysed one at a time before the plain keys held all
heads)."""

from __future__ import annotations

import pandas as pd

from attnstudy.report.store import ModelEntry, StudyData
from attnstudy.report.tables import headline_unit, units_line


def _entry(variant: str, attention: str = "multihead", **kw) -> ModelEntry:
    return ModelEntry(
        variant=variant,
        task="copy",
        attention=attention,
        flow="transformer",
        seed="1",
        model_run_id=f"m-{variant}",
        model_status="FINISHED",
        config=variant.removesuffix(" seed2"),
        ablation_run_id=f"a-{variant}",
        ablation_status="FINISHED",
        **kw,
    )


def _steps(units: list[tuple[int, int]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"example_id": "e", "prefix": "greedy", "layer": layer, "head": head, "step": 0}
            for layer, head in units
        ]
    )


def test_the_tag_names_the_unit_and_a_stored_table_stands_in_for_it():
    tagged = _entry("t", primary_unit="layer 2 of 2, all heads", steps=_steps([(1, -1)]))
    assert headline_unit(tagged) == "layer 2 of 2, all heads"
    joint = _entry("j", steps=_steps([(0, -1), (1, -1)]))  # layers = "each", heads jointly
    assert headline_unit(joint) == "layer 2, all heads"
    at_once = _entry("a", steps=_steps([(-1, -1)]))  # layers = "all"
    assert headline_unit(at_once) == "all layers at once, all heads"
    # heads one at a time, stored before the top layer's heads were analysed jointly too: the
    # plain keys held the first unit
    heads = _entry("h", steps=_steps([(0, 0), (0, 1), (1, 0), (1, 1)]))
    assert headline_unit(heads) == "layer 1, head 1"
    assert headline_unit(_entry("n", attention="none", steps=_steps([(0, -1)]))) is None


def test_models_are_grouped_by_unit_and_their_seeds_named_once():
    entries = [
        _entry("copy rnn", primary_unit="layer 1 of 1, all heads"),
        _entry("copy rnn seed2", primary_unit="layer 1 of 1, all heads"),
        _entry("copy transformer", primary_unit="layer 2 of 2, all heads"),
        _entry("copy none", attention="none"),
    ]
    data = StudyData("copy", "1", "s", entries, pd.DataFrame(), "")
    assert units_line(data) == (
        "copy rnn: layer 1 of 1, all heads; copy transformer: layer 2 of 2, all heads"
    )
    data.entries = entries[:2]
    assert units_line(data) == "layer 1 of 1, all heads for every model with attention"
    data.entries = entries[3:]
    assert units_line(data) is None
