"""A new SQLite store starts as a copy of an empty one.

MLflow creates a SQLite store by running its schema migrations one after another (~0.8 s of CPU
with MLflow 3.17, most of a short command's fixed work); opening a store whose schema is already
current takes ~0.03 s. So the migrations run once per installed MLflow version, into an empty store
kept in the cache (:func:`attnstudy.data.g2p_align.cache_dir`, ``mlflow-empty-store-<version>.db``:
the schema, MLflow's ``default`` workspace row and no experiment), and every new store is a copy of
it. MLflow then creates the ``Default`` experiment on the first open, as it would have in a
migrated store: with the artifact location of the store being created, never the cache's.

A file of the cached store's name that is not such an empty store is not the tool's: it is left as
it is, with a notice, and so is the creation to MLflow's migrations (as when the cache cannot be
written or read).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MAX_BYTES = 16 * 2**20
"""A cached empty store larger than this is not one (MLflow 3.17's is ~0.4 MB): not copied."""


def cached_path() -> Path:
    """Where the empty store of the installed MLflow version is kept."""
    import mlflow

    from ..data.g2p_align import cache_dir

    return cache_dir() / f"mlflow-empty-store-{mlflow.__version__}.db"


@contextmanager
def new_sqlite_file(folder: Path, prefix: str) -> Iterator[Path]:
    """A free name in ``folder`` for a SQLite file being created (``mkstemp``'s, the file itself
    removed: SQLite creates it). On leaving, what is still at that name — the file unless it was
    renamed away, its journal, WAL and shared-memory files — is removed.

    Raises:
        OSError: ``folder`` cannot be written.
    """
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".creating")
    os.close(fd)
    os.unlink(tmp)  # SQLite creates it; the name is ours
    try:
        yield Path(tmp)
    finally:
        for suffix in ("", "-journal", "-wal", "-shm"):
            Path(tmp + suffix).unlink(missing_ok=True)


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
    with new_sqlite_file(path.parent, f".{path.name}.") as tmp:
        MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)
        with sqlite3.connect(tmp) as db:
            db.execute("DELETE FROM experiment_tags")
            db.execute("DELETE FROM experiments")
        with sqlite3.connect(tmp) as db:
            db.execute("VACUUM")
        os.replace(tmp, path)


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
    """Copy the cached empty store (built on first use) to ``target``, a new file of the
    caller's. Returns whether it did; False (``target`` absent) when the cache cannot be used,
    or when a file of its name is not an empty store (left as it is, with a notice): the caller
    then creates the store as MLflow does."""
    from attnstudy.runtime.notices import notice

    try:
        path = cached_path()
        if not path.exists() and not path.is_symlink():
            _build(path)
        elif not _is_empty_store(path):
            notice(
                f"{path} is not an empty MLflow store attnstudy made: it is left as it is, and new "
                "tracking stores are created by MLflow's migrations (slower) until it is removed"
            )
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
