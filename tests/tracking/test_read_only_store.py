"""D20: a store that can be read but not written (a read-only mount, a read-only copy).

Before: ``ablate`` printed SQLAlchemy's "(raised as a result of Query-invoked autoflush; consider
using a session.no_autoflush block …)"; ``report`` wrote the report, then exited 1 with
"[Errno 30] Read-only file system: …/.artifact.uploading.…".

How the store is made read-only here, deterministically and as root (the tests run as root, which
ignores permission bits, and a mount namespace is not available everywhere): the operating system's
answer is replaced at the two places the store meets it. ``os.access`` says the store's folder and
database are not writable, so the tracker opens SQLite in its read-only mode (``mode=ro``) and
SQLite itself refuses every write ("attempt to write a readonly database"); and the local artifact
repository's writes raise ``EROFS``, as a read-only file system does. Where ``unshare -m`` works, one
more test mounts the store read-only for real.
"""

from __future__ import annotations

import errno
import os
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from attnstudy.cli import main as cli


@pytest.fixture
def read_only(store_root, monkeypatch):
    """The session store, read-only for this test (nothing can be written to it)."""
    from mlflow.store.artifact.local_artifact_repo import LocalArtifactRepository

    store = (store_root / "mlruns").resolve()
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        inside = Path(path).resolve().is_relative_to(store)
        return False if inside and mode & os.W_OK else real_access(path, mode, *args, **kwargs)

    def erofs(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(Path(self.artifact_dir) / ".tmp"))

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(LocalArtifactRepository, "log_artifact", erofs)
    monkeypatch.setattr(LocalArtifactRepository, "log_artifacts", erofs)
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(store_root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return store_root


def main(capsys, *argv: str) -> tuple[int, str, list[str]]:
    capsys.readouterr()
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, [line for line in out.err.splitlines() if line.strip()]


def count_runs(root: Path) -> int:
    with sqlite3.connect(f"file:{root / 'mlruns' / 'mlflow.db'}?mode=ro", uri=True) as con:
        return con.execute("select count(*) from runs").fetchone()[0]


def test_ablate_on_a_read_only_store_says_so_in_one_line(tiny_models, read_only, capsys):
    before = count_runs(read_only)
    code, out, err = main(
        capsys,
        "ablate",
        f"runs:/{tiny_models[0].run_id}",
        *("--n-examples", "1", "--ablations", "uniform", "--quiet"),
    )
    db = read_only / "mlruns" / "mlflow.db"
    assert code == cli.EXIT_FAILED and out == ""
    assert err == [
        f"attnstudy: error: the tracking store sqlite:///{db} is read-only (its database is "
        "read-only); this command writes to it: use a writable copy (--tracking-uri, "
        "MLFLOW_TRACKING_URI or ATTNSTUDY_ROOT) or get write access"
    ]
    assert count_runs(read_only) == before


@pytest.mark.slow
def test_report_on_a_read_only_store_is_written_and_says_it_is_not_logged(
    tiny_study, read_only, figures_not_drawn, tmp_path, capsys
):
    out_dir = tmp_path / "elsewhere"
    study = tiny_study.study_run_id
    code, out, err = main(capsys, "report", "--study", study, "--out", str(out_dir))
    assert code == cli.EXIT_OK
    assert out == f"report: {out_dir.resolve() / 'report.html'}\n"
    assert (out_dir / "report.md").is_file()
    assert len(err) == 1 and err[0].startswith(
        f"attnstudy: note: the report is written to {out_dir.resolve()} but not logged to the "
        f"study run {study}: the tracking store sqlite:///{read_only / 'mlruns' / 'mlflow.db'} "
        "is read-only (Read-only file system: "
    ), err


def _unshare_available() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_available(), reason="needs a mount namespace (unshare -m)")
def test_a_read_only_mount_gives_the_same_lines(tiny_study, tiny_models, store_root, tmp_path):
    """The same store mounted read-only for real (in a private mount namespace)."""
    store = store_root / "mlruns"
    env = dict(os.environ, ATTNSTUDY_ROOT=str(store_root), PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("MLFLOW_TRACKING_URI", None)
    py = f"{sys.executable} -m attnstudy.cli"
    # the report's figures (drawn by tiny_study) saved undrawn: matplotlib's drawing was a fifth
    # of this test's time; the command is the console script's entry, as `python -m` runs it
    undrawn = shlex.quote(
        "import sys; from matplotlib.figure import Figure; "
        "Figure.draw = lambda self, renderer: None; sys.argv[0] = 'attnstudy'; "
        "from attnstudy.cli.main import entry; entry()"
    )
    script = (
        f"mount --bind {store} {store} && mount -o remount,bind,ro {store} && "
        f"{py} ablate runs:/{tiny_models[0].run_id} --n-examples 1 --ablations uniform --quiet; "
        f"echo rc=$?; {sys.executable} -c {undrawn} report --study {tiny_study.study_run_id} "
        f"--out {tmp_path / 'r'}; echo rc=$?"
    )
    res = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    codes = [line for line in res.stdout.splitlines() if line.startswith("rc=")]
    err = [line for line in res.stderr.splitlines() if line.strip()]
    assert codes == ["rc=1", "rc=0"], res.stdout + res.stderr[-2000:]
    assert len(err) == 2, res.stderr[-2000:]
    assert err[0].startswith("attnstudy: error: the tracking store") and "read-only" in err[0]
    assert err[1].startswith("attnstudy: note: the report is written to") and (
        "(Read-only file system: " in err[1]
    )
    assert "autoflush" not in res.stderr and "Errno" not in res.stderr
