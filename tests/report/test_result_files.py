"""``report --results`` of a study whose models have different tasks: the models table of a G2P
model (PER) and a Greek–English one (WER, BLEU) failed with "dict contains fields not in
fieldnames" (the header was the first row's keys); now one header holds every column, each where
its rows have it, and a row without a column has it empty."""

from __future__ import annotations

import csv
import io

from attnstudy.report.results import columns_of, result_files


def test_rows_of_two_tasks_share_one_header_with_each_column_in_place():
    g2p = {"model": "g2p t", "dev PER %": "9.1", "test PER %": "9.5", "beam": "1", "run": "a"}
    nt = {
        "model": "nt t",
        "dev WER %": "80.1",
        "dev PER %": "70.2",
        "test WER %": "81.0",
        "test PER %": "71.3",
        "beam": "5",
        "BLEU": "11.3 [10.4, 12.1]",
        "run": "b",
    }
    assert columns_of([g2p, nt]) == [
        "model",
        "dev WER %",
        "dev PER %",
        "test WER %",
        "test PER %",
        "beam",
        "BLEU",
        "run",
    ]
    (content,) = result_files("mixed", {"-models": [g2p, nt]}).values()
    rows = list(csv.DictReader(io.StringIO(content.decode("utf-8"))))
    assert rows[0]["test WER %"] == "" and rows[0]["BLEU"] == "" and rows[0]["test PER %"] == "9.5"
    assert rows[1] == nt
