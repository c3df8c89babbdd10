"""Reliability: interruptions and resume, determinism across processes, concurrent
processes on one fresh store, a real MLflow tracking server (and a dead one), numerical edge cases.

Every CLI call is a real ``python -m attnstudy.cli`` process with its own ``ATTNSTUDY_ROOT``;
stores are read back with sqlite3 (statuses) and :class:`attnstudy.tracking.Tracker` (metrics,
tables). The bad-input catalogue lives in tests/cli/test_cli_refusals.py.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from cli_in_process import run_cli

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
pytestmark = pytest.mark.slow

ADDITIVE_ONLY = 'models=[{model={attention="additive",flow="bahdanau"}}]'
# six ~1 s epochs (no early stop: the loss keeps falling), one model, 100 test examples
LONG = [
    "--set",
    "training.epochs=6",
    "--set",
    "training.early_stopping=loss",
    "--set",
    "data.n_train=1000",
    "--set",
    "data.n_test=100",
    "--set",
    ADDITIVE_ONLY,
]
ABLATE_SUBSET = ["--ablations", "permutation,uniform,erase_max", "--n-examples", "4"]


# ----------------------------------------------------------------------------- helpers


def _env(root: Path, **extra: str) -> dict[str, str]:
    env = dict(
        os.environ,
        ATTNSTUDY_ROOT=str(root),
        ATTNSTUDY_THREADS="1",
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    for k in (
        "MLFLOW_TRACKING_URI",
        "ATTNSTUDY_TRACKING_TIMEOUT",
        "ATTNSTUDY_DEBUG",
        "ATTNSTUDY_UI_URL",
    ):
        env.pop(k, None)
    env.update(extra)
    return env


def _default_sigint() -> None:
    # A shell without job control starts background commands (`make test &`, nohup) with SIGINT
    # ignored, and Python then installs no KeyboardInterrupt handler; a Ctrl-C at a terminal
    # reaches a process whose SIGINT is at its default, which is what these tests model.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(root: Path, *args: str, **env: str) -> subprocess.Popen:
    root.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "attnstudy.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=root,
        env=_env(root, **env),
        preexec_fn=_default_sigint,
    )


def finish(proc: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"{proc.args} did not finish within {timeout} s; stderr: {err[-2000:]}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def cli(root: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return finish(start(root, *args, **env), timeout)


def cli_here(capfd, root: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """:func:`cli` run in the test process (tests/cli_in_process.py), with the same environment
    and working directory: for a call whose process boundary is not what its test tests (a
    process that gets as far as torch and MLflow costs ~3.5 s CPU of imports)."""
    root.mkdir(parents=True, exist_ok=True)
    full = _env(root, **env)
    changes: dict[str, str | None] = {k: v for k, v in full.items() if os.environ.get(k) != v}
    changes |= {k: None for k in os.environ if k not in full}
    return run_cli(capfd, list(args), cwd=root, env=changes)


def ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, f"{res.args[3:]} exited {res.returncode}: {res.stderr[-3000:]}"
    return res


def one_error_line(res: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("attnstudy: error: "), res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    return lines[0]


def run_ids(stdout: str) -> list[str]:
    """Model run ids printed by ``train`` (``trained …: runs:/<id> (…)``)."""
    return [
        ln.split("runs:/")[1].split()[0].rstrip(",") for ln in stdout.splitlines() if "runs:/" in ln
    ]


def runs_table(root: Path) -> list[dict]:
    """Every run of the root's SQLite store: id, name, status, kind tag."""
    db = root / "mlruns" / "mlflow.db"
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute(
            "select r.run_uuid, r.name, r.status, t.value from runs r left join tags t "
            "on t.run_uuid = r.run_uuid and t.key = 'kind'"
        ).fetchall()
    except sqlite3.OperationalError:  # store being created
        return []
    finally:
        con.close()
    return [{"id": i, "name": n, "status": s, "kind": k} for i, n, s, k in rows]


def status(root: Path, run_id: str) -> str:
    return {r["id"]: r["status"] for r in runs_table(root)}[run_id]


