"""The cluster chapter's one-machine recipe binds loopback only.

``python -m attnstudy.executors.loopback_cluster --nodes 2 --num-cpus 1`` (docs/cluster.md, "Two
nodes on one
machine") is started as the chapter says; a driver connects with the variables it prints and runs
one task on each node; meanwhile every listening socket of every process of the recipe (the GCS,
both raylets, their agents and workers) and of the driver is recorded with psutil, and each must be
on 127.0.0.0/8 (the recipe it replaces, ``ray start`` with the machine's address, made the GCS
and the raylets listen on every interface). With ``--dashboard`` the head's job server (``run
--submit``, ``attnstudy job``) answers on loopback with the recipe's token. The driver also
places a probe on each node by its ``ray.io/node-id`` label and keeps four tasks off the first
node with the label selector the Ray executor gives a refusing node. SIGTERM then stops it with
nothing left running.

Time bound: the nodes start within 180 s, the driver's tasks within 180 s, the stop within 60 s
(about 40 s in all on this 2-core machine under a load of 3-4). Not skipped under ``CI=true``: a
missing Ray or psutil fails there (tests/prerequisites.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from prerequisites import require

pytestmark = pytest.mark.slow

DRIVER = """
import json, os, sys
import ray
from attnstudy.executors.loopback_cluster import NODE_RESOURCE
ray.init(address=sys.argv[1], logging_level="WARNING")
nodes = [n for n in ray.nodes() if n["Alive"]]
where = ray.remote(num_cpus=1)(lambda: (ray.get_runtime_context().get_node_id(), os.getpid()))
placed = [where.options(resources={NODE_RESOURCE.format(i): 1}).remote() for i in range(2)]
ran = ray.get(placed, timeout=180)
# what the Ray executor does with the nodes: a probe pinned to each node by its id label, and the
# study's tasks with a selector that leaves a refusing node (here: the first) out
from attnstudy.executors.distributed import NODE_ID_LABEL
pinned = [where.options(label_selector={NODE_ID_LABEL: n}).remote() for n in [r[0] for r in ran]]
leave_out = {"label_selector": {NODE_ID_LABEL: f"!in({ran[0][0]})"}}
rest = [where.options(**leave_out).remote() for _ in range(4)]
print(json.dumps({
    "addresses": sorted(n["NodeManagerAddress"] for n in nodes),
    "nodes": [r[0] for r in ran],
    "workers": [r[1] for r in ran],
    "pinned": [r[0] for r in ray.get(pinned, timeout=180)],
    "rest": [r[0] for r in ray.get(rest, timeout=180)],
}), flush=True)
sys.stdin.readline()  # stays connected (and listening) until the test has looked
ray.shutdown()
"""


def _wait_for_line(path, prefix: str, proc: subprocess.Popen, timeout: float) -> str:
    """The first line of the file at ``path`` starting with ``prefix``, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    pytest.fail(f"no {prefix!r} line (exit {proc.poll()}): {path.read_text(errors='replace')}")


def test_the_two_node_recipe_listens_on_loopback_only(tmp_path):
    missing = [m for m in ("ray", "psutil") if importlib.util.find_spec(m) is None]
    require(not missing, f"the [distributed] extra is not installed (no {', '.join(missing)})")
    from attnstudy.executors.loopback_cluster import JOB_SERVER, READY
    from benchmarks.cluster_kit import is_loopback, listeners, tree_pids

    out, err = tmp_path / "recipe.out", tmp_path / "recipe.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    with open(out, "wb") as o, open(err, "wb") as e:
        recipe = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "attnstudy.executors.loopback_cluster",
                "--nodes",
                "2",
                "--num-cpus",
                "1",
                "--dashboard",  # the job server of run --submit, on loopback too
            ],
            env=env,
            stdout=o,
            stderr=e,
            start_new_session=True,
        )
    driver = None
    seen: dict[int, list[str]] = {}
    started: set[int] = set()

    def watch(pids: set[int]) -> None:
        for pid, addrs in listeners(pids).items():
            seen.setdefault(pid, [])
            seen[pid] += [a for a in addrs if a not in seen[pid]]

    try:
        ready = _wait_for_line(out, READY, recipe, 180)
        address = ready[len(READY) :].split()[0]
        exports = _wait_for_line(out, "export ", recipe, 5)
        driver_env = env | dict(kv.split("=", 1) for kv in exports.split()[1:])
        job_server = _wait_for_line(out, JOB_SERVER, recipe, 5)[len(JOB_SERVER) :].split()[0]
        assert job_server.startswith("http://127.0.0.1:")
        assert driver_env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
        assert len(driver_env["RAY_AUTH_TOKEN"]) == 48 and driver_env["RAY_AUTH_MODE"] == "token"
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, address],
            env=driver_env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        answer = json.loads(driver.stdout.readline() or "null")
        assert answer is not None, driver.stderr.read()[-3000:] if driver.poll() is not None else ""
        started = tree_pids(recipe) | tree_pids(driver)
        watch(started)

        assert answer["addresses"] == ["127.0.0.1", "127.0.0.1"]  # two nodes, both on loopback
        assert len(set(answer["nodes"])) == 2  # one task ran on each node
        assert answer["pinned"] == answer["nodes"]  # a probe runs on the node it was pinned to
        assert answer["rest"] == [answer["nodes"][1]] * 4  # the node left out got none
        # the job server answers `attnstudy job` with the recipe's token (a job it does not have)
        deadline = time.monotonic() + 60  # the dashboard comes up after the nodes
        while True:
            asked = subprocess.run(
                [sys.executable, "-m", "attnstudy.cli", "job", "status", "none"]
                + ["--ray-address", job_server],
                env=driver_env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if "no job 'none'" in asked.stderr or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert asked.returncode == 2 and "no job 'none' on this job server" in asked.stderr, asked
        watch(tree_pids(recipe))  # the dashboard's processes listen on loopback too
        assert set(answer["workers"]) <= started  # workers of the recipe's nodes
        names = {pid: _name(pid) for pid in seen}
        assert "gcs_server" in names.values(), names
        assert sum(n == "raylet" for n in names.values()) == 2, names
        outside = {p: a for p, a in seen.items() if not all(map(is_loopback, a))}
        assert not outside, (outside, names)
    finally:
        if driver is not None:
            driver.communicate("\n", timeout=60)
        recipe.send_signal(signal.SIGTERM)
        try:
            recipe.wait(60)
        except subprocess.TimeoutExpired:
            recipe.kill()
            recipe.wait(10)
    assert recipe.returncode == 0, err.read_text(errors="replace")[-3000:]
    deadline = time.monotonic() + 30
    while (left := [p for p in started if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:  # only processes of the recipe's and the driver's trees
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left running: {left}"


def _name(pid: int) -> str:
    import psutil

    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
