"""D23: what libraries print themselves stays out of the CLI's output unless ``--verbose``.

Before: with a tracking server, every run's end printed MLflow's "🏃 View run … at: http://…" and
"🧪 View experiment at: …" on stdout between attnstudy's own lines; library warnings (matplotlib's
UserWarnings, MLflow's, alembic's INFO lines) reached stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_in_process import run_cli

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
ADDITIVE_ONLY = 'models=[{model={attention="additive",flow="bahdanau"}}]'

# a verb whose work is replaced by what libraries do on their own: a Python warning (torch,
# transformers, pydantic, matplotlib), an MLflow WARNING, an alembic INFO line. One process
# imports what the CLI's start imports, then runs each case (argv, environment) in a child forked
# from it before any case ran: every case starts from a fresh process's state (warnings shown
# once per place, logging, environment, MLflow imported by the case), and the cold start of the
# imports (~5 s CPU) is paid once instead of once per case. A child writes its stdout and stderr
# to OUT/<i>.out and OUT/<i>.err and ends as the process would (sys.exit: atexit, flushing); the
# parent writes each child's exit status to OUT/<i>.code and nothing else.
NOISY = """
import json, logging, os, sys, warnings
from pathlib import Path
from attnstudy import api
from attnstudy.cli import main as cli

def report(*args, **kwargs):
    warnings.warn("torch says: this is deprecated", UserWarning)
    logging.getLogger("mlflow.tracking.fluent").warning("mlflow says: look at me")
    logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
    return Path("out/report.html")

api.report = report
out = Path(sys.argv[1])
for i, (argv, env) in enumerate(json.loads(sys.argv[2])):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.environ.update(env)
        for fd, suffix in ((1, "out"), (2, "err")):
            f = os.open(out / f"{i}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(f, fd)
            os.close(f)
        sys.exit(cli.main(argv))
    (out / f"{i}.code").write_text(str(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])))
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


def test_library_warnings_and_logs_only_with_verbose(store, tmp_path):
    cases = [
        (["report"], {}),
        (["--verbose", "report"], {}),
        (["report", "--verbose"], {}),  # after the verb too
        (["report"], {"ATTNSTUDY_VERBOSE": "1"}),
    ]
    out = tmp_path / "cases"
    out.mkdir()
    parent = run([sys.executable, "-c", NOISY, str(out), json.dumps(cases)], store)
    # what the imports printed would have been in every case's output
    assert parent.returncode == 0 and parent.stdout == parent.stderr == "", parent.stderr
    results = [
        subprocess.CompletedProcess(
            argv,
            int((out / f"{i}.code").read_text()),
            (out / f"{i}.out").read_text(),
            (out / f"{i}.err").read_text(),
        )
        for i, (argv, _) in enumerate(cases)
    ]
    quiet, *louds = results
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "report: out/report.html\n" and quiet.stderr == ""
    for loud in louds:
        assert loud.returncode == 0 and loud.stdout == "report: out/report.html\n", loud.stderr
        assert all(line in loud.stderr for line in LIBRARY_LINES), (loud.args, loud.stderr)


@pytest.mark.slow
def test_view_run_lines_only_with_verbose(fresh_root, tmp_path, capfd):
    """With a tracking server, MLflow prints two lines per ended run unless told not to. The
    trainings run ``cli.main`` in the test process (tests/cli_in_process.py): MLflow decides at
    each run's end, from ``$MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT`` as the CLI set it, whether it
    writes the lines to stdout, so no process boundary is tested; ~5 s CPU of imports saved
    per training."""
    from attnstudy.serving import ui

    port = ui.free_port()
    server = ui.start_server(
        f"sqlite:///{tmp_path / 'server.db'}", tmp_path / "artifacts", port=port
    )
    # as run() gives a process: this root, none of the variables a case does not set
    env = {
        "ATTNSTUDY_ROOT": str(fresh_root),
        **dict.fromkeys(("MLFLOW_TRACKING_URI", "ATTNSTUDY_VERBOSE", "PYTHONWARNINGS")),
    }
    try:
        ui.wait_healthy(f"http://127.0.0.1:{port}", 120, server)
        train = [
            "train",
            str(TINY),
            *("--set", ADDITIVE_ONLY, "--set", "training.epochs=1", "--quiet", "--retrain"),
            *("--tracking-uri", f"http://127.0.0.1:{port}"),
        ]
        quiet = run_cli(capfd, train, cwd=fresh_root, env=env)
        loud = run_cli(capfd, [*train, "--verbose"], cwd=fresh_root, env=env)
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