def tracker(root: Path):
    from attnstudy.tracking import Tracker

    return Tracker(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")


def metric_histories(
    root: Path, run_id: str, exclude: tuple[str, ...] = ("train/seconds", "train/cpu_seconds")
) -> dict:
    """metric key → [(step, value), …] sorted by step; timing metrics (``exclude``) and the
    clock-driven ``progress/`` and ``system/`` samples (logged every N seconds) left out."""
    t = tracker(root)
    keys = t.get_run(run_id).metrics
    return {
        k: sorted((m.step, m.value) for m in t.client.get_metric_history(run_id, k))
        for k in keys
        if k not in exclude and not k.startswith(("progress/", "system/"))
    }


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(
                f"process exited ({proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}"
            )
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def checkpoints(root: Path) -> list[Path]:
    return sorted((root / "mlruns" / "checkpoints").glob("*/*/last.pt"))  # experiment/model key


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The LONG experiment trained uninterrupted by two processes at once, each in a fresh root:
    (root, model run id) × 2."""
    roots = [tmp_path_factory.mktemp(f"twin{i}") for i in range(2)]
    procs = [start(r, "train", str(TINY), *LONG, "--quiet") for r in roots]
    out = []
    for r, p in zip(roots, procs):
        res = ok(finish(p))
        (rid,) = run_ids(res.stdout)
        out.append((r, rid))
    return out


# ----------------------------------------------------------------------------- 1. interruptions


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_interrupted_training_is_killed_keeps_checkpoint_and_resumes_to_the_same_result(
    sig, twins, tmp_path, capfd
):
    import torch

    root = tmp_path / "root"
    proc = start(root, "train", str(TINY), *LONG, "--quiet")
    (ckpt,) = wait_for(lambda: checkpoints(root), 240, "the first checkpoint", proc)
    proc.send_signal(sig)
    res = finish(proc, 60)
    assert res.returncode == 1, res.stderr[-3000:]
    assert one_error_line(res).endswith("marked KILLED (resume with --resume)")

    (killed,) = runs_table(root)
    assert killed["status"] == "KILLED" and killed["kind"] == "model"
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert 1 <= state["epoch"] < 6 and len(state["history"]) == state["epoch"]
    assert not list(ckpt.parent.glob("*.tmp"))

    if sig == signal.SIGTERM:  # resuming is checked once (SIGINT); both leave the same state
        return
    resumed = ok(cli(root, "train", str(TINY), *LONG, "--resume", "--quiet"))
    (rid,) = run_ids(resumed.stdout)
    assert rid != killed["id"] and status(root, rid) == "FINISHED"
    assert status(root, killed["id"]) == "KILLED"  # never turned FINISHED
    ref_root, ref_id = twins[0]
    got, want = metric_histories(root, rid), metric_histories(ref_root, ref_id)
    assert [s for s, _ in got["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert got == want
    # a killed run is never reused: train without --retrain now reuses the resumed (finished) run
    # (in the test process: what the store holds is tested, not a process)
    again = ok(cli_here(capfd, root, "train", str(TINY), *LONG, "--quiet"))
    assert again.stdout.startswith("reused") and run_ids(again.stdout) == [rid]


def test_interrupt_inside_exec_code_still_exits_1_under_python_m(tmp_path):
    """CPython flags a KeyboardInterrupt raised in ``exec(<string>)`` code (dataclass creation
    during a lazy import, …) as unhandled even once caught; under ``python -m`` the process then
    died by SIGINT (-2) after printing the one-line message. Deterministic stand-in for a Ctrl-C
    landing in such code: the verb raises KeyboardInterrupt from inside exec."""
    (tmp_path / "interrupt_in_exec.py").write_text(
        "import sys\nfrom attnstudy.cli import main as cli\n"
        "cli._execute = lambda *a: exec('raise KeyboardInterrupt')\n"
        "sys.exit(cli.main(['report']))\n"
    )
    env = _env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    res = subprocess.run(
        [sys.executable, "-m", "interrupt_in_exec"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
    )
    assert res.returncode == 1, (res.returncode, res.stderr[-2000:])
    assert "interrupted" in one_error_line(res)


def test_interrupted_ablation_is_killed_never_finished(twins):
    root, model_id = twins[1]
    before = {r["id"] for r in runs_table(root)}
    proc = start(
        root, "ablate", f"runs:/{model_id}", "--quiet"
    )  # every ablation, 100 examples: long
    new = wait_for(
        lambda: [r for r in runs_table(root) if r["id"] not in before and r["kind"] == "ablation"],
        180,
        "the ablation run",
        proc,
    )
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    res = finish(proc, 60)
    assert res.returncode == 1, res.stderr[-3000:]
    # ablate has no --resume: the message named one (a user's try then got a usage error)
    assert one_error_line(res).endswith("marked KILLED (run the command again)")
    (abl,) = new
    assert status(root, abl["id"]) == "KILLED"
    assert status(root, model_id) == "FINISHED"
    assert not [
        r for r in runs_table(root) if r["kind"] == "ablation" and r["status"] == "FINISHED"
    ]


# ----------------------------------------------------------------------------- 2. determinism


def test_two_processes_train_and_ablate_identically(twins):
    import pandas as pd

    (ra, ia), (rb, ib) = twins
    ma, mb = metric_histories(ra, ia), metric_histories(rb, ib)
    assert "test/exact_match" in ma and "dev/loss" in ma
    assert ma == mb
    tables = []
    for root, rid in twins:
        res = ok(cli(root, "ablate", f"runs:/{rid}", *ABLATE_SUBSET, "--quiet"))
        abl_id = res.stdout.strip().splitlines()[-1].split("runs:/")[1]
        assert status(root, abl_id) == "FINISHED"
        tables.append(tracker(root).load_table(abl_id, "ablations/steps.parquet"))
        assert len(tables[-1]) > 0
    pd.testing.assert_frame_equal(tables[0], tables[1])
    assert {"permutation_median_tvd", "uniform_tvd", "erase_max_tvd"} <= set(tables[0].columns)


# ----------------------------------------------------------------------------- 3. concurrency


def test_three_processes_on_one_fresh_store(tmp_path):
    root = tmp_path / "shared"  # nothing yet: no mlruns/, no database
    jobs = [
        ("train", str(TINY), "--set", "experiment.seeds=[1]", "--set", ADDITIVE_ONLY, "--quiet"),
        ("train", str(TINY), "--set", "experiment.seeds=[2]", "--set", ADDITIVE_ONLY, "--quiet"),
        (
            "train",
            str(TINY),
            "--set",
            "experiment.seeds=[3]",
            "--set",
            'models=[{model={attention="none",flow="bahdanau"}}]',
            "--quiet",
        ),
    ]
    procs = [start(root, *a) for a in jobs]
    for p in procs:
        ok(finish(p))
    runs = runs_table(root)
    assert sorted(r["name"] for r in runs) == [
        "copy/additive-bahdanau/seed1",
        "copy/additive-bahdanau/seed2",
        "copy/none-bahdanau/seed3",
    ]
    assert {r["status"] for r in runs} == {"FINISHED"} and {r["kind"] for r in runs} == {"model"}
    con = sqlite3.connect(root / "mlruns" / "mlflow.db")
    try:
        assert (
            con.execute("select count(*) from experiments where name = 'tiny'").fetchone()[0] == 1
        )
        versions = dict(
            con.execute("select name, count(*) from model_versions group by name").fetchall()
        )
    finally:
        con.close()
    assert versions == {"tiny-copy-additive-bahdanau": 2, "tiny-copy-none-bahdanau": 1}
    assert len(checkpoints(root)) == 3


# ----------------------------------------------------------------------------- 4. tracking server


def _get(base: str, endpoint: str, **params) -> dict:
    url = f"{base}/api/2.0/mlflow/{endpoint}" + (
        f"?{urllib.parse.urlencode(params)}" if params else ""
    )
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.load(r)


def _post(base: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        f"{base}/api/2.0/mlflow/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def test_real_tracking_server_then_dead_server(tmp_path, capfd):
    """A study against a real MLflow server (a real ``attnstudy run`` process), then calls to
    the server once it is stopped. The prediction and the calls to the dead server run in the
    test process (:func:`cli_here`): the server and what it answers are tested, not a process."""
    from attnstudy.serving import ui

    port = ui.free_port()
    base = f"http://127.0.0.1:{port}"
    srv = tmp_path / "server"
    srv.mkdir()
    root = tmp_path / "root"
    uri_set = ["--set", f'experiment.tracking_uri="{base}"']
    # alignment stays in: without it the report fails (test_report_tables_without_alignment_columns)
    ablations = ["--set", 'ablation.ablations=["permutation","uniform","erase_max","alignment"]']
    proc = ui.start_server(
        f"sqlite:///{srv / 'mlflow.db'}",
        srv / "artifacts",
        host="127.0.0.1",
        port=port,
        log_path=srv / "server.log",
    )
    try:
        ui.wait_healthy(base, 180, proc)
        res = ok(cli(root, "run", str(TINY), *uri_set, *ablations, "--quiet", timeout=600))
        assert "study: runs:/" in res.stdout and "report: " in res.stdout
        assert not (root / "mlruns" / "mlflow.db").exists()  # nothing went to the local store

        exp_id = ui.experiment_id_by_name(base, "tiny")
        # the report's links go to the tracking server it was built from (it serves the UI),
        # not to the default http://127.0.0.1:5000 of a local store
        report = root / res.stdout.split("report: ", 1)[1].split()[0]
        md = report.with_name("report.md").read_text(encoding="utf-8")
        assert f"{base}/#/experiments/{exp_id}/runs/" in md and "127.0.0.1:5000" not in md
        runs = _post(base, "runs/search", {"experiment_ids": [exp_id], "max_results": 100})["runs"]
        by_kind: dict[str, list[dict]] = {}
        for r in runs:
            tags = {t["key"]: t["value"] for t in r["data"].get("tags", [])}
            by_kind.setdefault(tags.get("kind"), []).append(r)
            assert r["info"]["status"] == "FINISHED", r["info"]
        assert {k: len(v) for k, v in by_kind.items()} == {"study": 1, "model": 2, "ablation": 2}

        model = next(
            r for r in by_kind["model"] if r["info"]["run_name"].startswith("copy/additive")
        )
        mid = model["info"]["run_id"]
        hist = _get(base, "metrics/get-history", run_id=mid, metric_key="train/loss")["metrics"]
        assert sorted(m["step"] for m in hist) == [1, 2] and all(
            math.isfinite(m["value"]) for m in hist
        )
        files = {
            f["path"]
            for f in _get(base, "artifacts/list", run_id=mid, path="model").get("files", [])
        }
        from attnstudy.models.io import MODEL_FILES

        assert {f"model/{f}" for f in MODEL_FILES} <= files, files
        preds = {
            f["path"] for f in _get(base, "artifacts/list", run_id=mid, path="predictions")["files"]
        }
        # the Parquet table and its CSV twin (MLflow's viewer previews CSV, not Parquet)
        assert preds == {"predictions/test.parquet", "predictions/test.csv"}
        for abl in by_kind["ablation"]:
            listed = {
                f["path"]
                for f in _get(
                    base, "artifacts/list", run_id=abl["info"]["run_id"], path="ablations"
                ).get("files", [])
            }
            assert "ablations/steps.parquet" in listed
        names = {
            m["name"] for m in _get(base, "registered-models/search").get("registered_models", [])
        }
        assert names == {"tiny-copy-additive-bahdanau", "tiny-copy-none-bahdanau"}

        pred = ok(cli_here(capfd, root, "predict", f"runs:/{mid}", "abc", MLFLOW_TRACKING_URI=base))
        assert pred.stdout.startswith("abc\t")
    finally:
        ui.stop_server(proc)

    for args, env in [
        (("train", str(TINY), *uri_set, "--quiet"), {}),
        (("predict", f"runs:/{mid}", "abc"), {"MLFLOW_TRACKING_URI": base}),
    ]:
        t0 = time.monotonic()
        res = cli_here(capfd, root, *args, ATTNSTUDY_TRACKING_TIMEOUT="5", **env)
        wall = time.monotonic() - t0
        assert res.returncode == 1, (args[0], res.stderr[-3000:])
        assert base in one_error_line(res)
        assert wall < 30, (args[0], wall)


def test_two_trackers_in_one_process_log_models_to_their_own_store(tmp_path, monkeypatch):
    """A notebook may hold Trackers for two stores (a server and the local one): the registered
    model of a run goes to that run's store, whichever Tracker was created last."""
    import torch

    from attnstudy.api import load_data
    from attnstudy.experiment import load_experiment
    from attnstudy.models import build_model
    from attnstudy.models.io import save_model_dir
    from attnstudy.study.model_runs import SERVING_CODE
    from attnstudy.tracking import Tracker
    from attnstudy.tracking import models as packaging

    monkeypatch.setenv("ATTNSTUDY_ROOT", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = load_experiment(TINY).runs()[0]
    _, sv, tv = load_data(spec)
    torch.manual_seed(0)
    model_dir = save_model_dir(
        tmp_path / "files", build_model(spec.model, len(sv), len(tv)), spec, sv, tv
    )
    a = Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}")
    b = Tracker(
        f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}"
    )  # created last: mlflow's global URI is b's
    run_id = a.start_run(a.experiment_id("tiny"), "m")
    with a.active(run_id):
        model_id = packaging.log_model_dir(
            a, run_id, model_dir, SERVING_CODE, SERVING_CODE.parent, "tiny-model"
        )
    packaging.register_model(a, run_id, model_id, "tiny-reg")
    assert a.client.get_registered_model("tiny-reg").name == "tiny-reg"
    assert b.client.search_registered_models() == []
    got_run, _ = packaging.download_model_dir(a, "models:/tiny-reg/1", tmp_path / "dl")
    assert got_run == run_id and a.get_run(run_id).status == "FINISHED"


