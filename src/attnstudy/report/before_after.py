"""Two versions of one committed result table side by side: what a regeneration changed.

``python -m attnstudy.report.before_after BEFORE.csv AFTER.csv OUT.csv --columns "a,b"`` writes
a row per model (and layer, λ or aligner, where the tables have them) and statistic: the cell
before, the cell after, and whether their 95 % intervals overlap. docs/findings.md shows such a table for each
study regenerated with the rprop-1 solver and the counter-based random streams (the tables before
are in the repository's history), so every number of the comparison is a committed
cell.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

from attnstudy.report.results import NUMBER, read_rows, result_files

CELL = re.compile(rf"(?P<value>{NUMBER}) \[(?P<low>{NUMBER}), (?P<high>{NUMBER})\]")
"""A statistic with its 95 % interval (:data:`attnstudy.report.results.INTERVAL`, with groups)."""

KEYS = ("model", "layer", "λ", "aligner", "attention argmax")
"""The columns that name a row, those a table has: the model and, where the table has them, its
layer, a trained adversary's λ, the aligner, the alignment split."""


def overlap(before: str, after: str) -> str:
    """``"yes"`` when the two cells' 95 % intervals overlap, ``"no"`` when they are apart, ``""``
    when either cell has no interval (a count, ``undefined …``, ``no attention``)."""
    a, b = CELL.fullmatch(before.strip()), CELL.fullmatch(after.strip())
    if not (a and b):
        return ""
    apart = float(a["high"]) < float(b["low"]) or float(b["high"]) < float(a["low"])
    return "no" if apart else "yes"


def before_after(
    before: list[dict[str, str]], after: list[dict[str, str]], columns: list[str]
) -> list[dict[str, str]]:
    """Rows ``model [, layer, λ, …], statistic, before, after, intervals overlap`` for each row of
    ``after`` (in its order) and each of ``columns`` (in that order).

    Raises:
        ValueError: a column is missing from either table, the two tables do not hold the same
            rows (by model and layer), or a row is named twice.
    """
    keys = [k for k in KEYS if after and k in after[0]]

    def index(rows: list[dict[str, str]], side: str) -> dict[tuple[str, ...], dict[str, str]]:
        out: dict[tuple[str, ...], dict[str, str]] = {}
        for r in rows:
            missing = [c for c in (*keys, *columns) if c not in r]
            if missing:
                raise ValueError(f"the {side} table has no column {missing[0]!r}")
            key = tuple(r[k] for k in keys)
            if key in out:
                raise ValueError(f"the {side} table names the row {key} twice")
            out[key] = r
        return out

    old, new = index(before, "before"), index(after, "after")
    if old.keys() != new.keys():
        only = sorted(old.keys() ^ new.keys())
        raise ValueError(
            f"the two tables hold different rows (in one only: {', '.join(map(str, only))}): "
            "compare the same models"
        )
    rows = []
    for key, r in new.items():
        for c in columns:
            rows.append(
                {
                    **dict(zip(keys, key)),
                    "statistic": c,
                    "before": old[key][c],
                    "after": r[c],
                    "intervals overlap": overlap(old[key][c], r[c]),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python -m attnstudy.report.before_after BEFORE AFTER OUT --columns "a,b"``; exit 2 with
    one line on a table that cannot be compared."""
    p = argparse.ArgumentParser(prog="python -m attnstudy.report.before_after")
    p.add_argument("before", type=Path, help="the table before (a results CSV)")
    p.add_argument("after", type=Path, help="the table after (same models)")
    p.add_argument("out", type=Path, help="the comparison CSV to write (a new file)")
    p.add_argument("--columns", required=True, help='the statistics, as a CSV row: "a,b"')
    args = p.parse_args(argv)
    columns = [c.strip() for c in next(csv.reader([args.columns], skipinitialspace=True))]
    try:
        rows = before_after(read_rows(args.before), read_rows(args.after), columns)
    except (OSError, ValueError) as e:
        print(f"before_after: {e}", file=sys.stderr)
        return 2
    if args.out.exists():
        print(f"before_after: {args.out} exists: choose a new file", file=sys.stderr)
        return 2
    ((_, content),) = result_files(args.out.stem, {"": rows}).items()
    args.out.write_bytes(content)
    print(f"wrote {args.out} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
