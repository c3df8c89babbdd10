"""The docs tell the truth: generated tables are current, and nothing refers outside the repository."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_ablation_tables_are_generated_from_the_catalogue():
    from attnstudy.analysis.catalogue import BEGIN, END, markdown_table

    for name in ("docs/design.md", "README.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert BEGIN in text and END in text, name
        section = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
        assert section == markdown_table(), f"{name} is stale: run `make docs`"


def test_the_statistics_table_of_the_design_is_generated_from_the_catalogue():
    from attnstudy.analysis.catalogue import STATS_BEGIN, STATS_END, stats_markdown_table

    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    section = text.split(STATS_BEGIN, 1)[1].split(STATS_END, 1)[0].strip()
    assert section == stats_markdown_table(), "docs/design.md is stale: run `make docs`"
    assert "| Does it align with gold links? | AER | `ablation/alignment/aer` |" in section


OUTSIDE = ("../" + "shared", "DESIGN" + ".md")
"""Files beside the repository that it must not name (spelled apart, so this file names neither)."""


def test_no_reference_to_files_outside_the_repository_or_to_issue_numbers():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    offenders = []
    for f in files:
        if not f.endswith((".py", ".md", ".toml", ".cfg", "Makefile")) or f.startswith(
            "tests/fixtures"
        ):
            continue
        text = (ROOT / f).read_text(encoding="utf-8", errors="replace")
        if any(name in text for name in OUTSIDE) or re.search(r"\bissue #\d+", text):
            offenders.append(f)
    assert offenders == [], offenders


def test_design_doc_names_every_module():
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "architecture"))
    from test_layers import modules

    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    missing = [
        n for n in modules() if n.rsplit(".", 1)[-1] not in text and not n.endswith("__init__")
    ]
    assert not missing, f"docs/design.md does not mention {missing}"
