"""The docs tell the truth: generated tables are current, nothing refers outside the repository,
README stays short, and every relative link in README and docs/ leads somewhere."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_ablation_tables_are_generated_from_the_catalogue():
    from attnstudy.analysis.catalogue_docs import BEGIN, END, markdown_table

    for name in ("docs/design.md", "README.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        assert BEGIN in text and END in text, name
        section = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
        assert section == markdown_table(), f"{name} is stale: run `make docs`"


def test_the_statistics_table_of_the_design_is_generated_from_the_catalogue():
    from attnstudy.analysis.catalogue_docs import STATS_BEGIN, STATS_END, stats_markdown_table

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


README_MAX_BYTES = 25_600
"""README is what a newcomer reads in minutes; the rest lives in docs/."""


def test_readme_is_short():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_MAX_BYTES, f"README.md is {size:,} bytes (at most {README_MAX_BYTES:,})"


FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t]*#*[ \t]*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and code spans (what looks like a link there is not)."""
    text = FENCE.sub("", text)
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", text, flags=re.S)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: the rendered text lowercased, punctuation other than
    ``-`` and ``_`` dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file: its headings' slugs (a repeated one gets -1, -2, …) and
    explicit ``<a name=…>`` / ``<a id=…>``."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(text):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """The relative links of a Markdown file (``[text](path)``, ``[text](path#anchor)``,
    ``[text](#anchor)``, reference definitions) that lead to no file inside ``root``, or to no
    heading of the Markdown file they name; URLs with a scheme (http, https, mailto, …) are not
    checked."""
    text = _prose(path.read_text(encoding="utf-8"))
    targets = INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)
    bad = []
    for target in targets:
        if not target or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path.resolve()
        if not dest.is_relative_to(root.resolve()) or not dest.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading #{anchor} in {dest.name})")
    return bad


def _docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_in_readme_and_docs_resolves():
    links = 0
    for path in _docs():
        text = _prose(path.read_text(encoding="utf-8"))
        links += len(INLINE_LINK.findall(text)) + len(REFERENCE_LINK.findall(text))
        bad = broken_links(path)
        assert not bad, f"{path.relative_to(ROOT)}: broken links {bad}"
    assert links >= 20, "README and docs/ link to too few places: is the link pattern broken?"


def test_readme_links_every_docs_chapter():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in (ROOT / "docs").glob("*.md") if f"](docs/{p.name}" not in text]
    assert not missing, f"README does not link to {missing}"


@pytest.mark.parametrize(
    "heading, anchor",
    [
        (
            "Results on this machine (2 CPU cores, one thread per model)",
            "results-on-this-machine-2-cpu-cores-one-thread-per-model",
        ),
        ("attnstudy — design", "attnstudy--design"),
        ("1. Layout and layers", "1-layout-and-layers"),
        ("The quickstart's time", "the-quickstarts-time"),
        ("Your own data: TSV files", "your-own-data-tsv-files"),
        ("`erase_max` and [links](x.md)", "erase_max-and-links"),
    ],
)
def test_slug_is_githubs(heading, anchor):
    assert slug(heading) == anchor


def test_broken_links_are_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Same\n\n## Same\n\ntext\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Top\n\n[ok](docs/a.md) [ok](docs/a.md#same-1) [ok](#top) [web](https://x.org/y.md)\n"
        "[gone](docs/b.md) [no anchor](docs/a.md#other) [self](#nowhere) [out](../../etc/passwd)\n"
        "`[code](nowhere.md)`\n\n```\n[fenced](nowhere.md)\n```\n\n[ref]: docs/c.md\n",
        encoding="utf-8",
    )
    assert broken_links(readme, root=tmp_path) == [
        "docs/b.md (no such file)",
        "docs/a.md#other (no heading #other in a.md)",
        "#nowhere (no heading #nowhere in README.md)",
        "../../etc/passwd (no such file)",
        "docs/c.md (no such file)",
    ]


def test_the_readme_names_every_attention_score():
    """The README lists the recurrent family's scores by hand: each of the registry's is there."""
    from attnstudy.config import ATTENTIONS

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert [a for a in ATTENTIONS if f"`{a}`" not in text] == []
