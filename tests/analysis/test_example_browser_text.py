"""How the example browser's list shows texts and how its header reads (issue 64, item 1): a
character task's texts as one string (a space token as ␣), other tasks' tokens separated by
spaces; the predictions table's joined hypothesis split back into its tokens, space tokens
included; the header's sentences separated; a map scaled per row described without a unit.
The layout itself is checked in a real browser: tests/ui/test_browser.py."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from attnstudy.pages.browser import (
    SPACE,
    browser_data,
    browser_html,
    joined_tokens,
    list_text,
    text_kinds,
)


@pytest.mark.parametrize(
    "tokens",
    [
        ["a", "b", "c"],
        ["m", "a", "i", " ", "3"],
        [" ", "x", " "],
        ["1", " ", " ", "2"],
        ["9", "6", "<bos>", "4"],
        ["AH0", "K", "T"],
        [" "],
        [],
    ],
)
def test_a_joined_hypothesis_splits_back_into_its_tokens(tokens):
    assert joined_tokens(" ".join(tokens)) == tokens


def _record(eid, source, reference, rows):
    return {"id": eid, "source": source, "reference": reference, "rows": rows, "prefix": "greedy"}


def test_text_kinds_characters_words_and_special_tokens():
    chars = [_record("d/0", list("mai 3"), list("05-03"), [*"05-0", "<bos>", "<eos>"])]
    assert text_kinds(chars) == {"source": "chars", "target": "chars"}
    g2p = [_record("g/0", list("cat"), ["K", "AE1", "T"], ["K", "AE1", "T", "<eos>"])]
    assert text_kinds(g2p) == {"source": "chars", "target": "words"}
    words = [_record("w/0", ["five", "hundred"], ["5", "0", "0"], ["5", "<eos>"])]
    assert text_kinds(words) == {"source": "words", "target": "chars"}
    assert text_kinds([]) == {"source": "words", "target": "words"}
    subwords = [_record("nt/0", ["ἐν"], ["I", "n"], ["I", "<eos>"]) | {"words": {}}]
    assert text_kinds(subwords) == {"source": "words", "target": "words"}
    assert list_text([*"mai", " ", "3"], "chars") == f"mai{SPACE}3"
    assert list_text(["five", "hundred"], "words") == "five hundred"


def test_a_character_task_lists_one_string_per_text_and_its_prediction_split_right():
    """The prediction of the predictions table (tokens joined by spaces, a space token among
    them) is listed as the model wrote it: ``3␣mai``, not ``3   m a i``."""
    rec = _record("d/0", [*"3", " ", *"mai"], [*"05-03"], [*"05-04", "<eos>"])
    predictions = pd.DataFrame(
        [
            {
                "example_id": "d/0",
                "hypothesis": " ".join([*"3", " ", *"mai"]),
                "correct": False,
                "edit_distance": 5,
                "reference_length": 5,
            }
        ]
    )
    data = browser_data([rec], None, predictions=predictions, meta={"title": "dates"})
    (row,) = data["examples"]
    assert data["text"] == {"source": "chars", "target": "chars"}
    assert (row["source"], row["reference"], row["prediction"]) == (
        f"3{SPACE}mai",
        "05-03",
        f"3{SPACE}mai",
    )
    # without a predictions table, the greedy rows (less <eos>) as one string
    (row,) = browser_data([rec], None, meta={"title": "dates"})["examples"]
    assert row["prediction"] == "05-04" and row["correct"] is False


def test_the_header_reads_as_separate_sentences():
    """The header ran "(TVD).Permutation scores" together, and began ". 8 analysed" without a
    run id (the template's block tags ate the newlines between sentences)."""
    rec = _record("c/0", list("ab"), list("ab"), ["a", "b", "<eos>"])
    page = browser_html(
        browser_data(
            [rec],
            None,
            meta={"title": "t", "eps": 0.05, "n_permutations": 50},
        )
    )
    header = re.sub(r"<[^>]+>", "", page[page.index('<p class="meta">') : page.index("</p>")])
    text = " ".join(header.split())
    assert text.startswith("1 analysed test examples.")
    assert "within ε = 0.05 (TVD). Permutation scores use P = 50" in text
    assert "per step. Layers and heads" in text
    assert not re.search(r"[^\s.]\.[A-Z]", text), text
    with_run = browser_html(
        browser_data([rec], None, meta={"title": "t", "run_id": "r1", "model_run_id": "m1"})
    )
    assert "Ablation run <code>r1</code> of model run <code>m1</code>.\n1 analysed" in with_run


def test_a_map_scaled_per_row_gives_no_unit_to_the_scaled_numbers():
    """The |gradient × input| map was captioned "(nats), scaled so each row's largest is 1": the
    colours are a ratio; the unit belongs to the hovered, unscaled value."""
    from attnstudy.analysis import catalogue

    maps = {m.key: m for c in catalogue.captures().values() for m in c.maps}
    assert maps["gradient"].caption == (
        "first-order importance of each source token, each row scaled so its largest is 1 "
        "(no unit); hover a cell for the unscaled value, in nats"
    )
    for m in maps.values():
        if m.scale == "row":
            assert "scaled so its largest is 1" in m.caption and "hover a cell" in m.caption
            assert "(nats)" not in m.caption
