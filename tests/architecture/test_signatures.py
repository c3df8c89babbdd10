"""Signatures and module sizes of the app layer (issue 37): a function of the app layer takes at most
four positional parameters (the rest are keyword-only; state that travels together travels as one
object, e.g. :class:`attnstudy.study.driver.StudyContext`), and no module of ``src/attnstudy/`` or
``analysis/`` is over 900 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
SRC = ROOT / "src" / "attnstudy"
MAX_POSITIONAL = 4
MAX_LINES = 900

APP_FOLDERS = ("serving", "pages", "study", "executors", "report", "cli")
"""The app layers' folders of src/attnstudy (tests/architecture/test_layers.py); the base and core
folders (config, runtime, verdict, data, models, scoring) and tracking are not scanned."""


def app_modules() -> list[Path]:
    """The app layer's modules: ``src/attnstudy/*.py`` but ``__init__.py``, and the app folders."""
    top = [p for p in sorted(SRC.glob("*.py")) if p.name != "__init__.py"]
    return top + [p for folder in APP_FOLDERS for p in sorted((SRC / folder).glob("*.py"))]


def positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The parameters ``fn`` takes by position, ``self`` and ``cls`` not counted (``*args`` and
    what follows it are keyword-only)."""
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def too_many_positional(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name}({', '.join(names)})"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and len(names := positional(node)) > MAX_POSITIONAL
    ]


def test_the_scan_covers_the_app_layer():
    names = {p.relative_to(SRC).as_posix() for p in app_modules()}
    assert {
        "api.py",
        "cli/main.py",
        "study/driver.py",
        "study/model_runs.py",
        "report/build.py",
    } <= names
    assert not any(n.startswith(("runtime/", "models/", "data/", "tracking/")) for n in names)


def test_the_scan_counts_what_is_positional():
    (fn,) = ast.parse("def f(self, a, b, /, c, d=1, *args, e, f=2, **kw): ...").body
    assert positional(fn) == ["a", "b", "c", "d"]
    (fn,) = ast.parse("def f(a, b, *, c, d, e, g): ...").body
    assert positional(fn) == ["a", "b"]


def test_app_functions_take_at_most_four_positional_parameters():
    """More than four parameters: those beyond the obvious subjects are keyword-only (after
    ``*``), or the state that travels together is one object."""
    offenders = [line for path in app_modules() for line in too_many_positional(path)]
    assert not offenders, (
        f"more than {MAX_POSITIONAL} positional parameters (make the rest keyword-only):\n"
        + "\n".join(offenders)
    )


def test_no_module_is_over_900_lines():
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for folder in (SRC, ROOT / "analysis")
        for path in sorted(folder.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert not long, f"modules over {MAX_LINES} lines (split them):\n" + "\n".join(long)