def test_report_tables_without_alignment_columns():
    """``run`` with ``ablation.ablations`` lacking alignment ended in the report with
    "'Column not found: alignment_gold_mass'" (exit 2, study FAILED) after all the work."""
    import pandas as pd
    from attnstudy.analysis.figures import per_example_alignment

    steps = pd.DataFrame(
        {"variant": ["a", "a"], "example_id": ["x", "y"], "permutation_median_tvd": [0.1, 0.2]}
    )
    out = per_example_alignment(steps)
    assert len(out) == 0 and {"variant", "example_id", "gold_mass", "permutation_tvd"} <= set(
        out.columns
    )


# ----------------------------------------------------------------------------- 5. numerical edges


@pytest.fixture
def one_thread():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_jsd_and_kl_terms_survive_fp32_underflow(one_thread):
    import torch
    from attnstudy.analysis.divergences import LN2, entropy, jsd, tvd

    tiny = torch.tensor(1e-45, dtype=torch.float32)
    assert tiny > 0 and tiny / 2 == 0  # the smallest subnormal: half of it underflows to zero
    p = torch.tensor([1.0, 0.0, 1e-45, 0.0])
    q = torch.tensor([0.0, 1.0, 0.0, 1e-45])
    cases = [
        (p, q),
        (p, p),
        (q, q),
        (torch.tensor([1e-45, 1.0]), torch.tensor([1.0, 1e-45])),
        (torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.5, 0.5, 1e-45])),
    ]
    for a, b in cases:
        for v in (jsd(a, b), jsd(b, a), tvd(a, b), entropy(a), entropy(b)):
            assert torch.isfinite(v).all(), (a, b, v)
        assert 0.0 <= float(jsd(a, b)) <= LN2 + 1e-7
        assert float(jsd(a, b)) == pytest.approx(float(jsd(b, a)), abs=1e-7)
    assert float(jsd(p, q)) == pytest.approx(LN2, abs=1e-6)
    assert float(jsd(q, q)) == 0.0


