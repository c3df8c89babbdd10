"""A study on a Ray cluster against a team's tracking server, for real, on loopback.

A throwaway PostgreSQL cluster (Debian's ``initdb`` into a temporary folder), ``attnstudy server``
on it, two Ray nodes on 127.0.0.1 with one CPU each and the head's job server (the cluster
chapter's one-machine recipe, ``loopback_cluster --nodes 2 --dashboard``), then ``attnstudy run
--executor ray`` of the tiny experiment (one variant) with two seeds: every run FINISHED with the
right links, the report built, the per-step tables and summaries equal to the local executor's
(timing metrics aside), every listener on loopback (the driver first asks both nodes whether they
can run the study's tasks); a worker killed mid-training is retried and continues its run; the
same kind of study submitted as a Ray job finishes without its submitter. Everything started here
is stopped here, by handle and PID (``ray stop`` would stop every Ray process of the machine).

Prerequisites (``make test`` installs them): Debian's ``postgresql`` and the ``[distributed]``
extra; a skip on a developer's machine without them, a failure under ``CI=true``.

Time bound: PostgreSQL starts within 60 s, the server within 180 s, the Ray nodes within 180 s,
and each ``attnstudy run`` within 900 s (then its driver is killed and the test fails); the
local study compared with has no bound of its own (one tiny variant, two seeds).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from figures import figures_undrawn
from prerequisites import require

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
TIMING = ("train/seconds", "train/cpu_seconds", "ablation/seconds")


def _untimed(metrics: dict) -> dict:
    """Metrics without the times (``TIMING``: wall-clock and CPU seconds; every ``timing/…``)."""
    return {k: v for k, v in metrics.items() if k not in TIMING and not k.startswith("timing/")}


pytestmark = pytest.mark.slow


def _prerequisites() -> None:
    # aiohttp_cors and opencensus: ray[default], which the head's dashboard (run --submit) needs
    modules = ("ray", "psycopg", "psutil", "aiohttp_cors", "opencensus")
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    require(not missing, f"the [distributed] extra is not installed (no {', '.join(missing)})")
    from benchmarks.cluster_kit import initdb_path

    require(initdb_path() is not None, "Debian's postgresql (/usr/lib/postgresql/*/bin/initdb)")
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            require(False, "a 'postgres' user to run initdb as (Debian's postgresql creates it)")


class LoopbackNodes:
    """The cluster chapter's one-machine recipe as the module's Ray cluster: ``python -m
    attnstudy.executors.loopback_cluster --nodes 2 --num-cpus 1 --dashboard`` (two nodes on
    127.0.0.1, token authentication, the head's job server), started from this virtualenv's
    ``PATH`` (a submitted job's driver runs its ``python``) and stopped with SIGTERM."""

    def __init__(self, base: Path):
        self.out = base / "nodes.out"
        self.proc: subprocess.Popen | None = None
        self.address = self.dashboard_url = ""
        self.env: dict[str, str] = {}
        self.known: set[int] = set()  # every PID of the recipe's tree seen (workers come and go)

    def start(self, timeout: float = 180) -> None:
        from attnstudy.executors.loopback_cluster import JOB_SERVER, READY

        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        with open(self.out, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "attnstudy.executors.loopback_cluster", "--nodes", "2"]
                + ["--num-cpus", "1", "--dashboard"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        lines = self._lines((READY, "export ", JOB_SERVER), timeout)
        self.address = lines[0][len(READY) :].split()[0]
        self.env = dict(kv.split("=", 1) for kv in lines[1].split()[1:])
        self.dashboard_url = lines[2][len(JOB_SERVER) :].split()[0]
        self.pids()

    def _lines(self, prefixes: tuple[str, ...], timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.out.read_text(errors="replace").splitlines()
            found = [next((ln for ln in text if ln.startswith(p)), None) for p in prefixes]
            if all(found):
                return found
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise RuntimeError(f"the loopback nodes did not start: {self.out.read_text()[-2000:]}")

    def node_pids(self, i: int) -> set[int]:
        """The processes of node ``i``: its raylet (node i ≥ 1 runs in the recipe's folder
        ``n<i>``, the head in the recipe's own) and what runs under it (agents, workers)."""
        import psutil

        out: set[int] = set()
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.name() != "raylet":
                    continue
                folder = re.search(r"/n(\d+)/", " ".join(proc.cmdline()))
                if (int(folder.group(1)) if folder else 0) == i:
                    out |= {pid, *(c.pid for c in proc.children(recursive=True))}
        return out

    def driver_env(self) -> dict[str, str]:
        """The three variables the recipe prints for a driver (and Ray's usage statistics off)."""
        return dict(self.env)

    def pids(self) -> set[int]:
        from benchmarks.cluster_kit import tree_pids

        alive = tree_pids(self.proc)
        self.known |= alive
        return alive

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Cluster:
    """What the module fixture started, and how to stop it."""

    def __init__(self, base: Path):
        self.base = base
        self.pg = self.server = self.head = None
        self.url = ""
        self.seen: dict[int, list[str]] = {}  # every listener seen, by PID

    def pids(self) -> set[int]:
        from benchmarks.cluster_kit import tree_pids

        out = set()
        if self.pg is not None:
            out |= self.pg.pids()
        out |= tree_pids(self.server)
        if self.head is not None:
            out |= self.head.pids()
        return out

    def watch(self, extra: set[int] = frozenset()) -> None:
        from benchmarks.cluster_kit import listeners

        for pid, addrs in listeners(self.pids() | set(extra)).items():
            self.seen.setdefault(pid, [])
            self.seen[pid] += [a for a in addrs if a not in self.seen[pid]]

    def env(self, root: Path, own_head: bool = False, nodes=None) -> dict[str, str]:
        """The driver's environment: this cluster's token and settings (or those of ``nodes``,
        another :class:`LoopbackNodes`), or (``own_head``) a plain shell's, without any Ray
        variable (the driver must set up its private head itself)."""
        env = dict(os.environ) | {"ATTNSTUDY_ROOT": str(root)}
        if own_head:
            for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
                env.pop(var, None)
        else:
            env |= (nodes or self.head).driver_env()
        env.pop("RAY_ADDRESS", None)
        return env

    def run(
        self, root: Path, *args: str, timeout: float = 900, on_poll=None, own_head=False, nodes=None
    ):
        """``attnstudy run TINY --executor ray`` as a subprocess, watching the listeners of
        everything (the driver included) while it runs; ``own_head``: without ``--ray-address``
        (the driver starts a private head on loopback and must stop it); ``nodes``: on another
        :class:`LoopbackNodes` than the module's. Every PID of the driver's tree seen while it
        ran is kept in ``driver_tree``."""
        from benchmarks.cluster_kit import tree_pids

        root.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "attnstudy.cli",
            "run",
            str(TINY),
            "--executor",
            "ray",
            *([] if own_head else ["--ray-address", (nodes or self.head).address]),
            "--tracking-uri",
            self.url,
            "--quiet",
            *args,
        ]
        proc = subprocess.Popen(
            cmd,
            cwd=root,
            env=self.env(root, own_head, nodes),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.driver_pid = proc.pid
        self.driver_tree = {proc.pid}
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                tree = tree_pids(proc)
                self.driver_tree |= tree
                self.watch(tree)
                if on_poll is not None:
                    on_poll()
                time.sleep(1.0)
            out, err = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    _prerequisites()
    from benchmarks.cluster_kit import ThrowawayPostgres, start_tracking_server, stop_process

    c = Cluster(tmp_path_factory.mktemp("cluster"))
    started: set[int] = set()
    try:
        c.pg = ThrowawayPostgres().start()
        c.server, c.url = start_tracking_server(
            c.pg.uri, c.base / "artifacts", c.base / "server.log", c.pg.env
        )
        # two Ray nodes on loopback with the head's job server (run --submit), as the chapter's
        # one-machine recipe starts them
        c.head = LoopbackNodes(c.base)
        c.head.start()
        started = c.pids()
        c.watch()
        yield c
    finally:
        started |= c.pids()
        if c.head is not None:
            c.head.stop()
        stop_process(c.server)
        if c.pg is not None:
            c.pg.stop()
    left = [p for p in started if _alive(p)]
    assert not left, f"processes left running: {left}"


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _tracker(url: str):
    from attnstudy.tracking import Tracker

    return Tracker(url)


def _runs(tracker, experiment: str):
    exp = tracker.experiment_id(experiment, create=False)
    return {r.name: r for r in tracker.search_runs([exp])}


def _local_study(tmp_path: Path, overrides: list[str], monkeypatch) -> str:
    """The same study with the local executor, as ``attnstudy run TINY --no-report`` with the
    overrides runs it (one worker, one thread, the experiment file's text), in this process
    (a cold CLI start cost seconds), its figures saved undrawn (PNG files are not compared).
    Returns its store's tracking URI."""
    from attnstudy import api
    from attnstudy.experiment import load_experiment

    root = tmp_path / "local"
    (root / "mlruns").mkdir(parents=True)
    with monkeypatch.context() as mp:
        mp.setenv("ATTNSTUDY_ROOT", str(root))
        mp.setenv("ATTNSTUDY_WORKERS", "1")
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        with figures_undrawn():
            result = api.run(
                load_experiment(TINY, overrides),
                progress=False,
                config_text=TINY.read_text(encoding="utf-8"),
                report=False,
            )
    assert not result.failures, result.failures
    return f"sqlite:///{root / 'mlruns' / 'mlflow.db'}"


def test_a_study_on_ray_equals_the_local_one_and_stays_on_loopback(cluster, tmp_path, monkeypatch):
    import pandas as pd

    from attnstudy.runtime.code_version import code_commit, code_digest
    from attnstudy.tracking import Tracker
    from attnstudy.tracking.store import study_runs

    # one variant, two seeds, two workers: the least that shows placement, seed variance and
    # equality (the suite's 2 cores are shared; every process start costs seconds)
    overrides = [
        "experiment.seeds=[1,2]",
        'models=[{model={attention="additive",flow="bahdanau"}}]',
    ]
    res = cluster.run(tmp_path / "ray", *(a for o in overrides for a in ("--set", o)))
    assert res.returncode == 0, res.stderr[-4000:]
    assert "study: runs:/" in res.stdout and "report: " in res.stdout
    report = tmp_path / "ray" / "reports" / "tiny" / "report.html"
    assert report.is_file() and "additive" in report.read_text(encoding="utf-8")
    assert not (tmp_path / "ray" / "mlruns" / "mlflow.db").exists()  # nothing went to SQLite

    t = _tracker(cluster.url)
    runs = _runs(t, "tiny")
    study = next(r for r in runs.values() if r.kind == "study")
    models = {n: r for n, r in runs.items() if r.kind == "model"}
    ablations = {n: r for n, r in runs.items() if r.kind == "ablation"}
    names = {f"copy/additive-bahdanau/seed{s}" for s in (1, 2)}
    assert set(models) == names and set(ablations) == {f"ablations of {n}" for n in names}
    assert all(r.status == "FINISHED" for r in runs.values()), {
        n: r.status for n, r in runs.items()
    }
    assert study.metrics["study/n_ok"] == 2 and study.metrics["study/n_failed"] == 0
    recorded = study_runs(t, study.run_id)  # the members the study recorded
    assert {r.run_id for r in recorded.models} == {r.run_id for r in models.values()}
    assert {r.run_id for r in recorded.ablations.values()} == {r.run_id for r in ablations.values()}
    assert "seed_variance/copy_additive_bahdanau/attention_jsd" in study.metrics
    worker_pids = set()
    for name, m in models.items():
        a = ablations[f"ablations of {name}"]
        assert m.tags["study_id"] == study.run_id and m.tags["mlflow.parentRunId"] == study.run_id
        assert a.tags["source_run_id"] == m.run_id and a.tags["mlflow.parentRunId"] == m.run_id
        assert a.tags["study_id"] == study.run_id and m.tags["device"] == a.tags["device"] == "cpu"
        assert m.tags["attnstudy.cluster_task"].startswith(f"{study.run_id}/")
        # the code Ray shipped (a copy of this checkout): its digest, and the commit it names
        # (a copy has no git: it carries the commit in a file)
        assert m.tags["attnstudy.code_digest"] == a.tags["attnstudy.code_digest"] == code_digest()
        assert m.tags["attnstudy.code_commit"] == code_commit()
        worker_pids.add(int(m.tags["attnstudy.owner.pid"]))
    # trained by (at least) two workers of the two nodes, not by the driver
    assert len(worker_pids) >= 2 and cluster.driver_pid not in worker_pids
    assert worker_pids <= cluster.head.known, (worker_pids, cluster.head.known)
    exp = t.experiment_id("tiny", create=False)
    assert t.artifact_location(exp).startswith("mlflow-artifacts:")

    # the same numbers as the local executor (per-step tables, summaries, predictions)
    local = Tracker(_local_study(tmp_path, overrides, monkeypatch))
    local_runs = _runs(local, "tiny")
    for name, m in models.items():
        lm = local_runs[name]
        assert _untimed(m.metrics) == _untimed(lm.metrics), name
        assert m.tags["model_key"] == lm.tags["model_key"]
        pd.testing.assert_frame_equal(
            t.load_table(m.run_id, "predictions/test.parquet"),
            local.load_table(lm.run_id, "predictions/test.parquet"),
        )
        a, la = ablations[f"ablations of {name}"], local_runs[f"ablations of {name}"]
        assert _untimed(a.metrics) == _untimed(la.metrics), name
        pd.testing.assert_frame_equal(
            t.load_table(a.run_id, "ablations/steps.parquet"),
            local.load_table(la.run_id, "ablations/steps.parquet"),
            check_exact=True,
        )
    local_study = next(r for r in local_runs.values() if r.kind == "study")
    sv = "seed_variance/copy_additive_bahdanau/attention_jsd"
    assert study.metrics[sv] == local_study.metrics[sv]

    # every listener of everything started (PostgreSQL, MLflow, Ray's services and workers, the
    # driver) was on loopback the whole time
    from benchmarks.cluster_kit import is_loopback

    cluster.watch()
    assert len(cluster.seen) >= 4, cluster.seen  # postgres, mlflow, gcs, raylet at least
    outside = {p: a for p, a in cluster.seen.items() if not all(map(is_loopback, a))}
    assert not outside, outside


def test_a_private_head_stays_on_loopback_and_ends_with_its_driver(cluster, tmp_path):
    """Without ``--ray-address`` the driver starts a private head on loopback: every listener of
    its tree is on loopback, and no process of it outlives a normal exit (its SIGKILL:
    tests/distributed/test_distributed.py). Time bound: the driver's run is given 900 s; about
    25 s of wall time here."""
    from benchmarks.cluster_kit import is_loopback

    res = cluster.run(
        tmp_path / "private",
        "--set",
        "experiment.name=tiny-private-head",
        "--set",  # one cheap ablation: the battery is not what is tested here
        'ablation.ablations=["uniform"]',
        own_head=True,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    deadline = time.monotonic() + 60
    while (left := [p for p in cluster.driver_tree if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"the driver left processes of its private head running: {left}"
    private = {p: a for p, a in cluster.seen.items() if p in cluster.driver_tree}
    assert len(private) >= 3, private  # the private head's gcs, raylet and workers listened
    outside = {p: a for p, a in private.items() if not all(map(is_loopback, a))}
    assert not outside, outside
    study = next(
        r for r in _runs(_tracker(cluster.url), "tiny-private-head").values() if r.kind == "study"
    )
    assert study.status == "FINISHED"


def test_a_dead_node_is_retried_and_the_retry_continues_its_run(cluster, tmp_path):
    """A worker node dies mid-study: SIGKILL to the second node of a two-node loopback cluster
    of this test's own (its raylet, agents and workers) while it trains a variant, after that
    variant's first epoch. Ray runs the task again on the node left (``experiment.task_retries``),
    the retry reopens the dead attempt's model run and trains on from its last checkpoint, and
    the study finishes without ``--resume``, exit 0, one run per model. Both variants train for
    30 epochs, so that each node has a training when the kill comes. (Retries spent: the driver
    ends the runs FAILED and says so at once, tests/distributed/test_lost_task_reported.py; a
    worker process killed alone: tests/study/test_ablation_resume.py.) Time bound: the driver's
    run is given 900 s; about 60 s of wall time here."""
    nodes = LoopbackNodes((tmp_path / "nodes").resolve())
    (tmp_path / "nodes").mkdir()
    nodes.start()
    t = _tracker(cluster.url)
    killed: dict[str, tuple[str, int]] = {}

    def kill_the_second_node() -> None:
        if killed:
            return
        exp = t.experiment_id("tiny-node-lost", create=False)
        if exp is None:
            return
        second = nodes.node_pids(1)
        for r in t.search_runs([exp], "attributes.status = 'RUNNING' and tags.kind = 'model'"):
            pid = int(r.tags["attnstudy.owner.pid"])
            if r.metrics.get("train/loss") and pid in second:
                assert pid not in nodes.node_pids(0)
                for p in second:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p, signal.SIGKILL)
                killed[r.run_id] = (r.name, pid)
                return

    epochs = 30
    long = [f"models.{i}.training.{k}={epochs}" for i in (0, 1) for k in ("epochs", "patience")]
    try:
        res = cluster.run(
            tmp_path / "crash",
            *[a for kv in ["experiment.name=tiny-node-lost", *long] for a in ("--set", kv)],
            "--set",  # one cheap ablation: the battery is not what is tested here
            'ablation.ablations=["uniform"]',
            on_poll=kill_the_second_node,
            nodes=nodes,
        )
    finally:
        nodes.stop()
    deadline = time.monotonic() + 60  # the head's idle workers exit a moment after the recipe
    while (left := [p for p in nodes.known if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"the test's nodes left processes running: {left}"
    assert killed, res.stderr[-3000:]
    assert res.returncode == 0, res.stderr[-3000:]
    exp = t.experiment_id("tiny-node-lost", create=False)
    models = t.search_runs([exp], "tags.kind = 'model'")
    assert sorted(r.name for r in models) == [
        "copy/additive-bahdanau/seed1",
        "copy/none-bahdanau/seed1",
    ]  # one run per model: the retry made none of its own
    ((dead_id, (name, pid)),) = killed.items()
    (retried,) = [r for r in models if r.run_id == dead_id]
    assert retried.status == "FINISHED" and retried.metrics["train/epochs"] == epochs
    assert int(retried.tags["attnstudy.owner.pid"]) != pid  # another process took it over
    history = t.client.get_metric_history(dead_id, "train/loss")
    assert {m.step for m in history} == set(range(1, epochs + 1))  # before and after the kill
    said = [ln for ln in res.stderr.splitlines() if "was run again after its worker died" in ln]
    assert len(said) == 1, res.stderr[-3000:]
    assert f"{name}: its training task was run again" in said[0]
    assert f"the retry continues run {dead_id} from its last checkpoint" in said[0]
    runs = _runs(t, "tiny-node-lost")
    assert runs["ablations of copy/additive-bahdanau/seed1"].status == "FINISHED"
    assert runs["ablations of copy/none-bahdanau/seed1"].status == "FINISHED"
    study = next(r for r in runs.values() if r.kind == "study")
    assert study.status == "FINISHED"
    assert study.metrics["study/n_ok"] == 2 and study.metrics["study/n_failed"] == 0
    assert (tmp_path / "crash" / "reports" / "tiny-node-lost" / "report.md").is_file()


def _cli(cluster, *args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """``attnstudy ARGS`` as a process with the cluster's token, as a user's shell runs it."""
    return subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", *args],
        cwd=cwd,
        env=cluster.env(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_study_submitted_as_a_ray_job_finishes_without_its_submitter(cluster, tmp_path):
    """``run --submit`` hands the study to the head's job server and exits; the study runs on
    as a Ray job (its driver on the head, the submitter's code shipped with it) and ``job logs
    --follow`` follows it to the end with the job's exit code. Time bound: the job server has
    60 s to answer after the head started, the submission 120 s, the follower 600 s; about 20 s
    of CPU (the job's driver and its workers start Python and torch)."""
    from attnstudy.runtime.code_version import code_digest

    url = cluster.head.dashboard_url
    deadline = time.monotonic() + 60  # the dashboard starts after the head said it is up
    while True:
        listed = _cli(cluster, "job", "status", "none", "--ray-address", url, cwd=tmp_path)
        if "no job 'none'" in listed.stderr or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert listed.returncode == 2 and listed.stderr.strip() == (
        "attnstudy: error: no job 'none' on this job server ('ray job list' lists them)"
    )
    args = ["run", str(TINY), "--executor", "ray", "--submit", "--ray-address", url]
    args += ["--tracking-uri", cluster.url, "--set", "experiment.name=tiny-job"]
    args += ["--set", 'models=[{model={attention="additive",flow="bahdanau"}}]']
    args += ["--set", 'ablation.ablations=["uniform"]']
    sent = _cli(cluster, *args, cwd=tmp_path)  # another folder than the experiment's
    assert sent.returncode == 0, sent.stderr[-3000:]
    assert sent.stderr == ""  # Ray's "Uploading package" lines are not ours to print
    job_id = sent.stdout.split("job: ", 1)[1].split()[0]
    assert sent.stdout.splitlines()[1] == (
        f"follow it: attnstudy job logs {job_id} --follow --ray-address {url}"
    )
    early = _cli(cluster, "job", "status", job_id, "--ray-address", url, cwd=tmp_path)
    assert early.stdout.split()[1] in ("PENDING", "RUNNING"), early  # the submitter is gone
    followed = _cli(
        cluster, "job", "logs", job_id, "--follow", "--ray-address", url, cwd=tmp_path, timeout=600
    )
    assert followed.returncode == 0, (followed.stdout[-3000:], followed.stderr[-3000:])
    assert followed.stderr.strip() == f"job {job_id}: SUCCEEDED"
    log = followed.stdout
    assert "train copy/additive-bahdanau/seed1" in log and "study: runs:/" in log
    study_id = log.split("study: runs:/", 1)[1].split()[0]
    assert (
        f"report: in the study run's artifacts (report/); 'attnstudy report --study {study_id}' "
        "writes it where you run it"
    ) in log
    done = _cli(cluster, "job", "status", job_id, "--ray-address", url, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith(f"{job_id}: SUCCEEDED")
    assert _cli(cluster, "job", "logs", job_id, "--ray-address", url, cwd=tmp_path).stdout == log

    t = _tracker(cluster.url)
    runs = _runs(t, "tiny-job")
    assert {n: r.status for n, r in runs.items() if r.kind != "study"} == {
        "copy/additive-bahdanau/seed1": "FINISHED",
        "ablations of copy/additive-bahdanau/seed1": "FINISHED",
    }
    study = runs[next(n for n, r in runs.items() if r.kind == "study")]
    assert study.run_id == study_id and study.status == "FINISHED"
    model = runs["copy/additive-bahdanau/seed1"]
    assert model.tags["attnstudy.code_digest"] == code_digest()  # the submitter's code
    artifacts = {a.path for a in t.client.list_artifacts(study_id, "report")}
    assert "report/report.html" in artifacts
    assert not (tmp_path / "reports").exists() and not (tmp_path / "mlruns").exists()
