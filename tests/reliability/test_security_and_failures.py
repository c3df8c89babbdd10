"""Security and failure model: nothing executed from caches or stores, paths confined to their runs
and folders, a consistent store after interrupts and crashes, NaN never laundered into a metric.

Each test names the defect it closes (D1 … D24 of the attack on the product) and asserts the right
behaviour; CLI calls are real processes with their own store (helpers from test_reliability), or
``cli_here`` in the test process where a call's process is not what is tested (a refusal that
follows a killed process's leftovers, say).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_reliability import (
    ADDITIVE_ONLY,
    LONG,
    TINY,
    cli,
    cli_here,
    finish,
    ok,
    one_error_line,
    run_ids,
    runs_table,
    start,
    tracker,
)

pytestmark = pytest.mark.slow

FAST = [
    "--set",
    "training.epochs=40",
    "--set",
    "training.patience=1000",
    "--set",
    "data.n_train=10",
    "--set",
    "data.n_dev=2",
    "--set",
    "data.n_test=2",
    "--set",
    "training.early_stopping=loss",
    "--set",
    ADDITIVE_ONLY,
]


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling this would create the marker file
        return (open, (str(self.marker), "w"))


# ----------------------------------------------------------------------------- security


def test_planted_g2p_alignment_cache_runs_no_code_and_is_rebuilt(tmp_path, monkeypatch, caplog):
    """D1: the cache was read with pickle.load from a predictable path: a planted file ran code."""
    from attnstudy.data import g2p_align as ga

    monkeypatch.setenv("ATTNSTUDY_CACHE", str(tmp_path / "cache"))
    train = [("ab", ("A", "B")), ("ba", ("B", "A"))] * 5
    others = [("aab", ("A", "A", "B"))]
    marker = tmp_path / "pwned"
    key = ga.cache_key(
        "planted", "em", ops=ga.OPS, iterations=ga.ITERATIONS, penalty=ga.CHUNK_PENALTY
    )
    folder = ga.cache_dir() / "g2p_align"
    folder.mkdir(parents=True)
    (folder / f"{key}.pkl").write_bytes(pickle.dumps(_Exploit(marker)))  # the old name: never read
    (folder / f"{key}.json.gz").write_bytes(
        pickle.dumps(_Exploit(marker))
    )  # the new name: not JSON
    got = ga.cached_alignments(train, others, "planted", "em")
    assert not marker.exists()
    assert "is unreadable" in caplog.text and "rebuilding it" in caplog.text
    assert got[("aab", ("A", "A", "B"))] is not None
    rows = json.loads(gzip.decompress((folder / f"{key}.json.gz").read_bytes()))
    assert ["aab", ["A", "A", "B"], [list(c) for c in got[("aab", ("A", "A", "B"))]]] in rows
    assert ga.cached_alignments(train, others, "planted", "em") == got  # read back, not recomputed
    import attnstudy

    src = Path(attnstudy.__file__).parent
    assert not [
        p
        for p in src.rglob("*.py")
        if "import pickle" in p.read_text() or "pickle.load" in p.read_text()
    ]


def test_paths_stay_where_they_belong(tiny_models, store_root, tmp_path, capfd):
    """D8, D19: a store tag chose the report folder; `runs:/M/../../N` loaded another run's model."""
    from attnstudy.report import report_dir

    m, n = tiny_models[0].run_id, tiny_models[1].run_id
    res = cli_here(
        capfd,
        store_root,
        "ablate",
        f"runs:/{m}/../../{n}/artifacts/model",
        "--ablations",
        "uniform",
        "--n-examples",
        "1",
        "--quiet",
    )
    assert res.returncode == 2 and "must not hold '..'" in one_error_line(res)
    res = cli_here(capfd, store_root, "predict", f"runs:/{m}//model", "abc")
    assert res.returncode == 2
    os.environ["ATTNSTUDY_ROOT"] = str(store_root)
    root = (store_root / "reports").resolve()
    for hostile in ("/etc/cron.d", "../../outside", "..", ".hidden", "a/b"):
        out = report_dir(hostile)
        assert out.parent == root and ".." not in out.name and not out.name.startswith(".")


