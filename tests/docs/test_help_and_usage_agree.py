"""The help texts and docs/usage.md say the same words: every option of every verb is in the
usage chapter with its --help text, every option the chapter names is one a verb takes, and the
local executor is described alike (side by side, in worker processes)."""

from __future__ import annotations

import re
from pathlib import Path

from attnstudy.cli import docs as cli_docs

ROOT = Path(__file__).parents[2]
USAGE = ROOT / "docs" / "usage.md"


def _usage() -> str:
    return USAGE.read_text(encoding="utf-8")


def _block(text: str) -> str:
    return text.split(cli_docs.BEGIN, 1)[1].split(cli_docs.END, 1)[0]


def test_the_options_block_is_generated_from_the_parser():
    text = _usage()
    assert cli_docs.BEGIN in text and cli_docs.END in text
    assert cli_docs.render(text) == text, "docs/usage.md's options are stale: run `make docs`"


def test_every_option_of_every_verb_is_in_the_usage_chapter_with_its_help():
    block = _block(_usage())
    sections = dict(re.findall(r"\*\*`(\w+)`\*\* — (.*?)(?=\n\*\*`|\Z)", block, re.S))
    verbs = cli_docs.verbs()
    assert list(sections) == list(verbs)
    for name, parser in verbs.items():
        for action in cli_docs.options(parser):
            for option in action.option_strings:
                assert f"`{option}" in sections[name] or f", {option}" in sections[name], (
                    f"{name} {option} is not in docs/usage.md"
                )
            first_words = " ".join(action.help.split()[:6]).replace("|", "\\|")
            assert first_words in sections[name], f"{name}: the help of {action.dest} differs"


def test_every_option_the_chapter_names_is_one_a_verb_takes():
    text = _usage()
    takes = {name: cli_docs.option_names(p) for name, p in cli_docs.verbs().items()}
    every = set().union(*takes.values()) | {"--help"}
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))
    assert named and not named - every, f"docs/usage.md names no such option: {named - every}"
    # an option written after its verb (`attnstudy report --verdict`, a command line) is the verb's
    for verb, rest in re.findall(r"attnstudy (\w+)((?:[^`\n])*)", text):
        if verb in takes:
            wrong = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest)) - takes[verb]
            assert not wrong, f"docs/usage.md gives `attnstudy {verb}` options it lacks: {wrong}"


def test_the_local_executor_is_described_alike():
    executor = next(
        a for a in cli_docs.options(cli_docs.verbs()["run"]) if a.dest == "executor"
    ).help
    assert "side by side" in executor and "worker processes" in executor
    assert "this process, one after another" not in executor
    words = " ".join(_usage().split())
    assert "`attnstudy run` trains and ablates the study's models side by side, one worker " in (
        words
    )
    commands = words.split("## The commands", 1)[1].split(cli_docs.BEGIN, 1)[0]
    assert "one after another" not in commands
