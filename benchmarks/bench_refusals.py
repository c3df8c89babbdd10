"""Benchmark 13 — the CPU time of a refusal: each refusal that needs no model and no store.

A command refused for a malformed tracking URI, a store a reading verb does not find, a tracking
server that refuses the connection, a missing model folder or file, a bad ``--set`` or a TOML
file nested too deeply is run as the user runs it (``python -m attnstudy.cli …``, a fresh
process: interpreter start-up included) from an empty folder (``ATTNSTUDY_ROOT``), and its CPU
time (user + system, ``resource.getrusage(RUSAGE_CHILDREN)``) is measured, median of the
repeats. Target: ≤ 1 s of CPU each. ``--before ROOT`` times another checkout (a ``git
worktree`` of an earlier commit) interleaved with this one, on the same cases: the before/after
of a change. Each checkout's package is laid out as the editable install maps it (its
``src/attnstudy`` with its ``analysis/`` as ``attnstudy.analysis``) in a temporary folder,
compiled once and put first on ``PYTHONPATH``, so neither borrows the other's modules.
``attnstudy --help`` is the floor (start-up and argument parsing).

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_refusals [--before /tmp/old-worktree]
[--smoke]``.
"""

from __future__ import annotations

import compileall
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from . import common

TARGET_S = 1.0
ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).resolve().parents[1] / "experiments" / "tiny.toml"

