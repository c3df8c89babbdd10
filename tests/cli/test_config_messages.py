"""Config refusals as a new user meets them: the value as they typed it, and example files named
where they are from the working directory."""

from __future__ import annotations

from pathlib import Path

from attnstudy import cli

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
