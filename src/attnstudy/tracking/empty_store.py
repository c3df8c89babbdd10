"""A new SQLite store starts as a copy of an empty one.

MLflow creates a SQLite store by running its schema migrations one after another (~0.8 s of CPU
with MLflow 3.17, most of a short command's fixed work); opening a store whose schema is already
current takes ~0.03 s. So the migrations run once per installed MLflow version, into an empty store
kept in the cache (:func:`attnstudy.data.g2p_align.cache_dir`, ``mlflow-empty-store-<version>.db``:
the schema, MLflow's ``default`` workspace row and no experiment), and every new store is a copy of
it. MLflow then creates the ``Default`` experiment on the first open, as it would have in a
migrated store: with the artifact location of the store being created, never the cache's.

A cached file that is not an empty store is rebuilt with a notice; a cache that cannot be written
or read leaves the creation to MLflow's migrations, as before.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

MAX_BYTES = 16 * 2**20
"""A cached empty store larger than this is not one (MLflow 3.17's is ~0.4 MB): not copied."""


def cached_path() -> Path:
    """Where the empty store of the installed MLflow version is kept."""
    import mlflow

    from ..data.g2p_align import cache_dir

    return cache_dir() / f"mlflow-empty-store-{mlflow.__version__}.db"


def _build(path: Path) -> None:
    """Create the empty store at ``path`` (atomically: a temporary file of its own, renamed):
    MLflow's migrations, then its ``Default`` experiment removed so that the first open of each
    copy creates it with that store's artifact location.

    Raises:
        OSError: the cache folder cannot be written.
        mlflow.exceptions.MlflowException: MLflow could not create the schema.
    """
    from mlflow.tracking import MlflowClient

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".creating")
    os.close(fd)
    os.unlink(tmp)  # SQLite creates it; the name is ours
    try:
        MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)
        with sqlite3.connect(tmp) as db:
            db.execute("DELETE FROM experiment_tags")
            db.execute("DELETE FROM experiments")
        with sqlite3.connect(tmp) as db:
            db.execute("VACUUM")
        os.replace(tmp, path)
    finally:
        for leftover in (tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"):
            Path(leftover).unlink(missing_ok=True)


def _is_empty_store(path: Path) -> bool:
    """Whether ``path`` is a plain SQLite file of at most :data:`MAX_BYTES` holding MLflow's
    schema (an ``alembic_version`` row) and no experiment, read with the standard library (an
    engine MLflow opened on a bad file stays in its cache)."""
    if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_BYTES:
        return False
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as db:
            (revision,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
            (experiments,) = db.execute("SELECT count(*) FROM experiments").fetchone()
    except (sqlite3.Error, TypeError, ValueError):
        return False
    return bool(revision) and experiments == 0


def copy_into(target: Path) -> bool:
    """Copy the cached empty store to ``target``, a new file of the caller's: built on first use,
    rebuilt with a notice when the cached file is not an empty store. Returns whether it did;
    False (``target`` absent) when the cache cannot be used: the caller then creates the store
    as MLflow does."""
    from ..notices import notice

    try:
        path = cached_path()
        if path.is_symlink():
            return False
        if not path.is_file():
            _build(path)
        elif not _is_empty_store(path):
            notice(f"the cached empty tracking store {path} is not one: rebuilding it")
            _build(path)
        if not _is_empty_store(path):
            return False
        shutil.copyfile(path, target)
        return True
    except Exception:  # noqa: BLE001  only speed is at stake: MLflow's own creation follows
        Path(target).unlink(missing_ok=True)
        return False


def create(tmp: Path) -> None:
    """MLflow's schema and ``Default`` experiment in the new file ``tmp``: a copy of the cached
    empty store opened by MLflow, or MLflow's own migrations when the cache cannot be used.

    Raises:
        mlflow.exceptions.MlflowException: MLflow could not create or open the store.
    """
    from mlflow.tracking import MlflowClient

    copy_into(tmp)
    MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)
