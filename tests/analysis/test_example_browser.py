"""The example browser's data and page: one row per analysed example and unit, each example's
per-step numbers those of the per-step table for the unit its matrices come from, the JSON
embedded (no external asset), and small enough for 200 examples (a translation-sized run:
test_example_browser_size.py)."""

from __future__ import annotations

import json
import re

import pytest
from analysis_testkit import FAST_ABLATIONS, VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis import figures
from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.analysis.heatmaps import Recorder
from attnstudy.analysis.suite import run_suite

from attnstudy.pages.browser import browser_data, browser_html, step_columns


def _run(model, examples, **cfg):
    cfg = AblationConfig(
        **{"bootstrap_resamples": 20, "seed": 3, "ablations": FAST_ABLATIONS, "n_examples": 500}
        | cfg
    )
    rec = Recorder(cfg.prefix)
    res = run_suite(model, examples, VOCAB, VOCAB, cfg, progress=False, batch_size=8, recorder=rec)
    return res, rec.result()


def _embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


@pytest.mark.parametrize(
    ("layers", "heads", "unit"),
    # the recorded unit is the plain keys': the top layer with all heads, also with heads = "each"
    [("each", "all", (1, -1)), ("each", "each", (1, -1)), ("all", "all", (-1, -1))],
)
def test_records_and_step_numbers_come_from_one_unit(layers, heads, unit):
    model = tiny_model("multihead", "transformer")
    examples = make_examples(6)
    res, records = _run(model, examples, layers=layers, heads=heads)
    assert {(r["layer"], r["head"]) for r in records} == {unit}
    data = browser_data(records, res.table, examples=res.examples, meta={"title": "t"})
    units = {(row["layer"], row["head"]) for row in data["examples"]}
    assert unit in units and len(data["examples"]) == len(examples) * len(units)
    table = res.table
    for rec in records:
        rows = table[
            (table["example_id"] == rec["id"])
            & (table["prefix"] == "greedy")
            & (table["layer"] == unit[0])
            & (table["head"] == unit[1])
        ].set_index("step")
        values = data["records"][rec["id"]]["step_values"]
        for col, label in step_columns().items():
            if col not in table.columns:
                continue
            expected = [rows[col].get(t) for t in rec["steps"]]
            got = values[label]
            assert len(got) == len(expected)
            for g, e in zip(got, expected):
                assert (g is None and (e is None or e != e)) or g == pytest.approx(
                    float(e), abs=1e-4
                )
    # the heatmap figure draws the unit's layer (all layers at once: the last)
    fig = figures.example_heatmaps(records[:2], "t")
    assert len([im for ax in fig.axes for im in ax.images]) >= 2


def test_page_is_self_contained_and_small_for_200_examples():
    model = sharpen(tiny_model("additive"))
    examples = make_examples(200, seed=4)
    res, records = _run(model, examples)
    data = browser_data(
        records, res.table, examples=res.examples, meta={"title": "copy additive", "eps": 0.05}
    )
    page = browser_html(data)
    assert _embedded(page) == json.loads(json.dumps(data))  # the JSON round-trips whole
    assert len(data["examples"]) == 200 and len(data["records"]) == 200
    # nothing fetched: no external script, stylesheet, image or font
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    rest = page.replace('"http://www.w3.org/2000/svg"', "")  # the SVG namespace, not a URL fetched
    assert "http://" not in rest and "https://" not in rest
    assert len(page.encode()) < 300_000, len(page.encode())  # 220,463 bytes (maps encoded)
    # the list is sortable by every per-example column
    assert all(c["key"] in page for c in data["columns"])
    # a missing value says why: every column carries its reason, and some example lacks a value
    assert all(c["undefined"] for c in data["columns"])
    missing = [
        (e["id"], c["key"])
        for e in data["examples"]
        for c in data["columns"]
        if e[c["key"]] is None
    ]
    assert missing, "the 200 random examples include a one-position source (undefined τ, flips)"
    assert "n/a" in page and '"–"' not in page
