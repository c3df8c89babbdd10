"""A SQLite store writes beside its database and nowhere else: never into the working directory.

Before: a read-only store was opened as ``sqlite:///file:<db>?mode=ro&uri=true``, and MLflow
creates the folders of a ``sqlite:///`` path before it connects, so ``file:/…/mlruns`` appeared
as a tree in the working directory (the suite left ``./file:/tmp/pytest-of-root/…`` in the
repository). A user's ``--tracking-uri sqlite:///file:…`` (or ``?…``, ``%…``, ``~/…``) could do
the same. And the artifacts of a store named by ``--tracking-uri sqlite:///ELSEWHERE/mlflow.db``
went to the project's ``mlruns/artifacts`` (the working directory's, without ``ATTNSTUDY_ROOT``),
not beside the database (the suite filled the repository's ``mlruns/artifacts/``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from attnstudy.cli import main as cli
from attnstudy.config import ConfigError, sqlite_database
from attnstudy.tracking import Tracker


def tree(folder: Path) -> list[str]:
    """Every path under ``folder``, relative and sorted."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def places(tmp_path, monkeypatch):
    """An empty working directory, an empty project root (``ATTNSTUDY_ROOT``) and a store folder
    elsewhere; no tracking URI from the environment."""
    cwd, project, store = (tmp_path / name for name in ("cwd", "project", "store"))
    for folder in (cwd, project, store):
        folder.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(project))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return cwd, project, store


def test_artifacts_go_beside_the_sqlite_database(places):
    cwd, project, store = places
    tracker = Tracker(f"sqlite:///{store / 'mlflow.db'}")
    exp = tracker.experiment_id("located")
    run = tracker.start_run(exp, "r")
    tracker.log_text(run, "hello", "notes/hello.txt")
    tracker.end_run(run)

    assert tracker.artifact_location(exp) == (store / "artifacts" / "located").as_uri()
    written = store / "artifacts" / "located" / run / "artifacts" / "notes" / "hello.txt"
    assert written.read_text(encoding="utf-8") == "hello"
    assert tree(cwd) == [] and tree(project) == []


def test_a_relative_sqlite_uri_is_read_from_the_working_directory(places):
    cwd, project, _ = places
    tracker = Tracker("sqlite:///rel/mlflow.db")
    exp = tracker.experiment_id("relative")
    assert tracker.artifact_location(exp) == (cwd / "rel" / "artifacts" / "relative").as_uri()
    assert (cwd / "rel" / "mlflow.db").is_file() and tree(project) == []


def test_a_read_only_store_is_read_without_writing_into_the_working_directory(places, monkeypatch):
    cwd, _, store = places
    db = store / "mlflow.db"
    Tracker(f"sqlite:///{db}").experiment_id("kept")
    real_access = os.access

    def access(path, mode, *args, **kwargs):  # as root, the store's folder read-only
        inside = Path(path).resolve().is_relative_to(store.resolve())
        return False if inside and mode & os.W_OK else real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    tracker = Tracker(f"sqlite:///{db}", create=False)

    assert tracker.experiment_id("kept", create=False) is not None
    assert tree(cwd) == []
    assert "mode=ro" in tracker.client_uri and tracker.uri == f"sqlite:///{db}"


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("sqlite:///file:{store}/mlflow.db?mode=ro&uri=true", "has '?' options"),
        ("sqlite:///file:{store}/mlflow.db", "is a SQLite 'file:' URI filename"),
        ("sqlite:///{store}/new%20folder/mlflow.db", "has '%' escapes"),
        ("sqlite:///~/mlflow.db", "starts with '~'"),
        ("sqlite+pysqlite:///{store}/mlflow.db", "the 'sqlite+pysqlite' scheme is not read"),
        ("sqlite://host/mlflow.db", "names no local database file"),
        ("sqlite:///:memory:", "in-memory store"),
        ("sqlite://", "in-memory store"),
    ],
)
def test_a_sqlite_uri_read_with_doubt_is_refused_in_one_line(places, capsys, uri, problem):
    cwd, project, store = places
    uri = uri.format(store=store)
    with pytest.raises(ConfigError, match="^tracking URI .*" + re.escape(problem)):
        sqlite_database(uri)

    tiny = Path(__file__).parents[2] / "experiments" / "tiny.toml"
    code = cli.main(["train", str(tiny), "--tracking-uri", uri, "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and err[0].startswith("attnstudy: error: tracking URI")
    assert problem in err[0]
    assert tree(cwd) == [] and tree(project) == [] and tree(store) == []


def test_a_plain_sqlite_uri_names_its_database():
    assert sqlite_database("sqlite:////abs/st ore#1/mlflow.db") == Path("/abs/st ore#1/mlflow.db")
    assert sqlite_database("http://127.0.0.1:5000") is None
