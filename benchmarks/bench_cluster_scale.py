"""A 1,000-model study of stub tasks through Ray and a PostgreSQL-backed tracking server.

On this machine's loopback (:mod:`benchmarks.cluster_kit`): a throwaway PostgreSQL, ``mlflow db
upgrade``, ``attnstudy server --workers W`` on it, and a Ray head
(:class:`attnstudy.executors.distributed.LocalRayHead`) with ``--ray-cpus`` logical CPUs. The driver
creates
the study run as ``attnstudy run`` does (:func:`attnstudy.tracking.store.start_study`), then submits
one stub training task per model and chains its stub ablation task to it, as the Ray executor
chains a model's ablation to its training. A stub training trains nothing: it opens a
:class:`attnstudy.tracking.Tracker` on the server (leases included), creates the model run with
the tags the report reads (those of ``tests/fixtures/stub_store.py``'s model runs), logs six
params and three metrics, and ends it FINISHED; a stub ablation creates its ablation run under the
model run, logs two metrics and ends it. The driver then records the study's members
(:class:`attnstudy.tracking.store.StudyRecord`, one tag per run, as the Ray executor does) and ends
the study run. So the server sees what a study's bookkeeping costs without the trainings.

Reported: the study's wall time (from the first submission to the study run's end), the
tracking server's requests (its access log: every request in that window) and their rate, the
PostgreSQL database's size after the study (``pg_database_size``), and the report's read of the
study (:func:`attnstudy.report.store.load_study`, the report's whole read from the server, tables
excepted: the stub runs have no artifacts, so each of its artifact checks finds none).

Run: ``PYTHONPATH=src:. python -m benchmarks.bench_cluster_scale [--models 1000] [--smoke]``.
Needs the ``[distributed]`` extra and Debian's ``postgresql`` (as the cluster test).
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

from . import common

ACCESS = re.compile(r'^(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d) .*"(GET|POST|PATCH|PUT|DELETE) (\S+)')
"""An access-log line of MLflow's uvicorn (its ``uvicorn_log_config.yaml``): time, verb, path."""


def requests_between(log: Path, start: float, end: float) -> Counter:
    """The server's requests logged from ``start`` to ``end`` (Unix seconds; the log has whole
    seconds, so the window is widened to them), by ``VERB path``."""
    counts: Counter = Counter()
    lo, hi = int(start), int(end) + 1
    for line in log.read_text(errors="replace").splitlines():
        m = ACCESS.match(line)
        if m is None:
            continue
        when = time.mktime(time.strptime(m.group(1), "%Y/%m/%d %H:%M:%S"))
        if lo <= when <= hi:
            counts[f"{m.group(2)} {m.group(3).split('?')[0]}"] += 1
    return counts


@contextlib.contextmanager
def _environment(updates: dict[str, str], also: tuple[str, ...] = ()):
    """``updates`` in this process's environment for the duration, then every variable of
    ``updates`` and ``also`` as it was (Ray's set-up adds some: the driver's environment must not
    leak into a caller's later work)."""
    names = set(updates) | set(also)
    old = {k: os.environ.get(k) for k in names}
    os.environ.update(updates)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


QUIET = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
"""No "View run … at" line per run from MLflow's client (2,000 of them in the workers' logs)."""


def _tasks():
    """The stub training and ablation functions, made here so Ray ships them by value (the
    workers cannot import the benchmarks package)."""

    def train(url: str, exp_id: str, study_id: str, i: int) -> str:
        from attnstudy.tracking import Kind, Tag, Tracker

        t = Tracker(url)
        tags = {
            Tag.KIND: Kind.MODEL,
            Tag.EXPERIMENT: "scale",
            Tag.TASK: "copy",
            Tag.ATTENTION: "additive",
            Tag.FLOW: "bahdanau",
            Tag.ARCHITECTURE: "rnn",
            Tag.VARIANT: f"stub-{i:04d}",
            Tag.SEED: "1",
            Tag.MODEL_KEY: f"{i:016x}",
            Tag.DATA_DIGEST: "0" * 64,
            Tag.STUDY_ID: study_id,
        }
        run = t.start_run(exp_id, f"copy/stub-{i:04d}/seed1", tags, parent_run_id=study_id)
        t.log_params(
            run,
            {"epochs": 1, "lr": 0.001, "batch_size": 32, "seed": 1, "hidden": 64, "i": i},
        )
        t.log_metrics(
            run, {"test/exact_match": (i % 100) / 100, "test/per": 0.1, "train/loss": 1.0}
        )
        t.end_run(run)
        return run

    def ablate(url: str, exp_id: str, study_id: str, i: int, model_id: str) -> tuple[str, str]:
        from attnstudy.tracking import Kind, Tag, Tracker

        t = Tracker(url)
        tags = {
            Tag.KIND: Kind.ABLATION,
            Tag.EXPERIMENT: "scale",
            Tag.TASK: "copy",
            Tag.VARIANT: f"stub-{i:04d}",
            Tag.SEED: "1",
            Tag.SOURCE_RUN_ID: model_id,
            Tag.ABLATION_KEY: "stub-ablation-key",
            Tag.STUDY_ID: study_id,
        }
        run = t.start_run(exp_id, f"ablations of copy/stub-{i:04d}/seed1", tags, model_id)
        t.log_metrics(run, {"ablation/used_flip": 0.5, "ablation/seconds": 0.0})
        t.end_run(run)
        return model_id, run

    return train, ablate


