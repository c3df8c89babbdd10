"""``attnstudy server`` and its database (NEW-8 of the 2026-12-06 review).

* Against a database that does not answer, ``attnstudy server`` retried for minutes, printing
  MLflow's and SQLAlchemy's tracebacks: it now stops in one ``attnstudy: error:`` line naming the
  database and what to do (exit 1).
* Its ``/health`` answered 200 while PostgreSQL was down, so a driver's pre-flight check passed:
  it now answers 503 naming the database, and the driver's check says "database down".
* It answered 200 while its artifact store (moto's S3 server) was stopped: it now checks the
  artifact store too and names the part that is down.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prerequisites import require

from attnstudy.executors.distributed import free_port


def test_a_server_whose_database_refuses_stops_in_one_line(tmp_path):
    port = free_port()  # nothing listens there: the connection is refused at once
    uri = f"postgresql+psycopg://u@127.0.0.1:{port}/mlflow"
    res = subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", "server", "--backend-store-uri", uri]
        + ["--artifacts", "art", "--port", str(free_port())],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,  # a hang fails the test instead of the suite
        env=dict(os.environ, ATTNSTUDY_DEBUG=""),
    )
    assert res.returncode == 1, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith(f"attnstudy: error: the database {uri} does not answer ("), line
    assert "Connection refused" in line and "start the database" in line, line
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert not (tmp_path / "art").exists()  # nothing was created


def test_the_database_bound_is_in_the_help():
    from attnstudy.serving.server_app import CHECK_BOUND_S

    res = subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", "server", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"does not answer within {CHECK_BOUND_S} s" in " ".join(res.stdout.split())


@pytest.mark.slow
def test_health_fails_while_the_database_is_down(tmp_path):
    """The cluster test's throwaway PostgreSQL and ``attnstudy server`` on it: /health 200; the
    postmaster stopped: /health 503 naming the database, and the driver's pre-flight check
    (:func:`check_server`) fails saying "database down"."""
    _postgres_prerequisites()
    from attnstudy.tracking.client import TrackingError, check_server
    from benchmarks.cluster_kit import ThrowawayPostgres, start_tracking_server, stop_process

    pg = server = None
    try:
        pg = ThrowawayPostgres().start()
        server, url = start_tracking_server(
            pg.uri, tmp_path / "artifacts", tmp_path / "server.log", pg.env
        )
        with urllib.request.urlopen(url + "/health", timeout=30) as resp:
            assert (resp.status, resp.read()) == (200, b"OK")
        check_server(url, 10)  # passes

        pg.proc.send_signal(2)  # SIGINT: PostgreSQL's fast shutdown
        pg.proc.wait(60)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(url + "/health", timeout=30)
        body = caught.value.read().decode()
        assert caught.value.code == 503, body
        assert body.startswith(f"the database {pg.uri} does not answer: "), body
        assert "Connection refused" in body, body
        with pytest.raises(TrackingError) as down:
            check_server(url, 3)
        message = str(down.value)
        assert message.startswith(f"database down: tracking server {url} answers, but "), message
        assert "start the database" in message
        assert server.poll() is None  # the server itself still runs
    finally:
        stop_process(server)
        if pg is not None:
            pg.stop()


def _postgres_prerequisites() -> None:
    """As the cluster test's: psycopg and Debian's initdb (a failure under ``CI=true``)."""
    import importlib.util

    from prerequisites import require

    require(importlib.util.find_spec("psycopg") is not None, "psycopg ([distributed] extra)")
    from benchmarks.cluster_kit import initdb_path

    require(initdb_path() is not None, "Debian's postgresql (/usr/lib/postgresql/*/bin/initdb)")
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            require(False, "a 'postgres' user to run initdb as (Debian's postgresql creates it)")


def test_health_names_a_down_artifact_store(monkeypatch, tmp_path):
    """An S3 outage: with moto stopped, ``/health`` answered 200 while every artifact
    call through the server failed. It now checks the server's ``--artifacts-destination`` too
    (the variable ``mlflow server`` hands its workers) and names the part that is down."""
    require(
        all(importlib.util.find_spec(m) is not None for m in ("boto3", "moto")),
        "boto3 and moto[server] (make test-deps installs both)",
    )
    from moto.server import ThreadedMotoServer

    from attnstudy.serving.server_app import (
        ARTIFACTS_DESTINATION_VAR as ARTIFACTS_DESTINATION_ENV_VAR,
    )
    from attnstudy.serving.server_app import health

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "MLFLOW_S3_ENDPOINT_URL": url,
        ARTIFACTS_DESTINATION_ENV_VAR: "s3://team/mlflow",
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("MLFLOW_BACKEND_STORE_URI", raising=False)  # the database: not checked
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    try:
        import boto3

        boto3.client("s3", endpoint_url=url).create_bucket(Bucket="team")
        assert health() == ("OK", 200)
        monkeypatch.setenv(ARTIFACTS_DESTINATION_ENV_VAR, "s3://no-bucket/mlflow")
        body, code = health()
        assert code == 503 and body.startswith(
            f"the artifact store s3://no-bucket/mlflow at {url} does not answer: "
        ), body
        assert "NoSuchBucket" in body and "database" not in body
    finally:
        moto.stop()
    monkeypatch.setenv(ARTIFACTS_DESTINATION_ENV_VAR, "s3://team/mlflow")
    body, code = health()  # moto stopped: nothing listens on its port
    assert code == 503, body
    assert body.startswith(
        f"the artifact store s3://team/mlflow at {url} does not answer: Could not connect to "
        "the endpoint URL"
    ), body
    # a folder: it must exist and be writable
    monkeypatch.setenv(ARTIFACTS_DESTINATION_ENV_VAR, str(tmp_path))
    assert health() == ("OK", 200)
    monkeypatch.setenv(ARTIFACTS_DESTINATION_ENV_VAR, str(tmp_path / "gone"))
    assert health() == (
        f"the artifact store {tmp_path / 'gone'} does not answer: no folder {tmp_path / 'gone'}",
        503,
    )


def test_health_names_each_part_that_is_down(monkeypatch, tmp_path):
    """Database and artifact store both down: one line each, the database first (the client
    names the first)."""
    from attnstudy.serving.server_app import (
        ARTIFACTS_DESTINATION_VAR as ARTIFACTS_DESTINATION_ENV_VAR,
    )
    from attnstudy.serving.server_app import health

    uri = f"postgresql+psycopg://u@127.0.0.1:{free_port()}/mlflow"
    require(importlib.util.find_spec("psycopg") is not None, "psycopg ([distributed] extra)")
    monkeypatch.setenv("MLFLOW_BACKEND_STORE_URI", uri)
    monkeypatch.setenv(ARTIFACTS_DESTINATION_ENV_VAR, str(tmp_path / "gone"))
    body, code = health()
    lines = body.splitlines()
    assert code == 503 and len(lines) == 2, body
    assert lines[0].startswith(f"the database {uri} does not answer: "), body
    assert lines[1] == f"the artifact store {tmp_path / 'gone'} does not answer: no folder " + str(
        tmp_path / "gone"
    )


def test_the_artifacts_variable_is_mlflows():
    """The variable through which ``mlflow server`` hands ``--artifacts-destination`` to its
    workers, read from MLflow's source (importing it would import the whole server)."""
    from pathlib import Path

    from attnstudy.serving.server_app import ARTIFACTS_DESTINATION_VAR

    (package,) = importlib.util.find_spec("mlflow").submodule_search_locations  # not imported
    constants = (Path(package) / "server" / "constants.py").read_text()
    assert f'ARTIFACTS_DESTINATION_ENV_VAR = "{ARTIFACTS_DESTINATION_VAR}"' in constants


def test_the_schema_check_names_the_revision_found_and_the_one_needed(tmp_path):
    """``--workers N`` needs the schema at the installed MLflow's revision
    (tests/distributed/test_server_workers.py runs it on PostgreSQL): an older revision is named
    with the one needed, a database without MLflow's tables says so, a current one passes."""
    import sqlite3

    from mlflow.store.db.utils import _get_latest_schema_revision

    from attnstudy.serving.server_app import schema_problem

    head = _get_latest_schema_revision()
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        conn.execute("INSERT INTO alembic_version VALUES ('0123abcd')")
    uri = f"sqlite:///{db}"
    assert (
        schema_problem(uri)
        == f"its MLflow schema is at revision 0123abcd, this MLflow needs {head}"
    )
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (head,))
    assert schema_problem(uri) is None
    assert schema_problem(f"sqlite:///{tmp_path / 'empty.db'}") == "it holds no MLflow schema"
