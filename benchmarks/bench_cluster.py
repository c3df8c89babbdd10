"""Local executor against Ray with N workers: a study's wall time, and what a worker costs.

On this machine's loopback (:mod:`benchmarks.cluster_kit`): a throwaway PostgreSQL, ``attnstudy
server`` on it and a Ray head with ``--workers`` CPUs
(:class:`attnstudy.executors.distributed.LocalRayHead`).
The same experiment runs twice as ``attnstudy run … --no-report``, each in its own process and
store: once with the local executor (SQLite, one variant after another), once with ``--executor
ray --ray-address HEAD`` against the server. Reported: both wall times and their ratio (local /
Ray), the cost of a worker (start-up: a fresh worker's first task that imports what a training
task imports, timed from the driver; memory: the peak RSS of every Ray worker process during the
study, sampled every 0.5 s), and the head's own services. The load average before and after each
run is printed beside it: a number measured while something else ran on the machine is worthless.

Default: ``experiments/dates.toml`` with a smaller training set (``--set`` replaces the defaults).
``--smoke``: ``experiments/tiny.toml`` with two seeds (seconds of work, a minute of start-ups).

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_cluster [--workers 2] [--smoke]``. Needs the
``[distributed]`` extra and Debian's ``postgresql`` (as the cluster test).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import common

ROOT = Path(__file__).resolve().parents[1]
FULL = (
    ROOT / "experiments" / "dates.toml",
    ["data.n_train=4000", "data.n_dev=300", "data.n_test=300", "ablation.n_examples=100"],
)
SMOKE = (ROOT / "experiments" / "tiny.toml", ["experiment.seeds=[1,2]"])


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _study(cmd: list[str], root: Path, env: dict[str, str], sample=None) -> tuple[float, str]:
    """Run one ``attnstudy run``; returns (wall seconds, stderr tail). ``sample`` is called every
    0.5 s while it runs."""
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    while proc.poll() is None:
        if sample is not None:
            sample()
        time.sleep(0.5)
    secs = time.perf_counter() - t0
    reader.join(10)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[3:6])} failed ({proc.returncode}): {''.join(err)[-2000:]}"
        )
    return secs, "".join(err)[-500:]


def worker_startup(address: str, env: dict[str, str], n: int) -> list[float]:
    """Seconds from submission to the result of ``n`` fresh workers' first task, which imports
    what a training task imports (torch, mlflow, the training code), run from a separate driver."""
    code = (
        "import ray, time, json\n"
        f"ray.init(address={address!r}, logging_level='ERROR')\n"
        "@ray.remote(num_cpus=1)\n"
        "def first():\n"
        "    import attnstudy.models.training, attnstudy.tracking.client, attnstudy.api\n"
        "    return 0\n"
        "t0 = time.perf_counter()\n"
        f"refs = [first.remote() for _ in range({n})]\n"
        "done = []\n"
        "while refs:\n"
        "    ready, refs = ray.wait(refs, num_returns=1)\n"
        "    done.append(time.perf_counter() - t0)\n"
        "print(json.dumps(done))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    if out.returncode != 0:
        raise RuntimeError(f"worker start-up probe failed: {out.stderr[-2000:]}")
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def run(args) -> dict:
    """Start the loopback set-up, run the study with both executors, report. Returns the rows."""
    import psutil

    from attnstudy.executors.distributed import LocalRayHead
    from benchmarks.cluster_kit import ThrowawayPostgres, start_tracking_server, stop_process

    experiment, overrides = SMOKE if args.smoke else FULL
    if args.experiment:
        experiment = Path(args.experiment)
    if args.set:
        overrides = args.set
    sets = [a for o in overrides for a in ("--set", o)]
    base = Path(tempfile.mkdtemp(prefix="attn-bench-cluster-"))
    pg = server = head = None
    try:
        pg = ThrowawayPostgres().start()
        server, url = start_tracking_server(pg.uri, base / "artifacts", base / "server.log", pg.env)
        head = LocalRayHead(num_cpus=args.workers)
        t0 = time.perf_counter()
        head.start()
        head_start = time.perf_counter() - t0
        env = dict(os.environ) | head.driver_env()
        env.pop("MLFLOW_TRACKING_URI", None)
        env.pop("RAY_ADDRESS", None)
        services = {
            p.name(): p.memory_info().rss
            for p in map(psutil.Process, head.pids())
            if p.is_running()
        }
        startup = worker_startup(head.address, env, args.workers)

        cli = [sys.executable, "-m", "attnstudy.cli", "run", str(experiment), "--quiet"]
        cli += ["--no-report", *sets]
        load_local = [_load()]
        local_s, _ = _study(cli, base / "local", env | {"ATTNSTUDY_ROOT": str(base / "local")})
        load_local.append(_load())

        peak: dict[int, tuple[str, int]] = {}

        def sample() -> None:
            for pid in head.pids():
                try:
                    p = psutil.Process(pid)
                    name, rss = p.name(), p.memory_info().rss
                except psutil.Error:
                    continue
                if name.startswith("ray::") and rss > peak.get(pid, ("", 0))[1]:
                    peak[pid] = (name, rss)

        ray_cmd = [*cli, "--executor", "ray", "--ray-address", head.address]
        ray_cmd += ["--tracking-uri", url]
        load_ray = [_load()]
        ray_s, _ = _study(
            ray_cmd, base / "ray", env | {"ATTNSTUDY_ROOT": str(base / "ray")}, sample
        )
        load_ray.append(_load())
    finally:
        if head is not None:
            head.stop()
        stop_process(server)
        if pg is not None:
            pg.stop()
        import shutil

        shutil.rmtree(base, ignore_errors=True)

    mib = 2**20
    rows = [
        {
            "executor": "local (1 process)",
            "wall s": local_s,
            "load before → after": " → ".join(load_local),
        },
        {
            "executor": f"ray ({args.workers} workers)",
            "wall s": ray_s,
            "load before → after": " → ".join(load_ray),
        },
    ]
    rss = sorted(r for _, r in peak.values())
    cost = [
        {"what": "head start (gcs, raylet, agents)", "value": f"{head_start:.1f} s"},
        {
            "what": "head services RSS",
            "value": f"{sum(services.values()) / mib:.0f} MiB ({len(services)} processes)",
        },
        {
            "what": "fresh worker, first task importing the training code",
            "value": ", ".join(f"{s:.1f} s" for s in startup),
        },
        {
            "what": "peak RSS per worker during the study",
            "value": (
                f"median {rss[len(rss) // 2] / mib:.0f} MiB, max {rss[-1] / mib:.0f} MiB "
                f"({len(rss)} worker processes)"
                if rss
                else "no worker seen"
            ),
        },
    ]
    notes = [
        f"local / ray = {local_s / ray_s:.2f}× (wall time; the same study, seeds and threads)",
        "loads above 0.5 before a run mean something else ran: that number is worthless",
    ]
    if args.smoke:
        notes.append("smoke mode: start-ups dominate; the ratio says nothing about a real study")
    common.report(
        f"Study wall time: local executor vs Ray with {args.workers} workers",
        args,
        {"experiment": experiment.name, "overrides": " ".join(overrides) or "none"},
        [("", common.table(rows)), ("What a worker costs", common.table(cost))],
        notes,
    )
    return {"rows": rows, "cost": cost, "local_s": local_s, "ray_s": ray_s}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=2, help="CPUs of the Ray head (its workers)")
    p.add_argument("--experiment", default=None, help="experiment file (default: dates.toml)")
    p.add_argument("--set", action="append", default=None, help="override (replaces the defaults)")
    args = p.parse_args(argv)
    common.setup(args)  # this process's threads (the studies' own come from their configs)
    return run(args)


if __name__ == "__main__":
    main()
