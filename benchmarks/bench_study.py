"""The study profile: where a study's wall time goes, with one worker and with several.

``attnstudy run EXPERIMENT --quiet --set experiment.workers=N`` runs once per ``--workers``
value, each in its own process, project root and SQLite store (set-up excluded: the data
packages are installed, nothing is reused). Measured outside the study: its wall time, its CPU
time (user + system of the process and its worker processes) and the load average before and
after. Read back from the store, from what every study records anyway:

* **start-up**: the process's start to the study run's start (imports, config and data checks,
  opening the store);
* per model, **training** (``train/seconds``: the epochs) and **evaluation and logging** (the
  model run's duration less its training: the test decode, the model files, pages and MLflow
  calls);
* per model, **each ablation** (``timing/<ablation>_seconds``) and the **ablation run's logging**
  (the run's duration less ``ablation/seconds``: tables, pages, figures, MLflow calls);
* **after the models**: the last model or ablation run's end to the study run's end (seed
  variance, trained adversaries, the study's own records);
* **report**: the study run's end to the process's exit.

With several workers the per-model times overlap: their sum exceeds the wall time, and each is
slower than alone where the workers share memory bandwidth. Default: the quickstart
(``experiments/quickstart.toml``, about 4.5 minutes a run on an idle 2-core machine);
``--smoke``: the tiny experiment with two seeds.

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_study [--workers 1,2] [--smoke]`` or
``python -m benchmarks.run_all --only study``.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common

ROOT = Path(__file__).resolve().parents[1]
FULL = (ROOT / "experiments" / "quickstart.toml", [])
SMOKE = (ROOT / "experiments" / "tiny.toml", ["experiment.seeds=[1,2]"])
TARGET = 0.7
"""The study's wall time with every core ≤ 0.7 × one core's (idle machine)."""


MODEL_COLUMNS = (
    "model",
    "training s",
    "evaluation + logging s",
    "ablations s",
    "ablation logging s",
)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _user_children() -> float:
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime


def run_study(experiment: Path, sets: list[str], workers: int, root: Path) -> dict:
    """One ``attnstudy run`` with ``workers`` local workers in a fresh project ``root``.

    Returns:
        ``{"wall": s, "cpu": s, "launched": unix s, "exited": unix s, "load before/after": str,
        "rc": exit code, "stderr": tail}``.
    """
    (root / "mlruns").mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, ATTNSTUDY_ROOT=str(root))
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("ATTNSTUDY_WORKERS", None)
    cmd = [sys.executable, "-c", "from attnstudy.cli.main import entry; entry()", "run"]
    cmd += [str(experiment), "--quiet", "--set", f"experiment.workers={workers}"]
    for s in sets:
        cmd += ["--set", s]
    before, cpu0, user0 = _load(), _cpu_children(), _user_children()
    launched, t0 = time.time(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    return {
        "wall": wall,
        "cpu": _cpu_children() - cpu0,
        "user cpu": _user_children() - user0,
        "launched": launched,
        "exited": launched + wall,
        "load before": before,
        "load after": _load(),
        "rc": proc.returncode,
        "stderr": proc.stderr[-2000:],
    }


def profile(root: Path, run: dict) -> tuple[dict, list[dict], dict[str, float]]:
    """Read the study's profile back from its store.

    Returns:
        (phases: seconds per phase of the whole study, rows: one per model, ablations: seconds
        per ablation summed over the models).
    """
    from attnstudy.tracking import Kind, Tag, Tracker
    from attnstudy.tracking.schema import model_name_of_ablation_run

    tracker = Tracker(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}", create=False)
    runs = [
        r
        for e in tracker.client.search_experiments()
        for r in tracker.client.search_runs([e.experiment_id], max_results=1000)
    ]
    kind = {r.info.run_id: r.data.tags.get(Tag.KIND) for r in runs}
    study = next(r for r in runs if kind[r.info.run_id] == Kind.STUDY)

    def secs(r) -> float:
        return (r.info.end_time - r.info.start_time) / 1000

    rows: dict[str, dict] = {}
    ablations: dict[str, float] = {}
    for r in runs:
        if kind[r.info.run_id] not in (Kind.MODEL, Kind.ABLATION):
            continue
        m, name = r.data.metrics, model_name_of_ablation_run(r.info.run_name)
        row = rows.setdefault(name, dict.fromkeys(MODEL_COLUMNS, float("nan")) | {"model": name})
        if kind[r.info.run_id] == Kind.MODEL:
            row["training s"] = m.get("train/seconds", float("nan"))
            row["evaluation + logging s"] = secs(r) - row["training s"]
        elif kind[r.info.run_id] == Kind.ABLATION:
            row["ablations s"] = m.get("ablation/seconds", float("nan"))
            row["ablation logging s"] = secs(r) - row["ablations s"]
            for k, v in m.items():
                if k.startswith("timing/") and k.endswith("_seconds"):
                    ablation = k.removeprefix("timing/").removesuffix("_seconds")
                    ablations[ablation] = ablations.get(ablation, 0.0) + v
    children = [r for r in runs if kind[r.info.run_id] in (Kind.MODEL, Kind.ABLATION)]
    last_child = max((r.info.end_time for r in children), default=study.info.start_time) / 1000
    models = list(rows.values())
    phases = {
        "start-up": study.info.start_time / 1000 - run["launched"],
        "models (trainings and ablations, wall)": last_child - study.info.start_time / 1000,
        "after the models (seed variance, study records)": study.info.end_time / 1000 - last_child,
        "report": run["exited"] - study.info.end_time / 1000,
        "training, summed over models": _sum(models, "training s"),
        "evaluation + logging, summed": _sum(models, "evaluation + logging s"),
        "ablations, summed over models": _sum(models, "ablations s"),
        "ablation logging, summed": _sum(models, "ablation logging s"),
    }
    return phases, models, ablations


def _sum(rows: list[dict], column: str) -> float:
    return sum(r[column] for r in rows if r[column] == r[column])  # NaN: no such run


def record(path: Path, run: dict, models: int) -> None:
    """Write the quickstart's time record (``attnstudy.report.results.QUICKSTART_TIME``, one row)
    from
    one study run; ``make docs`` then quotes it in README, docs/benchmarks.md and
    ``experiments/quickstart.toml``."""
    import csv
    import datetime as dt

    from attnstudy.runtime.paths import git_commit

    row = {
        "date": dt.date.today().isoformat(),
        "machine": f"{os.cpu_count()}-core machine ({common.cpu_model()})",
        "load at start": run["load before"].split()[0],
        "code": git_commit()[:7],
        "command": "make run",
        "set-up": "the virtual environment already set up",
        "models": str(models),
        "wall s": f"{run['wall']:.0f}",
        "user CPU s": f"{run['user cpu']:.0f}",
        "source": "benchmarks/bench_study.py --record: attnstudy run experiments/quickstart.toml "
        f"--set experiment.workers={run['workers']} in a fresh store (what make run runs once "
        "set up)",
    }
    with open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    print(f"record: {path} (run make docs to quote it)", flush=True)


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts (default 1,2)")
    p.add_argument(
        "--keep",
        default=None,
        help="a new folder to keep the studies' project roots (stores, reports) in (default: a "
        "temporary folder, removed)",
    )
    p.add_argument(
        "--record",
        default=None,
        metavar="CSV",
        help="write the quickstart's time record (experiments/results/quickstart-time.csv) from "
        "the run with the first --workers count; run it on an idle machine, then make docs",
    )
    args = p.parse_args(argv)
    common.setup(args)
    experiment, sets = SMOKE if args.smoke else FULL
    counts = [int(w) for w in args.workers.split(",")]
    results, phases, models, ablations = {}, {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-study-") as tmp:
        if args.keep:
            tmp = Path(args.keep)
            tmp.mkdir(parents=True)  # a new folder: no earlier store is reused
        for n in counts:
            print(f"study with {n} worker(s) …", flush=True)
            run = run_study(experiment, sets, n, Path(tmp) / f"workers{n}")
            if run["rc"] != 0:
                print(run["stderr"], file=sys.stderr)
                raise SystemExit(f"the study with {n} worker(s) failed (exit {run['rc']})")
            results[n] = run | {"workers": n}
            phases[n], models[n], ablations[n] = profile(Path(tmp) / f"workers{n}", run)
    base = counts[0]
    if args.record:
        record(Path(args.record), results[base], len(models[base]))
    summary = [
        {
            "workers": n,
            "wall s": r["wall"],
            "CPU s (user + system)": r["cpu"],
            "CPU / wall": r["cpu"] / r["wall"],
            f"wall / {base} worker(s)": r["wall"] / results[base]["wall"],
            "load before": r["load before"],
            "load after": r["load after"],
        }
        for n, r in results.items()
    ]
    phase_rows = [
        {"phase": k} | {f"{n} worker(s) s": phases[n][k] for n in counts} for k in phases[base]
    ]
    names = sorted({a for n in counts for a in ablations[n]})
    ablation_rows = [
        {"ablation (summed over models)": a}
        | {f"{n} worker(s) s": ablations[n].get(a, 0.0) for n in counts}
        for a in names
    ]
    model_rows = [
        {"workers": n} | row for n in counts for row in sorted(models[n], key=lambda r: r["model"])
    ]
    notes = [
        f"target (idle machine): wall with every core ≤ {TARGET} × one core's; "
        + (
            f"here {summary[-1][f'wall / {base} worker(s)']:.2f}× "
            f"({common.verdict(summary[-1][f'wall / {base} worker(s)'], TARGET, False)}"
            " — judged only on an idle machine: see the load columns)"
            if len(counts) > 1
            else "one worker count only"
        ),
        "per-model times overlap with several workers (their sums exceed the wall time)",
    ]
    common.report(
        f"Study profile: {experiment.name}",
        args,
        {"experiment": experiment.name, "workers": args.workers, "--set": " ".join(sets) or "–"},
        [
            ("Wall and CPU time per worker count", common.table(summary)),
            ("Where the time goes (seconds)", common.table(phase_rows)),
            ("Each ablation, summed over the models (seconds)", common.table(ablation_rows)),
            ("Per model (seconds)", common.table(model_rows)),
        ],
        notes,
    )
    return {"summary": summary, "phases": phases, "ablations": ablations}


if __name__ == "__main__":
    main()
