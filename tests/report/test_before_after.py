"""Two versions of a result table side by side (docs/findings.md's regenerated tables)."""

from __future__ import annotations

import pytest

from attnstudy.report import before_after as ba

BEFORE = [
    {"model": "a", "JSD": "0.3 [0.2, 0.4]", "flip": "0.5 [0.4, 0.6]", "steps": "10"},
    {"model": "b", "JSD": "0.7 [0.65, 0.75]", "flip": "no attention", "steps": "12"},
]
AFTER = [
    {"model": "b", "JSD": "0.5 [0.45, 0.55]", "flip": "no attention", "steps": "12"},
    {"model": "a", "JSD": "0.35 [0.3, 0.41]", "flip": "0.61 [0.6, 0.7]", "steps": "10"},
]


def test_a_row_per_model_and_statistic_in_the_after_tables_order():
    rows = ba.before_after(BEFORE, AFTER, ["JSD", "flip"])
    assert [(r["model"], r["statistic"], r["before"], r["after"]) for r in rows] == [
        ("b", "JSD", "0.7 [0.65, 0.75]", "0.5 [0.45, 0.55]"),
        ("b", "flip", "no attention", "no attention"),
        ("a", "JSD", "0.3 [0.2, 0.4]", "0.35 [0.3, 0.41]"),
        ("a", "flip", "0.5 [0.4, 0.6]", "0.61 [0.6, 0.7]"),
    ]
    # apart / no interval / overlapping / touching at 0.6 (closed intervals overlap)
    assert [r["intervals overlap"] for r in rows] == ["no", "", "yes", "yes"]


def test_overlap_reads_scientific_notation_and_negative_values():
    assert ba.overlap("-0.2 [-0.3, -0.1]", "1e-3 [-5e-2, 2e-2]") == "no"
    assert ba.overlap("-0.2 [-0.3, -0.1]", "-0.12 [-0.15, 0.02]") == "yes"
    assert ba.overlap("12", "13") == ""


def test_a_trained_adversarys_lambda_names_its_row():
    before = [
        {"model": "a", "λ": "0.1", "JSD": "0.2 [0.1, 0.3]"},
        {"model": "a", "λ": "1", "JSD": "0.9"},
    ]
    after = [
        {"model": "a", "λ": "0.1", "JSD": "0.25 [0.2, 0.3]"},
        {"model": "a", "λ": "1", "JSD": "0.8"},
    ]
    rows = ba.before_after(before, after, ["JSD"])
    assert [(r["λ"], r["before"], r["after"]) for r in rows] == [
        ("0.1", "0.2 [0.1, 0.3]", "0.25 [0.2, 0.3]"),
        ("1", "0.9", "0.8"),
    ]


def test_layers_name_rows_and_tables_of_other_models_are_refused():
    before = [{"model": "t", "layer": "1", "x": "1 [0, 2]"}, {"model": "t", "layer": "2", "x": "5"}]
    after = [
        {"model": "t", "layer": "2", "x": "6"},
        {"model": "t", "layer": "1", "x": "3 [2.5, 4]"},
    ]
    rows = ba.before_after(before, after, ["x"])
    assert [(r["layer"], r["before"], r["after"], r["intervals overlap"]) for r in rows] == [
        ("2", "5", "6", ""),
        ("1", "1 [0, 2]", "3 [2.5, 4]", "no"),
    ]
    with pytest.raises(ValueError, match=r"different rows \(in one only: \('c',\)\)"):
        ba.before_after(BEFORE, [*AFTER, {**AFTER[0], "model": "c"}], ["JSD"])
    with pytest.raises(ValueError, match="before table has no column 'TVD'"):
        ba.before_after(BEFORE, AFTER, ["TVD"])
    with pytest.raises(ValueError, match="names the row \\('a',\\) twice"):
        ba.before_after(BEFORE, [*AFTER, AFTER[1]], ["JSD"])


def test_the_command_writes_a_new_file_and_refuses_an_existing_one(tmp_path, capsys):
    from attnstudy.report.results import read_rows, result_files

    for name, rows in (("before", BEFORE), ("after", AFTER)):
        ((_, content),) = result_files(name, {"": rows}).items()
        (tmp_path / f"{name}.csv").write_bytes(content)
    out = tmp_path / "cmp.csv"
    args = [str(tmp_path / "before.csv"), str(tmp_path / "after.csv"), str(out)]
    assert ba.main([*args, "--columns", "JSD, flip"]) == 0
    assert read_rows(out) == ba.before_after(BEFORE, AFTER, ["JSD", "flip"])
    out.write_text("mine", encoding="utf-8")
    assert ba.main([*args, "--columns", "JSD"]) == 2
    assert out.read_text(encoding="utf-8") == "mine"
    assert "exists: choose a new file" in capsys.readouterr().err
    assert ba.main([*args[:2], str(tmp_path / "new.csv"), "--columns", "TVD"]) == 2
    assert capsys.readouterr().err.strip() == "before_after: the before table has no column 'TVD'"