def run(args) -> dict:
    """Start the set-up, run the study, read it back, stop everything; report the figures."""
    from attnstudy.executors.distributed import LocalRayHead, _ray
    from attnstudy.report.store import load_study
    from attnstudy.tracking import Role, Tracker, store

    from .cluster_kit import (
        ThrowawayPostgres,
        mlflow_db_upgrade,
        start_tracking_server,
        stop_process,
    )

    n = args.models or (6 if args.smoke else 1000)
    with tempfile.TemporaryDirectory(prefix="attnstudy-bench-scale-") as tmp:
        base = Path(tmp)
        pg = ThrowawayPostgres()
        server = head = ray = None
        try:
            with contextlib.ExitStack() as stack, common.project_root(base / "root"):
                pg.start()
                upgrade_s, _ = common.timed(lambda: mlflow_db_upgrade(pg.uri, pg.env))
                log = base / "server.log"
                server, url = start_tracking_server(
                    pg.uri, base / "artifacts", log, pg.env, workers=args.server_workers
                )
                empty_mb = pg.database_size() / 2**20
                head = LocalRayHead(
                    num_cpus=args.ray_cpus, env={"ATTNSTUDY_ROOT": str(base)} | QUIET
                )
                address = head.start()
                stack.enter_context(
                    _environment(
                        head.driver_env() | QUIET,
                        ("RAY_USAGE_STATS_ENABLED", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"),
                    )
                )
                ray = _ray(loopback=True)
                ray.init(address=address, logging_level="WARNING")
                train, ablate = _tasks()
                train_task = ray.remote(num_cpus=1, max_retries=0)(train)
                ablate_task = ray.remote(num_cpus=1, max_retries=0)(ablate)

                tracker = Tracker(url)
                exp = tracker.experiment_id("scale")
                t0 = time.time()
                study = store.start_study(tracker, exp, "scale", "scale-study-key", "bench")
                refs = []
                for i in range(n):
                    model_ref = train_task.remote(url, exp, study, i)
                    refs.append(ablate_task.remote(url, exp, study, i, model_ref))
                pairs = ray.get(refs, timeout=args.timeout)
                members = {m: (Role.MODEL, i) for i, (m, _) in enumerate(pairs)}
                members |= {a: (Role.ABLATION, i) for i, (_, a) in enumerate(pairs)}
                store.StudyRecord(tracker, study, exp).write(members, (Role.MODEL, Role.ABLATION))
                tracker.end_run(study)
                t1 = time.time()
                requests = requests_between(log, t0, t1)
                size_mb = pg.database_size() / 2**20
                report_s, data = common.timed(lambda: load_study(tracker, study))
                runs = tracker.search_runs([exp])
        finally:
            if ray is not None:
                ray.shutdown()
            if head is not None:
                head.stop()
            stop_process(server)
            pg.stop()

    finished = sum(r.status == "FINISHED" for r in runs)
    wall = t1 - t0
    total = sum(requests.values())
    rows = [
        {
            "models": n,
            "runs": len(runs),
            "finished": finished,
            "study wall s": wall,
            "server requests": total,
            "requests / s": total / wall,
            "requests / model": total / n,
            "database MiB": size_mb,
            "report read s": report_s,
        }
    ]
    top = ", ".join(f"{k} {v}" for k, v in requests.most_common(6))
    notes = [
        f"server: attnstudy server --workers {args.server_workers} on PostgreSQL "
        f"(mlflow db upgrade {upgrade_s:.1f} s; the empty schema {empty_mb:.1f} MiB); Ray: one "
        f"head on loopback with {args.ray_cpus} logical CPUs, each stub task asking 1",
        f"requests counted from the server's access log between the study run's creation and its "
        f"end (the driver's membership tags included); most frequent: {top}",
        "report read: load_study against the server (one paged search of the members, then "
        "each run's artifact listing: none here)",
        common.load_note(args),
    ]
    common.report(
        f"Cluster scale: a {n:,}-model study of stub tasks through Ray and a PostgreSQL server",
        args,
        {"models": n, "Ray CPUs": args.ray_cpus, "server workers": args.server_workers},
        [("", common.table(rows))],
        notes,
    )
    return {"rows": rows, "entries": len(data.entries), "requests": requests}


def main(argv=None) -> dict:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=None, help="stub models (default 1,000)")
    p.add_argument(
        "--ray-cpus", type=int, default=4, help="the Ray head's logical CPUs: tasks at once"
    )
    p.add_argument(
        "--server-workers", type=int, default=2, help="attnstudy server --workers (default 2)"
    )
    p.add_argument(
        "--timeout", type=float, default=3600, help="seconds the study may take (default 3600)"
    )
    args = p.parse_args(argv)
    if args.models is not None and args.models < 1:
        p.error(f"--models must be at least 1, got {args.models}")
    common.setup(args)
    return run(args)


if __name__ == "__main__":
    main()
