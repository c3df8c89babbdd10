"""The example browser stays small on a translation-sized run: maps travel encoded
(``browser.encode_map``: thousandths as LEB128 integers, base64) and decode to exactly the
recorded values; a map equal to another travels once; single heads travel only where the run
analysed heads; the outcome column follows the task registry. The run is
``benchmarks.bench_browser.translation_run``: 300 verses of about 25 × 40 subwords, 3 layers ×
4 heads, word maps (the Greek–English per-layer study's page was 41 MB)."""

from __future__ import annotations

import base64
import json
import re

import pytest

from attnstudy.data import nt
from attnstudy.data.tasks import TOKEN_ERROR_RATE
from attnstudy.pages.browser import (
    browser_data,
    browser_html,
    decode_map,
    decode_record,
    encode_map,
    outcome_of,
    page_record,
)
from benchmarks.bench_browser import bytes_by_key, page_of, translation_run


def _embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="data">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def test_encoding_known_bytes():
    # thousandths 0, 1, 128, none, −1, 1000 → zigzag + 1: 1, 3, 257, 0, 2, 2001 → LEB128
    enc = encode_map([[0.0, 0.001, 0.128], [None, -0.001, 1.0]])
    assert enc["shape"] == [2, 3]
    assert base64.b64decode(enc["q"]) == bytes([0x01, 0x03, 0x81, 0x02, 0x00, 0x02, 0xD1, 0x0F])
    assert decode_map(enc) == [[0.0, 0.001, 0.128], [None, -0.001, 1.0]]


def test_round_trip_is_exact_for_recorded_values():
    values = [
        [[0.333, 0.667, 0.0], [0.5, 0.25, 0.125]],
        [[123.456, 70000.001, -2.5], [float("nan"), 0.999, 1e-3]],
    ]
    back = decode_map(encode_map(values))
    assert back[0] == values[0]
    assert back[1] == [[123.456, 70000.001, -2.5], [None, 0.999, 0.001]]
    # a missing row (no adversarial attention within ε at that step) is a row of missing values
    assert decode_map(encode_map([[0.1, 0.2], None])) == [[0.1, 0.2], [None, None]]
    assert decode_map(encode_map([])) == []
    with pytest.raises(ValueError, match="differ in shape"):
        encode_map([[0.1, 0.2], [0.3]])
    with pytest.raises(ValueError, match="differ in shape"):
        encode_map([[0.1, 0.2], [0.3, [0.4]]])
    with pytest.raises(ValueError, match="cannot travel"):
        encode_map([[1e13]])


@pytest.fixture(scope="module")
def run():
    return translation_run(3)


@pytest.mark.slow  # about 8 s of CPU: 300 verses built, encoded and decoded by the plain loop
def test_translation_page_is_small_and_decodes_to_the_records():
    records, steps, predictions = translation_run(300)
    page = page_of(records, steps, predictions)
    size = len(page.encode())
    # 41 MB before (every head, every map as JSON numbers); the target was about 5 MB
    assert size < 5_000_000, size
    by_key = bytes_by_key(page)
    assert by_key["records.attention"] < 0.4 * size  # 1.4 bytes a weight, not 6
    data = _embedded(page)
    assert data["meta"]["heads_left_out"] is True
    assert len(data["examples"]) == 900  # 300 verses × 3 layers
    for rec in records:
        got = data["records"][rec["id"]]
        # heads analysed jointly: no single-head maps; the reference attention is the analysed
        # layer's map (reference prefix), carried once
        assert "heads" not in got and "heads" not in got["words"]
        assert got["reference_attention"] == {"same": ["attention", 2]}
        assert got["reference_words"]["attention"] == {"same": ["words", "attention", 2]}
        want = {k: v for k, v in rec.items() if k != "heads"}
        want["words"] = {k: v for k, v in rec["words"].items() if k != "heads"}
        back = decode_record(got)
        for key, value in want.items():
            assert back[key] == value, key  # exactly the recorded numbers


def test_single_heads_travel_where_the_run_analysed_heads(run):
    records, steps, _ = run
    rec = records[0]
    one = steps[steps["example_id"] == rec["id"]].assign(head=1)  # a unit of one head
    data = browser_data([rec | {"head": 1}], one, meta={"prefix": "reference"})
    got = data["records"][rec["id"]]
    assert data["meta"]["heads_left_out"] is False
    assert decode_record(got)["heads"] == rec["heads"]
    assert decode_record(got)["words"]["heads"] == rec["words"]["heads"]
    # the reference attention (the heads' mean) is its own map here only if it matches none
    assert page_record(rec, heads=True)["reference_attention"] == {"same": ["attention", 2]}


def test_outcome_column_follows_the_task_registry(run):
    records, steps, predictions = run
    # a translation task reports no exact match: the column is the token error rate
    assert outcome_of(nt.TASK) == {
        "key": "token_error_rate",
        "label": TOKEN_ERROR_RATE.label,
        "kind": "rate",
        "unit": TOKEN_ERROR_RATE.unit,
    }
    data = browser_data(
        records, steps, predictions=predictions, meta={"prefix": "reference"}, task=nt.TASK
    )
    p = predictions.set_index("example_id")
    for row in data["examples"]:
        want = p.loc[row["id"], "edit_distance"] / p.loc[row["id"], "reference_length"]
        assert row["token_error_rate"] == pytest.approx(want, abs=5e-5)
        assert "correct" not in row
    page = browser_html(data)
    assert 'id="wrong"' not in page  # no "only incorrect" filter: every verse would be one
    # tasks that report exact match (and a task name no registry knows) keep "correct?"
    for task in ("copy", "g2p", None, "no-such-task"):
        assert outcome_of(task)["key"] == "correct"
    copy = browser_data(records, steps, predictions=predictions, meta={"prefix": "reference"})
    assert [row["correct"] for row in copy["examples"]] == [False] * 9
    assert 'id="wrong"' in browser_html(copy)