def test_jsd_is_right_where_the_mixture_underflows(one_thread):
    """m = (p + q) / 2 underflows to 0 where p holds the smallest subnormal and q a zero; the KL
    term then is p · (log p − log 0) = +inf, clamped to ln 2: two distributions that differ by
    1e-45 come out maximally different, and the gradient (the adversarial objective) is NaN."""
    import torch
    from attnstudy.analysis.divergences import jsd

    near = (torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.5, 0.5, 1e-45]))
    assert float(jsd(*near)) == pytest.approx(0.0, abs=1e-6)
    # a sharp attention row: softmax leaves a subnormal weight (scores 103.5 apart)
    row = torch.softmax(torch.tensor([0.0, -103.5, -104.0]), -1)
    assert 0 < float(row[1]) < 1e-44
    assert float(jsd(row, torch.tensor([1.0, 0.0, 0.0]))) == pytest.approx(0.0, abs=1e-6)
    p = torch.tensor([1.0, 0.0, 1e-45, 0.0], requires_grad=True)
    jsd(p, torch.tensor([0.0, 1.0, 0.0, 1e-45])).backward()
    assert torch.isfinite(p.grad).all(), p.grad


def _edge_model(attention: str, seed: int = 0):
    import torch

    from attnstudy.config import ModelConfig
    from attnstudy.data.synthetic import symbols
    from attnstudy.data.vocab import Vocab
    from attnstudy.models import build_model

    vocab = Vocab.build([symbols(5)])
    torch.manual_seed(seed)
    cfg = ModelConfig(
        embedding_dim=4,
        encoder_hidden=3,
        decoder_hidden=5,
        attention_dim=4,
        heads=2,
        dropout=0.0,
        attention=attention,
        flow="bahdanau",
    )
    model = build_model(cfg, len(vocab), len(vocab)).eval()
    return model, vocab