def test_ui_server_dies_with_the_cli_and_host_is_validated(tiny_models, store_root):
    """D9: `kill -9` of `attnstudy ui` left a writable MLflow server running; `--host ""` listened on all
    interfaces and then waited 90 s."""
    from attnstudy.serving import ui

    port = ui.free_port()
    proc = start(store_root, "ui", "--port", str(port), "--experiment", "tiny")
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not ui.port_in_use("127.0.0.1", port):
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.5)
    assert ui.port_in_use("127.0.0.1", port)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ui.port_in_use("127.0.0.1", port):
        time.sleep(0.5)
    assert not ui.port_in_use("127.0.0.1", port), "the MLflow server outlived the CLI"
    for host, needle in (("", "--host is empty"), ("999.1.1.1", "does not resolve")):
        res = cli(store_root, "ui", "--host", host, "--port", str(ui.free_port()), timeout=60)
        assert res.returncode == 2 and needle in one_error_line(res)


def test_registered_pyfunc_is_pinned_and_records_no_machine_path(tiny_models, store_root):
    """D22: requirements.txt named a bare `attnstudy` (resolved from a public index by `mlflow models
    serve`) and MLmodel recorded the absolute source path."""
    t = tracker(store_root)
    mv = t.client.get_model_version("tiny-copy-additive-bahdanau", "1")
    assert t.get_run(mv.run_id).status == "FINISHED"
    assert mv.source.startswith("models:/m-")  # the version names its logged model
    model = t.client.get_logged_model(mv.source.removeprefix("models:/"))
    art = Path(model.artifact_location.removeprefix("file://"))
    reqs = (art / "requirements.txt").read_text().split()
    assert all("==" in r for r in reqs if not r.startswith("mlflow")) and not any(
        r == "attnstudy" for r in reqs
    )
    assert (art / "code" / "attnstudy" / "serving" / "pyfunc.py").is_file()  # the code travels
    mlmodel = (art / "MLmodel").read_text()
    for machine in (str(Path(__file__).parents[2]), str(store_root), "/tmp/"):
        assert machine not in mlmodel.replace(model.artifact_location, ""), machine
    assert model.name == "copy-additive-bahdanau"


# ----------------------------------------------------------------------------- consistent store


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.03])
def test_interrupt_during_registration_leaves_a_consistent_store(tmp_path, delay):
    """D5: a READY version pointed at a KILLED run, an empty registered model was left behind, or the
    process locked itself out of its own store."""
    root = tmp_path / "r"
    # one epoch: the interrupt is aimed at the registration, whatever the training's length
    proc = start(root, "train", str(TINY), *LONG, "--set", "training.epochs=1", "--quiet")
    db = root / "mlruns" / "mlflow.db"
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
            n = con.execute("select count(*) from logged_models").fetchone()[0]
            con.close()
            if n:
                break
        except sqlite3.Error:
            pass
        time.sleep(0.002)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 1, err[-2000:]
    con = sqlite3.connect(db)
    runs = con.execute("select status from runs").fetchall()
    versions = con.execute(
        "select r.status from model_versions v join runs r on r.run_uuid = v.run_id"
    ).fetchall()
    empty = con.execute(
        "select count(*) from registered_models m where not exists "
        "(select 1 from model_versions v where v.name = m.name)"
    ).fetchone()[0]
    con.close()
    assert all(s in ("FINISHED", "KILLED") for (s,) in runs), runs
    assert all(s == "FINISHED" for (s,) in versions), versions
    assert empty == 0


def test_double_sigterm_still_ends_the_run(tmp_path):
    """D5: a second SIGTERM 10 ms after the first left the run RUNNING although the CLI said KILLED."""
    root = tmp_path / "r"
    proc = start(root, "train", str(TINY), *LONG, "--quiet")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(
        r["status"] == "RUNNING" and r["kind"] == "model" for r in runs_table(root)
    ):
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert [r["status"] for r in runs_table(root)] == ["KILLED"]


