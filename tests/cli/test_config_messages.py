"""Config refusals as a new user meets them: the value as they typed it, and example files named
where they are from the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_in_process import run_cli

from attnstudy.cli import main as cli

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"


def error_line(capsys, *argv: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = cli.main(list(argv))
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def test_a_boolean_is_shown_as_typed(capsys):
    """``--set training.epochs=true`` said "(got True)": Python's spelling, not the user's."""
    code, err = error_line(capsys, "run", str(TINY), "--set", "training.epochs=true")
    assert code == cli.EXIT_USAGE and len(err) == 1
    assert err[0].endswith("(got true)"), err


def test_a_value_the_message_quotes_is_not_repeated(capsys):
    """``--set model.attention=luong_dot`` ended "…; valid: 'additive', … 'none' (got 'luong_dot')":
    the value said twice, once after the list."""
    code, err = error_line(capsys, "run", str(TINY), "--set", "model.attention=luong_dot")
    assert code == cli.EXIT_USAGE and len(err) == 1
    assert err[0].count("'luong_dot'") == 1, err
    assert err[0].endswith("'uniform', 'none'"), err


def test_the_examples_folder_is_named_where_it_is(tmp_path, monkeypatch, capsys):
    """From outside the repository "(see experiments/ for examples)" named no folder."""
    monkeypatch.chdir(tmp_path)
    code, err = error_line(capsys, "run", "nosuch.toml")
    assert code == cli.EXIT_USAGE
    assert err == [
        "attnstudy: error: experiment file not found: nosuch.toml "
        f"(see {(ROOT / 'experiments').resolve()} for examples)"
    ]
    monkeypatch.chdir(ROOT)
    code, err = error_line(capsys, "run", "nosuch.toml")
    assert err == [
        "attnstudy: error: experiment file not found: nosuch.toml (see experiments/ for examples)"
    ]


@pytest.mark.parametrize(
    "value",
    ["[" * 1000 + "]" * 1000, "{a = " * 1000 + "1" + "}" * 1000],
    ids=["array", "inline-table"],
)
def test_a_set_value_nested_too_deeply_is_one_line(tmp_path, capfd, value):
    """NEW-14: ``--set training.epochs=[[[…]]]`` 1,000 deep gave a 3,002-line traceback."""
    out = run_cli(
        capfd,
        ["train", str(TINY), "--set", f"training.epochs={value}"],
        cwd=tmp_path,
        env={"ATTNSTUDY_ROOT": str(tmp_path)},
    )
    assert out.returncode == cli.EXIT_USAGE
    assert out.stderr.splitlines() == [
        "attnstudy: error: --set training.epochs=…: nested too deeply (more than 32 levels of "
        "keys, arrays or tables; no setting needs more than a few)"
    ]


def test_a_file_nested_too_deeply_is_one_line(tmp_path, capfd):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 1000 + "]" * 1000 + "\n" + TINY.read_text(encoding="utf-8"))
    out = run_cli(capfd, ["train", str(deep)], cwd=tmp_path, env={"ATTNSTUDY_ROOT": str(tmp_path)})
    assert out.returncode == cli.EXIT_USAGE
    # tomllib's parser recurses: under the default recursion limit it fails on the file itself
    # ("a value … correct the file"); where a library imported earlier in the process raised the
    # limit, the file parses and the depth check names the key ("'x' … correct the value")
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"attnstudy: error: {deep}: "), line
    assert line.endswith(
        "is nested too deeply (more than 32 levels of arrays or tables; no setting needs more "
        "than a few): correct the file"
    ) or line.endswith(
        "'x' is nested too deeply (more than 32 levels of arrays or tables; no setting needs "
        "more than a few): correct the value"
    ), line
