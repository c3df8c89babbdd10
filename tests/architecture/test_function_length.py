"""Short functions: no function or method in src/ or analysis/ longer than :data:`MAX_LINES`
lines, its docstring included (from its ``def`` line to its last line).

The functions that were longer when the rule came were listed in :data:`ALLOWED` with their
length then as their maximum, and removed as each was split; the list is empty now and only
shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
MAX_LINES = 100

ALLOWED: dict[str, int] = {}
"""Functions allowed over :data:`MAX_LINES` → the most lines each may have until it is split.
Empty since 2026-12-07: the last five (``nt.parse_corpus``, ``adversarial._optimise``,
``report.build.build_report``, ``findings.overall``, ``pretrained.ablate_pretrained``) were split
by step. Kept, with its checks, so that an exception is an explicit, shrinking list."""


def function_lengths() -> dict[str, int]:
    """``path:Qualified.name`` → lines from ``def`` to the end, for every function and method
    of the library (nested ones too)."""
    out: dict[str, int] = {}
    files = [*(ROOT / "src" / "attnstudy").rglob("*.py"), *(ROOT / "analysis").rglob("*.py")]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()

        def visit(node: ast.AST, prefix: str, rel: str = rel) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = f"{prefix}{child.name}"
                    out[f"{rel}:{name}"] = child.end_lineno - child.lineno + 1
                    visit(child, f"{name}.")
                elif isinstance(child, ast.ClassDef):
                    visit(child, f"{prefix}{child.name}.")
                else:
                    visit(child, prefix)

        visit(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def test_no_function_is_longer_than_the_limit():
    lengths = function_lengths()
    long = {k: n for k, n in lengths.items() if n > MAX_LINES and k not in ALLOWED}
    assert not long, f"functions over {MAX_LINES} lines (split them by step): {long}"


def test_the_allowed_long_functions_only_shrink():
    lengths = function_lengths()
    grown = {k: (lengths[k], most) for k, most in ALLOWED.items() if lengths.get(k, 0) > most}
    assert not grown, f"(now, most) — split them instead of growing them: {grown}"
    done = [k for k in ALLOWED if lengths.get(k, 0) <= MAX_LINES]
    assert not done, f"now short or gone: remove them from ALLOWED: {done}"