def test_runs_of_a_killed_process_are_reconciled_and_refused(tmp_path, capfd):
    """D6, D24: SIGKILL left runs RUNNING forever; `predict`/`ablate` used them without a word."""
    root = tmp_path / "r"
    proc = start(root, "train", str(TINY), *LONG, "--quiet")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(
        r["status"] == "RUNNING" for r in runs_table(root)
    ):
        time.sleep(0.1)
    time.sleep(1.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (run,) = runs_table(root)
    assert run["status"] == "RUNNING"
    res = cli_here(capfd, root, "predict", f"runs:/{run['id']}", "abc")
    assert (
        res.returncode == 2
        and "is RUNNING (its process" in one_error_line(res)
        and "--force" in res.stderr
    )
    args = ["train", str(TINY), "--set", ADDITIVE_ONLY, "--set", "training.epochs=1", "--quiet"]
    ok(cli_here(capfd, root, *args))
    assert {r["id"]: r["status"] for r in runs_table(root)}[run["id"]] == "KILLED"
    killed = tracker(root).get_run(run["id"])
    assert killed.tags["error.class"] == "OwnerGone"
    ablate = ["ablate", f"runs:/{run['id']}", "--ablations", "uniform", "--n-examples", "1"]
    res = cli_here(capfd, root, *ablate)
    assert res.returncode == 2 and "is KILLED" in one_error_line(res)


def _holds_model(proc: subprocess.Popen, root: Path) -> bool:
    """Whether ``proc`` holds a model's checkpoint lock (its PID written in the lock file)."""
    return any(
        p.read_text().startswith(f"{proc.pid}\n")
        for p in (root / "mlruns" / "checkpoints").glob("*/*/.lock")
    )


def _pause_between_transactions(proc: subprocess.Popen, db: Path, timeout: float = 60) -> None:
    """SIGSTOP ``proc`` at a moment it holds no lock on the SQLite store ``db`` (stopped inside a
    transaction, it would lock every other process out of the store)."""
    deadline = time.monotonic() + timeout
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        con = sqlite3.connect(db, timeout=0, isolation_level=None)
        try:
            con.execute("begin exclusive")  # fails while another connection holds any lock
            con.execute("rollback")
            return
        except sqlite3.OperationalError:
            os.kill(proc.pid, signal.SIGCONT)
            assert time.monotonic() < deadline, f"{db} stayed locked by PID {proc.pid}"
            time.sleep(0.005)
        finally:
            con.close()


def test_two_trainings_of_one_model_do_not_crash_each_other(tmp_path):
    """D2: two trainings with the same model key (also from two experiments) shared one temporary
    checkpoint file and one crashed. Each experiment now keeps its own checkpoints (a training of
    one model in one experiment waits for another: tests/study/test_model_runs.py), so the second
    trains beside the first. The first is held (SIGSTOP) once it holds the model, so the second
    always runs during it, whatever the machine's load (it had 300 epochs, and the luck of
    timing)."""
    root = tmp_path / "r"
    a = start(root, "train", str(TINY), *FAST, "--set", 'experiment.name="alpha"', "--quiet")
    b = None
    try:
        deadline = time.monotonic() + 240
        while not _holds_model(a, root):
            assert a.poll() is None and time.monotonic() < deadline, a.stderr.read()[-2000:]
            time.sleep(0.01)
        _pause_between_transactions(a, root / "mlruns" / "mlflow.db")
        assert _holds_model(a, root) and a.poll() is None
        b = start(root, "train", str(TINY), *FAST, "--set", 'experiment.name="beta"', "--quiet")
        b_res = finish(b)  # while the first is held
    except BaseException:
        for proc in (a, b):
            if proc is not None:
                proc.kill()
        raise
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)
    a_res = finish(a)
    assert a_res.returncode == 0, a_res.stderr[-2000:]
    assert b_res.returncode == 0 and "Traceback" not in b_res.stderr, b_res.stderr[-2000:]
    assert "waiting for PID" not in b_res.stderr
    runs = runs_table(root)
    assert [(r["status"], r["kind"]) for r in runs] == [("FINISHED", "model")] * 2, runs
    checkpoints = root / "mlruns" / "checkpoints"
    assert sorted(p.parent.parent.name for p in checkpoints.glob("*/*/last.pt")) == [
        "alpha",
        "beta",
    ]
    assert not list(checkpoints.rglob("*.tmp"))


