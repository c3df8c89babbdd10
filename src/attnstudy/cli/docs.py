"""The options of every ``attnstudy`` verb as docs/usage.md lists them, generated from the
command's own parser (``make docs``), so the help texts and the docs say the same words.

The block sits between ``<!-- cli-options:begin (generated: make docs) -->`` and
``<!-- cli-options:end -->``: per verb its usage line and a table of its arguments and options
with their ``--help`` text. Run: ``python -m attnstudy.cli.docs docs/usage.md``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

BEGIN = "<!-- cli-options:begin (generated: make docs) -->"
END = "<!-- cli-options:end -->"


def verbs() -> dict[str, argparse.ArgumentParser]:
    """Each verb's parser (``train``, ``run``, …), in the order ``attnstudy --help`` lists them."""
    from attnstudy.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """A verb's arguments and options as its ``--help`` lists them (help itself left out)."""
    return [
        a
        for a in parser._actions
        if not isinstance(a, argparse._HelpAction) and a.help != argparse.SUPPRESS
    ]


def option_names(parser: argparse.ArgumentParser) -> set[str]:
    """Every ``--option`` a verb takes (``--verbose``, given before the verb too, included)."""
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")} - {"--help"}


def _label(action: argparse.Action) -> str:
    if not action.option_strings:
        name = action.metavar or action.dest
        return f"`{name.upper() if name == action.dest else name}`" + (
            " …" if action.nargs in ("*", "+") else ""
        )
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    metavar = action.metavar or (
        "{" + ",".join(action.choices) + "}" if action.choices else action.dest.upper()
    )
    return f"`{names} {metavar}`"


def _help(action: argparse.Action) -> str:
    text = " ".join((action.help or "").split())
    if action.choices and action.option_strings and "{" not in _label(action):
        text += f" (one of: {', '.join(action.choices)})"
    return text.replace("|", "\\|")


def markdown() -> str:
    """The generated block's body: per verb its usage and a table of its arguments and options."""
    parts = []
    for name, parser in verbs().items():
        usage = " ".join(parser.format_usage().removeprefix("usage: ").split())
        rows = [f"| {_label(a)} | {_help(a)} |" for a in options(parser)]
        parts.append(
            f"**`{name}`** — `{usage}`\n\n| argument or option | what it does |\n|---|---|\n"
            + "\n".join(rows)
            + "\n"
        )
    return "\n".join(parts)


def render(text: str) -> str:
    """``text`` with its options block rewritten; text without one is returned as it is."""
    if BEGIN not in text:
        return text
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


def update_docs(*paths: Path) -> list[Path]:
    """Rewrite each file's options block; the files that changed."""
    changed = []
    for path in paths:
        old = path.read_text(encoding="utf-8")
        new = render(old)
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


if __name__ == "__main__":  # make docs
    import sys

    for p in update_docs(*(Path(a) for a in sys.argv[1:])):
        print(f"updated {p}")
