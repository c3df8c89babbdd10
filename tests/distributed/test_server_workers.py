"""``attnstudy server --workers 2`` on PostgreSQL, once ``mlflow db upgrade`` has run.

A throwaway PostgreSQL cluster on loopback (Debian's ``initdb``, as tests/distributed/test_cluster.py):
on its fresh database ``--workers 2`` is refused in one line naming ``mlflow db upgrade`` (the
schema is created by that one explicit step, not by a start); after ``mlflow db upgrade`` the server starts
with two uvicorn workers, eight client threads create 48 runs with their params, metrics and tags
at once, every one is recorded whole, and both workers have answered (each holds a connection to
the database, which a worker opens when it serves its first tracking request).

Time bound: PostgreSQL and the upgrade within 5 min, the server within 180 s, the clients within
5 min (about 90 s in all on this 2-core machine under a load of 11). Not skipped under
``CI=true``: a missing PostgreSQL or extra fails there (tests/prerequisites.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prerequisites import require

pytestmark = pytest.mark.slow
THREADS, RUNS_EACH = 8, 6


def _prerequisites() -> None:
    missing = [m for m in ("psycopg", "psutil") if importlib.util.find_spec(m) is None]
    require(not missing, f"the [distributed] extra is not installed (no {', '.join(missing)})")
    from benchmarks.cluster_kit import initdb_path

    require(initdb_path() is not None, "Debian's postgresql (/usr/lib/postgresql/*/bin/initdb)")
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            require(False, "a 'postgres' user to run initdb as (Debian's postgresql creates it)")


@pytest.fixture
def postgres():
    _prerequisites()
    from benchmarks.cluster_kit import ThrowawayPostgres

    pg = ThrowawayPostgres()
    try:
        yield pg.start()
    finally:
        pg.stop()


def _workers(server: subprocess.Popen) -> list[int]:
    """The uvicorn worker processes under ``attnstudy server`` (multiprocessing's spawned
    children of uvicorn's supervisor; its resource tracker left out)."""
    import psutil

    from benchmarks.cluster_kit import tree_pids

    out = []
    for pid in tree_pids(server):
        try:
            if "spawn_main" in " ".join(psutil.Process(pid).cmdline()):
                out.append(pid)
        except psutil.Error:
            pass
    return sorted(out)


def _connected_to(pids: list[int], port: int) -> set[int]:
    """Which of ``pids`` hold a TCP connection to ``127.0.0.1:port``."""
    import psutil

    out = set()
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        if any(c.raddr and c.raddr.port == port for c in conns):
            out.add(pid)
    return out


def test_two_workers_after_mlflow_db_upgrade(postgres, tmp_path: Path):
    from attnstudy.tracking import Tracker
    from benchmarks.cluster_kit import mlflow_db_upgrade, start_tracking_server, stop_process

    # a fresh database: refused before any server process starts, in one line
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnstudy.cli",
            "server",
            "--backend-store-uri",
            postgres.uri,
            "--artifacts",
            str(tmp_path / "artifacts"),
            "--port",
            "1",  # never bound: the refusal comes first
            "--workers",
            "2",
        ],
        env=dict(os.environ) | postgres.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1, refused.stderr
    line = refused.stderr.strip()
    assert line.count("\n") == 0, line
    assert line.startswith(
        "attnstudy: error: --workers 2 needs the database's MLflow schema created and current, "
        "but it holds no MLflow schema; "
    ), line
    assert f"run `mlflow db upgrade {postgres.uri}` once" in line, line
    assert postgres.password not in line

    mlflow_db_upgrade(postgres.uri, postgres.env)
    server, url = start_tracking_server(
        postgres.uri, tmp_path / "artifacts", tmp_path / "server.log", postgres.env, workers=2
    )
    try:
        workers = _workers(server)
        assert len(workers) == 2, workers
        tracker = Tracker(url)
        exp = tracker.experiment_id("two-workers")

        def client(i: int) -> list[str]:
            t = Tracker(url)
            ids = []
            for j in range(RUNS_EACH):
                run = t.start_run(exp, f"run-{i}-{j}")
                t.log_params(run, {"thread": i, "index": j})
                t.log_metrics(run, {"value": i * 100 + j}, step=0)
                t.set_tags(run, {"who": f"{i}/{j}"})
                t.end_run(run)
                ids.append(run)
            return ids

        with ThreadPoolExecutor(THREADS) as pool:
            made = [r for ids in pool.map(client, range(THREADS)) for r in ids]
        assert len(set(made)) == THREADS * RUNS_EACH == 48
        runs = {r.name: r for r in tracker.search_runs([exp])}
        assert len(runs) == 48
        for i in range(THREADS):
            for j in range(RUNS_EACH):
                r = runs[f"run-{i}-{j}"]
                assert r.status == "FINISHED", (r.name, r.status)
                assert r.params == {"thread": str(i), "index": str(j)}, r.params
                assert r.metrics["value"] == i * 100 + j
                assert r.tags["who"] == f"{i}/{j}"
        # both workers answer tracking requests (each opens its own database connections): the
        # kernel hands each new connection to one worker's accept, unevenly under load, so more
        # requests on fresh connections until both have answered one (bounded)
        deadline = time.monotonic() + 60
        probe = f"{url}/api/2.0/mlflow/experiments/get-by-name?experiment_name=two-workers"
        while _connected_to(workers, postgres.port) != set(workers):
            assert time.monotonic() < deadline, (_connected_to(workers, postgres.port), workers)
            for _ in range(8):
                with urllib.request.urlopen(probe, timeout=30) as answer:
                    assert json.loads(answer.read())["experiment"]["experiment_id"] == exp
        assert _workers(server) == workers  # neither worker was restarted
    finally:
        stop_process(server)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]