def _edge_examples():
    from attnstudy.data.synthetic import symbols, synthetic_example
    from attnstudy.data.types import Example

    s = symbols(5)
    return [
        synthetic_example("copy", [0], s, "len1"),  # source and target of length 1
        synthetic_example("copy", [3], s, "len1b"),
        synthetic_example("copy", [0, 1, 2, 3, 4], s, "len5"),  # a padded batch-mate
        synthetic_example("copy", [1, 1], s, "len2"),  # equal tokens: ties
        Example("len3", (s[2], s[4], s[2]), (s[2],), None),
    ]  # one-token target, no gold links


@pytest.mark.parametrize(
    "attention,scale",
    [("additive", 1.0), ("additive", 1e4), ("uniform", 1.0)],
    ids=["additive", "extreme-logits", "equal-scores"],
)
def test_suite_on_degenerate_inputs_logs_only_finite_values(attention, scale, one_thread):
    import numpy as np
    import torch
    from attnstudy.analysis.catalogue import AblationConfig
    from attnstudy.analysis.suite import METRIC_NAME, run_suite

    model, vocab = _edge_model(attention)
    with torch.no_grad():
        model.decoder.output.weight.mul_(scale)
        model.decoder.output.bias.mul_(scale)
    examples = _edge_examples()
    cfg = AblationConfig(
        n_examples=len(examples),
        n_permutations=6,
        n_random_orders=2,
        bootstrap_resamples=20,
        seed=1,
        adversarial={"steps": 5, "k": 2},
    )
    for prefix in ("greedy", "reference"):
        res = run_suite(
            model,
            examples,
            vocab,
            vocab,
            cfg.model_copy(update={"prefix": prefix}),
            progress=False,
            batch_size=5,
        )
        assert res.skipped == {}
        for k, v in res.summary.items():
            assert METRIC_NAME.match(k) and math.isfinite(v), (k, v)
        numeric = res.table.select_dtypes("number")
        assert not np.isinf(numeric.to_numpy(float)).any()
        steps = res.table[res.table["prefix"] == prefix]
        # length-1 sources: the permutation has one position, so those steps are skipped and counted
        one = steps[steps["src_len"] == 1]
        assert len(one) > 0 and one["permutation_skipped"].astype(bool).all()
        assert res.summary["ablation/permutation/n_skipped"] >= len(one)
        # an undefined τ (a constant vector) is a NaN in the table, counted, never averaged
        tau = steps[[c for c in steps.columns if c.startswith("importance_tau_")]]
        undefined = int(tau.isna().any(axis=1).sum())
        assert undefined > 0  # the length-1 sources at least
        n_skipped = res.summary.get("ablation/importance/n_skipped", 0.0)
        for col in tau.columns:  # undefined counted per statistic (skipped steps apart)
            stat = col.removeprefix("importance_")
            assert (
                res.summary[f"ablation/importance/{stat}_n_undefined"] + n_skipped
                == tau[col].isna().sum()
            )
        for name in ("permutation", "uniform", "erase_max", "adversarial"):
            assert f"ablation/{name}/n_steps" in res.summary
        if (
            attention == "uniform"
        ):  # all-equal scores: attention is constant, so τ(attention, ·) is undefined
            assert tau["importance_tau_attn_grad"].isna().all()
            assert res.summary["ablation/importance/tau_attn_grad_n_undefined"] > 0
            assert "ablation/importance/tau_attn_grad" not in res.summary


