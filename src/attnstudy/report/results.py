"""Committed result tables and the Markdown blocks generated from them (docs/findings.md,
docs/benchmarks.md).

``attnstudy report --results DIR`` writes a study's summary tables as CSV files into ``DIR``
(the repository keeps them in ``experiments/results/``): ``<experiment>.csv`` (a row per model
and layer, every statistic ``value [low, high]``), ``<experiment>-models.csv`` (a row per
training: epochs, minutes, dev and test WER/PER, the config) and, with trained adversaries,
``<experiment>-adversaries.csv``; each row names the study run it was built from. Blocks in the docs
between ``<!-- results:<file>.csv:begin -->`` and ``<!-- results:<file>.csv:end -->`` are those
files as Markdown tables (``<file>.csv[col1,col2,…]`` names the columns to show, in order),
rewritten by ``make docs`` (:func:`update_docs`) and checked by the tests, so every number of the
published findings and results comes from a table that ``attnstudy report`` rebuilds from the
store. The quickstart's time is one record, ``quickstart-time.csv``, quoted by a
``quickstart-time`` block (:func:`render_time_blocks`) in README, docs/benchmarks.md and
``experiments/quickstart.toml``.
"""

from __future__ import annotations

import csv
import io
import re
import textwrap
from collections.abc import Iterable
from pathlib import Path

from attnstudy.runtime.outputs import write_files

MARKER = re.compile(
    r"<!-- results:(?P<file>(?:[A-Za-z0-9_\-][A-Za-z0-9_.\-]*/)?[A-Za-z0-9_.\-]+\.csv)"
    r"(?:\[(?P<columns>[^\]]*)\])?:begin -->\n"
    r"(?P<body>.*?)<!-- results:(?P=file):end -->",
    re.S,
)
"""A generated block: its CSV file name (in the results folder, or in one sub-folder of it, which
holds the tables of a second study of the same experiment: ``<folder>/<experiment>-alignment.csv``;
no ``..``), the columns shown (comma-separated as in a CSV row: a column whose name holds a comma
is quoted, ``"AER, linked targets"``), its body."""

NUMBER = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"
"""A number as a results table writes it: ``0.586``, ``-0.2``, ``1.04e-09``."""

INTERVAL = re.compile(rf"{NUMBER} \[{NUMBER}, {NUMBER}\]")
"""A number with its 95 % interval as the report writes it: ``0.586 [0.573, 0.598]``."""


def columns_of(rows: list[dict]) -> list[str]:
    """Every row's keys once, each after the key it follows in its own row (the first row's order
    first): rows of models of two tasks (G2P's PER, Greek–English's WER and BLEU) share one
    header, each task's columns where its rows have them."""
    out: list[str] = []
    for row in rows:
        after = -1
        for key in row:
            if key in out:
                after = out.index(key)
            else:
                after += 1
                out.insert(after, key)
    return out


def result_files(experiment: str, tables: dict[str, list[dict]]) -> dict[str, bytes]:
    """The CSV files of ``tables`` (``suffix → rows``, rows as dicts of cell text, in order):
    ``<experiment><suffix>.csv → content``; an empty table gives no file. A column some rows lack
    (a metric of another task) is empty in those rows."""
    files = {}
    for suffix, rows in tables.items():
        if not rows:
            continue
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=columns_of(rows), restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        files[f"{experiment}{suffix}.csv"] = buf.getvalue().encode("utf-8")
    return files


def write_results(
    out_dir: str | Path,
    experiment: str,
    tables: dict[str, list[dict]],
    store_folders: Iterable[Path] = (),
) -> list[Path]:
    """Write :func:`result_files` into ``out_dir`` (``report --results``), deleting nothing there
    and overwriting only files attnstudy wrote (:func:`attnstudy.runtime.outputs.write_files`).

    Returns:
        The files written.

    Raises:
        attnstudy.runtime.outputs.OutputError: ``out_dir`` is protected, or holds one of these files
        that
            attnstudy did not write or that was changed since (nothing written).
    """
    return write_files(
        out_dir,
        result_files(experiment, tables),
        option="--results",
        store_folders=store_folders,
    )


def former_labels() -> dict[str, str]:
    """Column names of result tables written by earlier versions → the catalogue's label now
    (:attr:`attnstudy.analysis.catalogue.Stat.former_labels`)."""
    from attnstudy.analysis.catalogue import shown_stats

    return {
        old: s.stat.label
        for s in shown_stats()
        for old in s.stat.former_labels
        if old != s.stat.label
    }


def read_rows(path: str | Path) -> list[dict[str, str]]:
    """A results CSV as a list of rows (cell text as written), a column written under a former
    label of a statistic (:func:`former_labels`) named by its label now."""
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    renamed = former_labels()
    if rows and renamed.keys() & rows[0].keys():
        rows = [{renamed.get(k, k): v for k, v in r.items()} for r in rows]
    return rows