CASES = [
    # (name, arguments (TMP: an empty folder, PORT: a closed loopback port), environment)
    ("--help (the floor)", ["--help"], {}),
    (
        "refused server (report, $MLFLOW_TRACKING_URI)",
        ["report", "--experiment", "x"],
        {"MLFLOW_TRACKING_URI": "http://127.0.0.1:PORT"},
    ),
    (
        "unknown scheme (report --tracking-uri foo://bar)",
        ["report", "--tracking-uri", "foo://bar"],
        {},
    ),
    ("server without a host (http://)", ["report", "--tracking-uri", "http://"], {}),
    ("unknown scheme (train)", ["train", str(TINY), "--tracking-uri", "foo://bar"], {}),
    ("missing store (report)", ["report", "--tracking-uri", "sqlite:///TMP/none.db"], {}),
    ("missing store (predict runs:/…)", ["predict", "runs:/abc", "hello"], {}),
    ("missing model folder (ablate hf:)", ["ablate", "hf:TMP/nope", "--tsv", "TMP/ok.tsv"], {}),
    ("missing --tsv file (ablate hf:)", ["ablate", "hf:TMP", "--tsv", "TMP/missing.tsv"], {}),
    ("missing experiment file", ["run", "TMP/missing.toml"], {}),
    ("unknown --set key", ["run", str(TINY), "--set", "training.epochz=3"], {}),
    ("bad --set value", ["run", str(TINY), "--set", "training.epochs=abc"], {}),
    ("deep TOML nesting", ["run", "TMP/deep.toml"], {}),
]
"""The refusals timed (the cases of ``tests/cli/test_fast_refusals.py``, which also checks their
lines and that they import neither torch nor MLflow)."""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def package(root: Path, where: Path) -> Path:
    """A folder to put first on ``PYTHONPATH`` for the checkout ``root``: a copy of its
    ``src/attnstudy`` with its ``analysis/`` linked in as ``attnstudy/analysis`` (the layout the
    editable install maps), compiled once so no timed run compiles."""
    shutil.copytree(
        root / "src" / "attnstudy",
        where / "attnstudy",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (where / "attnstudy" / "analysis").symlink_to(root / "analysis", target_is_directory=True)
    compileall.compile_dir(where, quiet=1)
    return where


def cpu_of(tree: Path, args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int]:
    """(CPU seconds, exit code) of ``python -m attnstudy.cli ARGS`` with ``tree`` first on the
    path, run from ``cwd`` (also its ``ATTNSTUDY_ROOT``) without ``$MLFLOW_TRACKING_URI`` unless
    ``env`` gives one."""
    full = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    full.update(env, PYTHONPATH=str(tree), ATTNSTUDY_ROOT=str(cwd))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", *args],
        capture_output=True,
        cwd=cwd,
        env=full,
        timeout=300,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, out.returncode


def git_commit(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


FIXTURES = ("deep.toml", "ok.tsv")


def run(args) -> dict:
    repeats = args.repeats or (1 if args.smoke else 3)
    cases = CASES[:3] if args.smoke else CASES
    roots = {"after": ROOT} | ({"before": Path(args.before).resolve()} if args.before else {})
    times: dict[tuple[str, str], list[float]] = {}
    codes: dict[tuple[str, str], int] = {}
    created: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="attnstudy-bench-refusals-") as tmp:
        trees = {}
        for tree, root in roots.items():
            (Path(tmp) / tree).mkdir()
            trees[tree] = package(root, Path(tmp) / tree)
        folder = Path(tmp) / "cwd"
        folder.mkdir()
        (folder / "ok.tsv").write_text("a b\tc d\n", encoding="utf-8")
        (folder / "deep.toml").write_text(
            '[experiment]\nname = "deep"\n[data]\nx = ' + "[" * 40 + "]" * 40 + "\n"
        )
        port = str(closed_port())

        def fill(text: str) -> str:
            return text.replace("TMP", str(folder)).replace("PORT", port)

        load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())
        for _ in range(repeats):  # interleaved: before and after of a case back to back
            for name, argv, env in cases:
                for tree, path in trees.items():
                    cpu, code = cpu_of(
                        path, [fill(a) for a in argv], {k: fill(v) for k, v in env.items()}, folder
                    )
                    times.setdefault((name, tree), []).append(cpu)
                    codes[(name, tree)] = code
                    extra = [p for p in folder.iterdir() if p.name not in FIXTURES]
                    if extra:  # a refusal wrote something: said, and removed for the next case
                        created.add(f"{name} ({tree}): {sorted(p.name for p in extra)}")
                        for p in extra:
                            shutil.rmtree(p) if p.is_dir() else p.unlink()
    rows = []
    for name, _, _ in cases:
        after = statistics.median(times[(name, "after")])
        row: dict[str, object] = {"refusal": name, "exit": codes[(name, "after")]}
        if args.before:
            before = statistics.median(times[(name, "before")])
            row |= {
                "exit before": codes[(name, "before")],
                "before CPU s": before,
                "after CPU s": after,
                "before / after": before / after,
            }
        else:
            row["CPU s"] = after
        row["≤ 1 s"] = "met" if after <= TARGET_S else "NOT met"
        rows.append(row)
    load_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
    refusals = [r for r in rows if r["refusal"] != CASES[0][0]]
    worst = max(float(r.get("after CPU s", r.get("CPU s"))) for r in refusals)
    notes = [
        f"after: {ROOT} (code {git_commit(ROOT)} + the working tree)"
        + (
            f"; before: {args.before} (code {git_commit(Path(args.before))})" if args.before else ""
        ),
        f"CPU = user + system of the child process, median of {repeats}, interleaved; each a "
        "fresh `python -m attnstudy.cli` (interpreter start-up and imports included)",
        f"worst refusal after: {worst:.2f} s CPU (target ≤ {TARGET_S:g} s, "
        f"{common.verdict(worst, TARGET_S, higher_is_better=False)})",
        f"load average (1/5/15 min) at start {load_start}, at end {load_end}; CPU time, not wall "
        "time, so a busy neighbour adds little",
        "what a refusal left in the empty working folder: "
        + ("; ".join(sorted(created)) if created else "nothing"),
    ]
    common.report(
        "Refusals: CPU time of a command refused before any model or store is opened",
        args,
        {"cases": len(cases), "timing": f"median of {repeats}"},
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows, "worst": worst, "created": sorted(created)}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument(
        "--before",
        default=None,
        metavar="ROOT",
        help="another checkout to time on the same cases (e.g. a git worktree of the commit "
        "before a change)",
    )
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    main()
