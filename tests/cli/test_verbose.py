"""D23: what libraries print themselves stays out of the CLI's output unless ``--verbose``.

Before: with a tracking server, every run's end printed MLflow's "🏃 View run … at: http://…" and
"🧪 View experiment at: …" on stdout between attnstudy's own lines; library warnings (matplotlib's
UserWarnings, MLflow's, alembic's INFO lines) reached stderr.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
ADDITIVE_ONLY = 'models=[{model={attention="additive",flow="bahdanau"}}]'

# a verb whose work is replaced by what libraries do on their own: a Python warning (torch,
# transformers, pydantic, matplotlib), an MLflow WARNING, an alembic INFO line
NOISY = """
import logging, sys, warnings
from pathlib import Path
from attnstudy import api, cli

def report(*args, **kwargs):
    warnings.warn("torch says: this is deprecated", UserWarning)
    logging.getLogger("mlflow.tracking.fluent").warning("mlflow says: look at me")
    logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
    return Path("out/report.html")

api.report = report
sys.exit(cli.main(sys.argv[1:]))
"""
LIBRARY_LINES = ("UserWarning", "torch says", "mlflow says", "Context impl SQLiteImpl")


def run(args: list[str], root: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, ATTNSTUDY_ROOT=str(root), **(env or {}))
    for var in ("MLFLOW_TRACKING_URI", "ATTNSTUDY_VERBOSE", "PYTHONWARNINGS"):
        if var not in (env or {}):
            full.pop(var, None)
    return subprocess.run(args, capture_output=True, text=True, env=full, cwd=root, timeout=300)


@pytest.fixture
def store(fresh_root):
    from attnstudy.tracking import Tracker

    Tracker()  # an empty store, so `report` gets as far as its work
    return fresh_root


def test_library_warnings_and_logs_only_with_verbose(store):
    quiet = run([sys.executable, "-c", NOISY, "report"], store)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "report: out/report.html\n" and quiet.stderr == ""
    for argv, env in (
        (["--verbose", "report"], None),
        (["report", "--verbose"], None),  # after the verb too
        (["report"], {"ATTNSTUDY_VERBOSE": "1"}),
    ):
        loud = run([sys.executable, "-c", NOISY, *argv], store, env)
        assert loud.returncode == 0 and loud.stdout == "report: out/report.html\n", loud.stderr
        assert all(line in loud.stderr for line in LIBRARY_LINES), (argv, loud.stderr)


@pytest.mark.slow
def test_view_run_lines_only_with_verbose(fresh_root, tmp_path):
    """With a tracking server, MLflow prints two lines per ended run unless told not to."""
    from attnstudy import ui

    port = ui.free_port()
    server = ui.start_server(
        f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "artifacts", port=port
    )
    try:
        ui.wait_healthy(f"http://127.0.0.1:{port}", 120, server)
        train = [
            sys.executable,
            "-m",
            "attnstudy.cli",
            "train",
            str(TINY),
            *("--set", ADDITIVE_ONLY, "--set", "training.epochs=1", "--quiet", "--retrain"),
            *("--tracking-uri", f"http://127.0.0.1:{port}"),
        ]
        quiet = run(train, fresh_root)
        loud = run([*train, "--verbose"], fresh_root)
    finally:
        ui.stop_server(server)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout.startswith("trained copy/additive-bahdanau/seed1: runs:/"), quiet.stdout
    assert len(quiet.stdout.splitlines()) == 1 and quiet.stderr == "", quiet.stdout + quiet.stderr
    assert loud.returncode == 0, loud.stderr
    lines = loud.stdout.splitlines()
    assert lines[0].startswith("🏃 View run copy/additive-bahdanau/seed1 at: http://127.0.0.1:")
    assert lines[1].startswith("🧪 View experiment at: http://127.0.0.1:")
    assert lines[2].startswith("trained copy/additive-bahdanau/seed1: runs:/") and len(lines) == 3