def test_an_interrupt_dropped_in_a_finalizer_prints_no_traceback(capsys):
    """Python drops (and prints) a KeyboardInterrupt raised inside a weakref callback; the CLI's
    hook keeps it off stderr (the request stays remembered), other unraisables still print."""
    import gc
    import sys
    import weakref

    from attnstudy.runtime.signals import quiet_dropped_interrupts

    class Thing:
        pass

    def raising(_ref, exc):
        raise exc

    before = sys.unraisablehook
    sys.unraisablehook = quiet_dropped_interrupts
    try:
        for exc in (KeyboardInterrupt(), ValueError("a real problem")):
            t = Thing()
            ref = weakref.ref(t, lambda r, exc=exc: raising(r, exc))  # noqa: F841
            del t
            gc.collect()
    finally:
        sys.unraisablehook = before
    err = capsys.readouterr().err
    assert "KeyboardInterrupt" not in err
    assert "ValueError: a real problem" in err


def test_jsd_terms_equal_the_masked_form_and_padding_gets_no_gradient(one_thread):
    """The KL-to-mixture terms clamp instead of masking: where p > 0 the same operations on the
    same values (bit-identical to the masked form), 0 where p = 0; through a softmax over −inf
    (the adversarial search's padding) the gradient is exactly 0 and finite everywhere."""
    import torch
    from attnstudy.analysis.divergences import LN2, jsd

    def masked(p, q):  # the form it replaced, written out
        pos = p > 0
        sp, ss = (
            torch.where(pos, p, torch.ones_like(p)),
            torch.where(pos, p + q, torch.ones_like(p)),
        )
        return torch.where(pos, p * (sp.log() - ss.log() + LN2), torch.zeros_like(p))

    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(64, 9, generator=g) * 6, -1)
    q = torch.softmax(torch.randn(64, 9, generator=g) * 6, -1)
    p[:, -2:], q[:8, -3:] = 0.0, 0.0  # exact zeros in both
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    want = (0.5 * (masked(p, q).sum(-1) + masked(q, p).sum(-1))).clamp(0, LN2)
    assert torch.equal(jsd(p, q), want)
    theta = torch.randn(4, 6, generator=g)
    theta[:, 4:] = float("-inf")
    theta.requires_grad_(True)
    target = torch.softmax(torch.randn(4, 6, generator=g).masked_fill(theta.isinf(), -1e9), -1)
    jsd(torch.softmax(theta, -1), target).sum().backward()
    assert torch.isfinite(theta.grad).all()
    assert (theta.grad[:, 4:] == 0).all() and (theta.grad[:, :4] != 0).any()
