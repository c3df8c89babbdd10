"""The report as a reader gets it: self-contained HTML (images as data: URIs, so it renders inside
MLflow's artifact frame), every table cell a ``value [low, high]`` or a reason, one caption per
figure, the definitions, and a Markdown twin with the same numbers."""

import base64
import re
from html.parser import HTMLParser

import pytest

pytestmark = pytest.mark.slow

NUMBER = r"-?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?"
CELL = re.compile(rf"^{NUMBER}( \[{NUMBER}, {NUMBER}\])?$")
REASONS = re.compile(
    r"^(no attention|not run|failed|training failed|no gold links|skipped|not measured|"
    r"undefined( \(\d+ of \d+ steps\))?)$"
)
TERMS = ["TVD", "JSD", "flip", "erase-max", "erase-until-flip", "AER", "gold mass", "prefix"]


class Page(HTMLParser):
    """Tables (rows of cell texts), images, figures with their captions, definition terms."""

    def __init__(self):
        super().__init__()
        self.tables, self.images, self.figures, self.terms = [], [], [], []
        self._cell = self._where = None
        self._table_class = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.tables.append((a.get("class", ""), []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th", "dt", "figcaption"):
            self._cell, self._where = "", tag
        elif tag == "img":
            self.images.append(a.get("src", ""))
            if self.figures and self.figures[-1]["open"]:
                self.figures[-1]["images"] += 1
        elif tag == "figure":
            self.figures.append({"open": True, "images": 0, "captions": []})

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == self._where and self._cell is not None:
            text = " ".join(self._cell.split())
            if tag in ("td", "th"):  # a header row holds its th texts
                self.tables[-1][1][-1].append(text)
            elif tag == "dt":
                self.terms.append(text)
            elif tag == "figcaption":
                self.figures[-1]["captions"].append(text)
            self._cell = self._where = None
        elif tag == "figure":
            self.figures[-1]["open"] = False


@pytest.fixture(scope="module")
def tiny_report(tiny_study):
    html = tiny_study.report.read_text(encoding="utf-8")
    md = tiny_study.report.with_name("report.md").read_text(encoding="utf-8")
    page = Page()
    page.feed(html)
    return html, md, page


def test_images_are_embedded_pngs_and_nothing_is_fetched(tiny_report):
    html, _, page = tiny_report
    assert len(page.images) >= 6
    for src in page.images:
        assert src.startswith("data:image/png;base64,"), src[:40]
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # no relative asset a blob-URL frame could not resolve
    assert not re.search(r'(src|href)="(?!data:|https?:|#|examples/)', html)


def test_every_figure_has_one_caption(tiny_report):
    _, _, page = tiny_report
    assert page.figures
    for fig in page.figures:
        assert fig["images"] == 1 and len(fig["captions"]) == 1 and len(fig["captions"][0]) > 40


def test_every_cell_is_a_value_with_interval_or_a_reason(tiny_report):
    _, _, page = tiny_report
    summary = [rows for cls, rows in page.tables if cls == "summary"]
    assert len(summary) >= 5
    checked = with_interval = 0
    for rows in summary:
        keys = {"model", "layer", "aligner", "attention argmax"}  # a row's name, not a value
        for row in rows[1:]:  # rows[0] is the header row
            for head, cell in zip(rows[0][1:], row[1:]):
                if head in keys:
                    continue
                # a steps column where the statistics rest on different steps: ``14 to 64``
                steps = re.match(r"^\d+ to \d+$", cell)
                assert CELL.match(cell) or REASONS.match(cell) or steps, (head, row)
                checked += 1
                with_interval += "[" in cell
    assert checked > 40 and with_interval > 20
    assert "–" not in "".join(c for rows in summary for row in rows[1:] for c in row)


def test_definitions_and_settings_are_stated(tiny_report):
    html, md, page = tiny_report
    for term in TERMS:
        assert any(term in t for t in page.terms), term
    assert "AER sure/possible" in " ".join(page.terms) or "S ⊆ P" in html
    assert "ε = 0.05 (TVD)" in html and "P = 10" in html and "Prefix: <b>greedy</b>" in html
    assert "Och &amp; Ney 2003, eq. 7" in html


def test_markdown_twin_has_the_same_findings_and_numbers(tiny_report, tiny_study):
    html, md, page = tiny_report
    summary = [rows for cls, rows in page.tables if cls == "summary"]
    for rows in summary:
        for row in rows[1:]:
            assert "| " + " | ".join(row) + " |" in md, row
    assert md.count("](data:") == 0  # the Markdown links its figure files
    files = re.findall(r"!\[[^]]*\]\((figures/[^)]+)\)", md)
    assert len(files) == len(page.figures)
    assert all((tiny_study.report.parent / f).is_file() for f in files)
    findings_md = md[md.index("## Findings") : md.index("## How this was measured")]
    assert "Attention is" in findings_md and "No attention" in findings_md


def test_committed_summary_cells_leave_missing_values_empty():
    """Regression: ``report --results`` wrote a layer row's model-level columns (exact match of
    ``transformer · layer 0``) as the text ``nan``; a missing value is an empty cell."""
    import numpy as np
    import pandas as pd

    from attnstudy.report import summary_cells

    table = pd.DataFrame(
        {
            "model": ["dates transformer-L2H4", "dates transformer-L2H4 · layer 0"],
            "exact match": ["0.695 [0.674, 0.715]", np.nan],
            "exact match, held-out": [0.455, np.nan],
            "steps": [3300, 3300],
        }
    )
    assert summary_cells(table) == [
        {
            "model": "dates transformer-L2H4",
            "exact match": "0.695 [0.674, 0.715]",
            "exact match, held-out": "0.455",
            "steps": "3300",
        },
        {
            "model": "dates transformer-L2H4 · layer 0",
            "exact match": "",
            "exact match, held-out": "",
            "steps": "3300",
        },
    ]


def test_summary_frame_keeps_each_models_layer_rows_under_it():
    """Regression: the outer join sorted the rows, so ``transformer seed2`` (space before ``·``)
    came between ``transformer`` and its own ``transformer · layer 0`` in ``<experiment>.csv``."""
    from attnstudy.report import summary_cells, summary_frame

    used = ["t", "t · layer 0", "t · layer mean", "t seed2", "t seed2 · layer 0", "a"]
    context = {
        "tables": [
            {
                "header": ["model", "exact match"],
                "rows": [["t", "0.7"], ["t seed2", "0.8"], ["a", "0.9"]],
            },
            {"header": ["model", "flip"], "rows": [[n, f"0.{i}"] for i, n in enumerate(used)]},
        ]
    }
    frame = summary_frame(context)
    assert frame["model"].tolist() == used
    cells = summary_cells(frame)
    assert [r["exact match"] for r in cells] == ["0.7", "", "", "0.8", "", "0.9"]
    assert frame["flip"].tolist() == [f"0.{i}" for i in range(6)]


def test_ui_links_go_to_the_tracking_server_unless_told_otherwise(monkeypatch):
    """The report once linked to http://127.0.0.1:5000 even when built from a tracking server on
    another port (a study on http://127.0.0.1:5077 got dead links)."""
    from attnstudy.report import ui_base_url

    monkeypatch.delenv("ATTNSTUDY_UI_URL", raising=False)
    server = "http://10.0.0.5:5077/"
    assert ui_base_url(None, server) == "http://10.0.0.5:5077"
    assert ui_base_url(None, "https://mlflow.lab.org") == "https://mlflow.lab.org"
    # a local store has no UI of its own: `attnstudy ui` serves it on :5000
    assert ui_base_url(None, "sqlite:////data/mlflow.db") == "http://127.0.0.1:5000"
    assert ui_base_url(None, None) == "http://127.0.0.1:5000"
    # --ui-url, then $ATTNSTUDY_UI_URL, come before the tracking server
    monkeypatch.setenv("ATTNSTUDY_UI_URL", "http://proxy:8080/")
    assert ui_base_url(None, server) == "http://proxy:8080"
    assert ui_base_url("http://given:1/", server) == "http://given:1"
