"""A Ray head on this machine's loopback, started, supervised and stopped by this process.

:class:`LocalRayHead` runs ``ray start --head --block`` as a child process in its own session, on
free loopback ports (:func:`free_port`), in its own temporary folder, with token authentication;
a guardian (:mod:`attnstudy.serving.ui_guard`) stops it if the process that started it dies, and
:meth:`LocalRayHead.stop` ends exactly the processes it started (by PID and start time, with
psutil) and removes its folder. The Ray executor (:mod:`attnstudy.executors.distributed`) starts one
for a
study run without ``--ray-address``; the cluster test and benchmark start one themselves.

Ray is never imported here: the head is a subprocess (``python -m ray.scripts.scripts``), and
psutil is imported inside functions, so the default install never needs the
``[distributed]`` extra to import this module.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from attnstudy.serving.ui_guard import release_guard, start_guard

RAY_EXTRA = (
    "the Ray executor needs the [distributed] extra: pip install -e '.[distributed]' "
    "(ray[default] 2.60.0, psycopg[binary], psutil, boto3)"
)
CLUSTERS_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class ClusterError(RuntimeError):
    """The Ray cluster cannot be reached or started (the message says what to do)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now (all bound at once, then released:
    one :func:`free_port` after another may hand out the same port twice)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(
                socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            )
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
        return ports


PORT_CLASH = "same port is not used by multiple components"
"""What Ray's head says when one of its ports was taken between choosing it and binding it (another
process on the machine bound it meanwhile): the head is started again on new ports."""
START_ATTEMPTS = 3


@dataclass
class LocalRayHead:
    """A Ray head on this machine's loopback, owned by whoever started it.

    ``ray start --head --block`` in its own session with free ports (never the default 6379), its
    own temporary folder, token authentication with a random token, usage statistics off, and
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (without it, ``--node-ip-address 127.0.0.1`` still binds
    some services to every interface). :meth:`stop` ends exactly the processes it started, by PID
    (``ray stop`` would stop every Ray process of the machine, other users' included); if the
    process that started it dies first, its guardian (:mod:`attnstudy.serving.ui_guard`) stops them.

    Args:
        num_cpus, num_gpus: the resources the head offers (its workers run the tasks).
        object_store_mb: the object store's size (tasks exchange small JSON payloads only).
        env: extra environment of the head and its workers.
    """

    num_cpus: int = 2
    num_gpus: int = 0
    object_store_mb: int = 256
    env: dict[str, str] = field(default_factory=dict)
    address: str = ""
    token: str = ""
    temp_dir: Path | None = None
    proc: subprocess.Popen | None = None
    guard: subprocess.Popen | None = None
    log_path: Path | None = None
    _known: dict[int, float] = field(default_factory=dict)

    def driver_env(self) -> dict[str, str]:
        """What a driver (or any client) needs in its environment to connect to this head."""
        return {
            "RAY_USAGE_STATS_ENABLED": "0",
            CLUSTERS_VAR: "0",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
        }

    def head_env(self) -> dict[str, str]:
        """The head's own environment on top of :meth:`driver_env` (its workers inherit it): no
        metrics export (the minimal ``ray`` install has no agent to receive them)."""
        return self.driver_env() | {"RAY_enable_metrics_collection": "0"}

    def start(self, timeout: float = 120.0) -> str:
        """Start the head; returns its address ``127.0.0.1:PORT``. A head that exits because one of
        its ports was taken meanwhile (:data:`PORT_CLASH`) is started again on new ports, at most
        :data:`START_ATTEMPTS` times in all.

        Raises:
            ClusterError: Ray is not installed, or the head exited, or did not start within
                ``timeout`` s.
        """
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # not imported here: see RayExecutor._connect
            raise ClusterError(RAY_EXTRA)
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return self._start_once(timeout)
            except ClusterError as err:
                if PORT_CLASH not in str(err) or attempt == START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> str:
        self.token = secrets.token_hex(24)
        self.temp_dir = Path(
            tempfile.mkdtemp(prefix="attn-ray-", dir="/tmp")
        )  # short: socket paths
        self.log_path = self.temp_dir / "head.log"
        names = (
            "--port",
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
        chosen = free_ports(len(names) + 4 * self.num_cpus + 8)  # all distinct
        ports = dict(zip(names, chosen))
        port = ports["--port"]
        workers = sorted(chosen[len(names) :])
        cmd = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            *(f"{k}={v}" for k, v in ports.items()),
            f"--worker-port-list={','.join(map(str, workers))}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--num-cpus={self.num_cpus}",
            f"--num-gpus={self.num_gpus}",
            f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
            f"--temp-dir={self.temp_dir}",
        ]
        env = dict(os.environ) | self.env | self.head_env()
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        # the guardian stops the head's session when this process ends, however it ends (a
        # kill -9 of the driver would otherwise leave the head, its ports and memory behind)
        self.guard = start_guard(self.proc.pid)
        self.address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise ClusterError(f"the local Ray head exited ({tail})")
            if "Ray runtime started" in self.log_path.read_text(errors="replace"):
                self._remember()
                return self.address
            time.sleep(0.2)
        self.stop()
        raise ClusterError(f"the local Ray head did not start within {timeout:g} s")

    def log_tail(self) -> str:
        """The last line of the head's output that says something."""
        if self.log_path is None or not self.log_path.is_file():
            return "no output"
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else "no output"

    def _remember(self) -> None:
        """Record the head's process tree (PID → start time), so :meth:`stop` ends exactly these."""
        import psutil

        if self.proc is None:
            return
        try:
            head = psutil.Process(self.proc.pid)
            for p in [head, *head.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    self._known[p.pid] = p.create_time()
        except psutil.Error:
            pass

    def pids(self) -> set[int]:
        """The PIDs of every live process this head started (the head, its services, workers)."""
        import psutil

        self._remember()
        alive = set()
        for pid, started in self._known.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                    alive.add(pid)
        return alive

    def stop(self, timeout: float = 40.0) -> None:
        """SIGTERM to the head (it drains and ends its services and workers), then SIGKILL to any
        process of its recorded tree still alive after ``timeout`` seconds; removes its folder."""
        import shutil

        if self.proc is not None:
            self._remember()
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(10)
            deadline = time.monotonic() + 10
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            for pid in self.pids():  # only processes of this head's tree (PID and start time)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            self.proc = None
        if self.guard is not None:
            release_guard(self.guard, timeout)
            self.guard = None
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