def test_corrupt_checkpoint_is_named_before_any_run_is_created(tmp_path, capfd):
    """D13: a truncated checkpoint gave "[Errno 22]" (or torch's advice to load it unsafely) and a
    FAILED run per attempt."""
    root = tmp_path / "r"
    proc = start(root, "train", str(TINY), *LONG, "--quiet")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not list(
        (root / "mlruns" / "checkpoints").glob("*/*/last.pt")
    ):
        time.sleep(0.1)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (ckpt,) = (root / "mlruns" / "checkpoints").glob("*/*/last.pt")
    before = len(runs_table(root))
    for damage in (lambda b: b[: len(b) // 3], lambda b: b"", lambda b: os.urandom(len(b))):
        ckpt.write_bytes(damage(ckpt.read_bytes()) if ckpt.stat().st_size else os.urandom(5000))
        res = cli_here(capfd, root, "train", str(TINY), *LONG, "--resume", "--quiet")
        line = one_error_line(res)
        assert res.returncode == 1 and f"checkpoint {ckpt} is unreadable" in line
        assert "delete it or train without --resume" in line and "weights_only" not in line
        assert len(runs_table(root)) == before


def test_empty_database_beside_artifacts_is_refused(tiny_models, store_root, tmp_path, capfd):
    """D15: a 0-byte mlflow.db beside existing artifacts was silently a new store."""
    import shutil

    root = tmp_path / "r"
    shutil.copytree(store_root / "mlruns" / "artifacts", root / "mlruns" / "artifacts")
    db = root / "mlruns" / "mlflow.db"  # what was left of the store whose models those are
    db.write_bytes(b"")
    # a damaged store is something named that is malformed: exit 2, as docs/usage.md says (it was 1)
    for argv in (["train", str(TINY), "--quiet"], ["report", "--experiment", "tiny"]):
        res = cli_here(capfd, root, *argv)
        assert res.returncode == 2 and "is empty (0 bytes) but" in one_error_line(res)
    assert db.stat().st_size == 0
    # not a database at all: SQLAlchemy's own error escaped as "(sqlite3.DatabaseError) file is
    # not a database", exit 1, naming neither the file nor what to do
    db.write_bytes(b"garbage\n")
    for argv in (["train", str(TINY), "--quiet"], ["report", "--experiment", "tiny"]):
        res = cli_here(capfd, root, *argv)
        assert res.returncode == 2 and one_error_line(res) == (
            f"attnstudy: error: the tracking database {db} cannot be read (file is not a "
            "database); point --tracking-uri at the store's mlflow.db, or restore it from a backup"
        )
    assert db.read_bytes() == b"garbage\n"


def test_deleted_model_files_are_not_reused(tmp_path, capfd):
    """D18: `train` printed "reused" for a finished run whose model files were deleted."""
    root = tmp_path / "r"
    args = ["train", str(TINY), "--set", ADDITIVE_ONLY, "--set", "training.epochs=1", "--quiet"]
    first = run_ids(ok(cli_here(capfd, root, *args)).stdout)[0]
    (weights,) = (root / "mlruns" / "artifacts").glob(f"*/{first}/artifacts/model/weights.pt")
    weights.unlink()
    res = ok(cli_here(capfd, root, *args))
    assert res.stdout.startswith("trained ") and run_ids(res.stdout)[0] != first


def _unshare_available() -> bool:
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


def test_read_only_store_can_be_read(tiny_models, store_root, tmp_path):
    """D20: `predict`, `report` and `ablate` on a read-only store failed with "Read-only file system"."""
    if not _unshare_available():
        pytest.skip("needs a mount namespace (unshare -m) to make a read-only store")
    import shutil

    copy = tmp_path / "ro"
    shutil.copytree(store_root / "mlruns", copy / "mlruns")
    env = dict(os.environ, ATTNSTUDY_ROOT=str(copy), PYTHONPATH=os.pathsep.join(sys.path))
    script = (
        f"mount --bind {copy} {copy} && mount -o remount,bind,ro {copy} && "
        f"{sys.executable} -m attnstudy.cli predict runs:/{tiny_models[0].run_id} abc"
    )
    res = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("abc\t")


def test_full_disk_is_one_line_and_never_bricks_the_store(tmp_path):
    """D14: a disk that filled during schema creation left a store that said `_alembic_tmp_experiments
    already exists` forever; a full disk during training printed 212 lines."""
    if not _unshare_available():
        pytest.skip("needs a mount namespace (unshare -m) to mount a small tmpfs")
    root = tmp_path / "small"
    root.mkdir()
    env = dict(
        os.environ,
        ATTNSTUDY_ROOT=str(root),
        ATTNSTUDY_THREADS="1",
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    py = f"{sys.executable} -m attnstudy.cli"
    script = (
        f"mount -t tmpfs -o size=300k tmpfs {root} && cd {root} && "
        f"{py} train {TINY} --set '{ADDITIVE_ONLY}' --quiet; echo rc=$?; "
        f"mount -o remount,size=100m {root} && {py} train {TINY} --set '{ADDITIVE_ONLY}' "
        "--set training.epochs=1 --quiet; echo rc=$?"
    )
    res = subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    first_err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "rc=1" in res.stdout.splitlines()[0], res.stdout + res.stderr[-2000:]
    assert len(first_err) == 1 and "full" in first_err[0] or "No space" in first_err[0], res.stderr[
        -2000:
    ]
    assert res.stdout.strip().splitlines()[-1] == "rc=0", res.stderr[
        -2000:
    ]  # the store works once space is back


# ----------------------------------------------------------------------------- NaN never laundered


def test_nan_weights_are_refused_not_reported_as_attention_does_not_matter(tmp_path, capfd):
    """D7: NaN weights gave flip rate 0.0 and AER 1.0 ("attention does not matter"), `predict` an empty
    output with exit 0."""
    import torch

    root = tmp_path / "nan"
    args = ["train", str(TINY), "--set", ADDITIVE_ONLY, "--set", "training.epochs=1", "--quiet"]
    m = run_ids(ok(cli_here(capfd, root, *args)).stdout)[0]
    (weights,) = (root / "mlruns" / "artifacts").glob(f"*/{m}/artifacts/model/weights.pt")
    state = torch.load(weights, weights_only=True)
    state["decoder.attention.v.weight"].fill_(float("nan"))
    torch.save(state, weights)
    for argv in (
        ["predict", f"runs:/{m}", "abcd", "--attention"],
        ["ablate", f"runs:/{m}", "--n-examples", "2"],
    ):
        res = cli_here(capfd, root, *argv)
        assert res.returncode == 2 and "hold NaN or inf values" in one_error_line(res), res.stderr[
            -1500:
        ]


def test_diverging_training_fails_and_nonfinite_metrics_are_counted(tmp_path, monkeypatch):
    """D7: non-finite losses vanished from the history and the run ended FINISHED."""
    import math

    from attnstudy import api
    from attnstudy.experiment import load_experiment
    from attnstudy.models import training
    from attnstudy.models.training import NonFiniteError

    root = tmp_path / "r"
    (root / "mlruns").mkdir(parents=True)
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
    monkeypatch.setattr(
        training, "dev_loss", lambda *a, **k: math.nan
    )  # a diverged model's dev loss
    cfg = load_experiment(TINY, [ADDITIVE_ONLY])
    with pytest.raises(NonFiniteError, match=r"epoch 1: dev/loss = nan; training diverged"):
        api.train_experiment(cfg, progress=False)
    (run,) = tracker(root).search_runs([tracker(root).experiment_id("tiny")])
    assert run.status == "FAILED" and run.tags["error.class"] == "NonFiniteError"
    t = tracker(root)
    t.log_metrics(run.run_id, {"a": math.nan, "b": 1.0, "c": math.inf})
    got = t.get_run(run.run_id)
    assert got.metrics["n_nonfinite_dropped"] == 2 and got.tags["nonfinite_metrics"] == "a,c"


def test_predict_escapes_control_characters(tiny_models, store_root, capfd):
    """D23: ANSI escapes reached the terminal and tabs/newlines broke the TSV output."""
    argv = ["predict", f"runs:/{tiny_models[0].run_id}", "ab\x1b[31mc\td"]
    res = ok(cli_here(capfd, store_root, *argv))
    line = res.stdout.splitlines()[0]
    assert "\x1b" not in res.stdout and line.startswith("ab\\x1b[31mc\\td\t")


def test_server_that_answers_health_but_fails_the_api_is_not_a_missing_run(tmp_path):
    """D16: a server answering /health but 500 on the API was reported as "no run with id …"."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            code = 200 if self.path == "/health" else 500
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"OK" if code == 200 else b"boom")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        res = cli(
            tmp_path,
            "predict",
            "runs:/0123456789abcdef0123456789abcdef",
            "abc",
            MLFLOW_TRACKING_URI=uri,
            ATTNSTUDY_TRACKING_TIMEOUT="3",
            MLFLOW_HTTP_REQUEST_MAX_RETRIES="0",
            timeout=120,
        )
    finally:
        server.shutdown()
    line = one_error_line(res)
    assert res.returncode == 1 and "no run with id" not in line and "500" in line, line
