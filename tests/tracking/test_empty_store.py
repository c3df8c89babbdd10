"""A new SQLite store is a copy of the cached empty store (MLflow's migrations run once per MLflow
version, not once per store): held equal to a store made by MLflow's own migrations, with the
``Default`` experiment at the new store's artifact location; a file of the cached name that is not an
empty store is never replaced, and a cache that cannot be written falls back to MLflow's creation."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from attnstudy.tracking import Tracker, empty_store


def _dump(db: Path, root: Path) -> list[str]:
    """The database's statements, sorted (VACUUM reorders the schema's entries), with the root
    and the 13-digit millisecond times taken out."""
    with sqlite3.connect(db) as c:
        text = "\n".join(c.iterdump())
    return sorted(re.sub(r"\b\d{13}\b", "T", text.replace(str(root), "ROOT")).splitlines())


def _new_store(root: Path, monkeypatch) -> Tracker:
    (root / "mlruns").mkdir(parents=True)
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = Tracker()
    tracker.experiment_id("an-experiment")
    return tracker


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ATTNSTUDY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_copied_store_equals_one_made_by_mlflows_migrations(tmp_path, cache, monkeypatch):
    copied = tmp_path / "copied"
    _new_store(copied, monkeypatch)
    assert empty_store.cached_path().is_file()  # built on first use, in the cache
    _new_store(tmp_path / "copied-again", monkeypatch)  # from the cached file this time

    with monkeypatch.context() as m:  # the reference: MLflow's own creation
        m.setattr(empty_store, "copy_into", lambda target: False)
        _new_store(tmp_path / "migrated", monkeypatch)
    reference = _dump(tmp_path / "migrated" / "mlruns" / "mlflow.db", tmp_path / "migrated")
    for name in ("copied", "copied-again"):
        assert _dump(tmp_path / name / "mlruns" / "mlflow.db", tmp_path / name) == reference
    with sqlite3.connect(copied / "mlruns" / "mlflow.db") as c:
        (location,) = c.execute("SELECT artifact_location FROM experiments WHERE experiment_id = 0")
    # where MLflow's own creation puts it (the dumps are equal), never under the cache
    assert not location[0].startswith(str(cache)) and location[0].endswith("/0")
    with sqlite3.connect(empty_store.cached_path()) as c:
        assert c.execute("SELECT count(*) FROM experiments").fetchone() == (0,)


def test_a_file_of_the_cached_name_that_is_not_an_empty_store_is_never_replaced(
    tmp_path, cache, monkeypatch, caplog
):
    """A file the tool did not make (not an empty MLflow store: a user's, or a damaged one) is
    left byte for byte, with a notice naming it; the store is created by MLflow's migrations."""
    cache.mkdir()
    sentinel = b"not a database\n" * 100
    empty_store.cached_path().write_bytes(sentinel)
    (cache / "notes.txt").write_text("mine\n")
    tracker = _new_store(tmp_path / "store", monkeypatch)
    assert tracker.experiment_id("an-experiment") == "1"
    assert "is not an empty MLflow store attnstudy made: it is left as it is" in caplog.text
    assert empty_store.cached_path().read_bytes() == sentinel
    assert sorted(p.name for p in cache.iterdir()) == [
        empty_store.cached_path().name,
        "notes.txt",
    ]
    assert (cache / "notes.txt").read_text() == "mine\n"
    assert not [p.name for p in (tmp_path / "store" / "mlruns").iterdir() if "creating" in p.name]


def test_a_cache_that_cannot_be_written_falls_back_to_mlflows_creation(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("mine\n")
    monkeypatch.setenv("ATTNSTUDY_CACHE", str(blocked / "cache"))  # under a file: no folder
    tracker = _new_store(tmp_path / "store", monkeypatch)
    assert tracker.experiment_id("an-experiment") == "1"
    assert blocked.read_text() == "mine\n"


def test_a_sqlite_file_being_created_removes_only_its_own_names(tmp_path):
    """``new_sqlite_file`` cleans up what it made — its own name and that name's journal, WAL and
    shared-memory files — and nothing else in the folder: a store, its journal and any file
    beside it keep their bytes, also when the creation fails half-way."""
    sentinels = {
        "mlflow.db": b"a user's store\n",
        "mlflow.db-journal": b"its journal\n",
        "mlflow.db-wal": b"its write-ahead log\n",
        ".mlflow.db.notes": b"a file with the prefix\n",
    }
    for name, data in sentinels.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(RuntimeError, match="half-way"):
        with empty_store.new_sqlite_file(tmp_path, ".mlflow.db.") as tmp:
            assert not tmp.exists() and tmp.parent == tmp_path
            c = sqlite3.connect(tmp)  # SQLite creates the file, then a WAL beside it
            try:
                c.execute("PRAGMA journal_mode=WAL")
                c.execute("CREATE TABLE t (x)")
                assert Path(f"{tmp}-wal").exists()
                raise RuntimeError("half-way")
            finally:
                c.close()
    left = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert left == sentinels