def markdown(rows: list[dict[str, str]]) -> str:
    """Rows as a Markdown table (``|`` inside a cell escaped)."""
    if not rows:
        return ""
    header = list(rows[0])

    def cell(text: str) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(cell(r[h]) for h in header) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def render_blocks(text: str, results_dir: str | Path) -> str:
    """``text`` with every results block rewritten from its CSV in ``results_dir``.

    Raises:
        FileNotFoundError: a block names a CSV that is not there.
    """
    folder = Path(results_dir)

    def block(m: re.Match) -> str:
        rows = read_rows(folder / m["file"])
        head = m["file"]
        if m["columns"] is not None:
            head = f"{head}[{m['columns']}]"
            columns = [c.strip() for c in next(csv.reader([m["columns"]], skipinitialspace=True))]
            missing = [c for c in columns if rows and c not in rows[0]]
            if missing:
                raise KeyError(f"{m['file']} has no column {missing[0]!r} (results block {head})")
            rows = [{c: r[c] for c in columns} for r in rows]
        return f"<!-- results:{head}:begin -->\n{markdown(rows)}<!-- results:{m['file']}:end -->"

    return MARKER.sub(block, text)


QUICKSTART_TIME = "quickstart-time.csv"
"""The one record of the quickstart's time, in the results folder (written by
``benchmarks/bench_study.py --record``): README, ``experiments/quickstart.toml`` and
docs/benchmarks.md quote it through a ``quickstart-time`` block (:func:`render_time_blocks`), so
there is one time, from one measurement."""

TIME_BLOCK = re.compile(
    r"^(?P<lead>(?:<!--|#) )quickstart-time:begin(?P<tail>[^\n]*)\n"
    r"(?P<body>.*?)"
    r"^(?P=lead)quickstart-time:end(?P<close>[^\n]*)$",
    re.S | re.M,
)
"""A generated quickstart-time block: between ``<!-- quickstart-time:begin … -->`` and
``<!-- quickstart-time:end -->`` in Markdown, between ``# quickstart-time:begin …`` and
``# quickstart-time:end`` comment lines in TOML (its lines then start with ``# ``)."""


def duration(seconds: float) -> str:
    """Seconds as the docs write a duration: ``148`` → ``2 min 28 s``, ``42`` → ``42 s``."""
    total = round(seconds)
    minutes, rest = divmod(total, 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def quickstart_time(row: dict[str, str]) -> str:
    """The sentence that quotes the quickstart's time from its record (a row of
    :data:`QUICKSTART_TIME`: ``date``, ``machine``, ``load at start``, ``code``, ``command``,
    ``set-up``, ``models``, ``wall s``, ``user CPU s``, ``source``)."""
    return (
        f"`{row['command']}` took **{duration(float(row['wall s']))}** on an idle "
        f"{row['machine']}, {row['set-up']} ({row['date']}, code {row['code']}, load "
        f"{row['load at start']} at its start; {duration(float(row['user CPU s']))} of user CPU "
        f"over all cores): {row['models']} models trained and ablated, then the report."
    )


def render_time_blocks(text: str, results_dir: str | Path) -> str:
    """``text`` with every quickstart-time block (:data:`TIME_BLOCK`) rewritten from the record
    ``results_dir/quickstart-time.csv``; text without such a block is returned as it is.

    Raises:
        FileNotFoundError: a block is there but the record is not.
        ValueError: the record does not hold exactly one row.
    """
    if not TIME_BLOCK.search(text):
        return text
    rows = read_rows(Path(results_dir) / QUICKSTART_TIME)
    if len(rows) != 1:
        raise ValueError(f"{QUICKSTART_TIME} holds {len(rows)} rows; the quickstart has one time")
    sentence = quickstart_time(rows[0])

    def block(m: re.Match) -> str:
        lead = m["lead"]
        if lead.startswith("#"):  # a TOML comment: plain text, wrapped, each line a comment
            plain = sentence.replace("**", "")
            body = textwrap.fill(plain, width=100, initial_indent="# ", subsequent_indent="# ")
        else:
            body = sentence
        return (
            f"{lead}quickstart-time:begin{m['tail']}\n{body}\n{lead}quickstart-time:end{m['close']}"
        )

    return TIME_BLOCK.sub(block, text)


def update_docs(path: str | Path, results_dir: str | Path) -> bool:
    """Rewrite ``path``'s results blocks from ``results_dir``; True if it changed."""
    p = Path(path)
    old = p.read_text(encoding="utf-8")
    new = render_time_blocks(render_blocks(old, results_dir), results_dir)
    if new != old:
        p.write_text(new, encoding="utf-8")
    return new != old


if __name__ == "__main__":  # make docs
    import sys

    *documents, folder = sys.argv[1:]  # python -m attnstudy.report.results DOC [DOC …] RESULTS_DIR
    for doc in documents:
        if update_docs(doc, folder):
            print(f"updated {doc}")
