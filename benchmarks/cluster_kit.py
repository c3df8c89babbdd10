"""A throwaway team set-up on this machine's loopback, for the cluster test and the cluster
benchmark: a PostgreSQL cluster in a temporary folder, ``attnstudy server`` on it, and a check that
every listening socket of what they started stays on loopback.

Everything here stops exactly what it started, by its process handle (and the PIDs of the trees
it recorded), never by name: other users of the machine may run PostgreSQL, MLflow or Ray too.
"""

from __future__ import annotations

import contextlib
import glob
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from attnstudy.executors.distributed import free_port


def initdb_path() -> Path | None:
    """Debian's ``initdb`` (``/usr/lib/postgresql/<version>/bin/initdb``, the newest), or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]) if found else None


@dataclass
class ThrowawayPostgres:
    """A PostgreSQL cluster of its own: ``initdb`` into a temporary folder (as the ``postgres``
    user when this process is root, since ``initdb`` refuses root), listening on 127.0.0.1 only, on
    a free port, with its socket in its own folder, password (SCRAM) authentication with a random
    password, and one database for MLflow. ``fsync`` is off: the cluster is thrown away.
    """

    database: str = "mlflow"
    user: str = "attnstudy"
    base: Path | None = None
    port: int = 0
    password: str = ""
    proc: subprocess.Popen | None = None
    _run_as: dict = field(default_factory=dict)

    @property
    def uri(self) -> str:
        """The backend store URI (without the password: it travels in ``PGPASSWORD``)."""
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def env(self) -> dict[str, str]:
        """What a client of the database needs in its environment."""
        return {"PGPASSWORD": self.password}

    def start(self, timeout: float = 60.0) -> ThrowawayPostgres:
        """initdb, start, wait until it accepts connections, create the database.

        Raises:
            RuntimeError: no Debian ``initdb``, or the server did not start (its log's last line).
        """
        initdb = initdb_path()
        if initdb is None:
            raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb: apt-get install postgresql")
        bindir = initdb.parent
        self.base = Path(tempfile.mkdtemp(prefix="attn-pg-", dir="/tmp"))
        self.password = secrets.token_hex(16)
        data, sock = self.base / "data", self.base / "sock"
        if os.geteuid() == 0:
            import pwd

            pw = pwd.getpwnam("postgres")
            os.chmod(self.base, 0o755)
            self._run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
            owner = (pw.pw_uid, pw.pw_gid)
        else:
            owner = (os.getuid(), os.getgid())
        pwfile = self.base / "pwfile"
        pwfile.write_text(self.password + "\n")
        for d in (data, sock):
            d.mkdir(mode=0o700)
        for p in (data, sock, pwfile):
            os.chown(p, *owner)
        os.chmod(pwfile, 0o600)
        subprocess.run(
            [
                str(initdb),
                "-D",
                str(data),
                "-U",
                self.user,
                "--auth=scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--no-locale",
            ],
            check=True,
            capture_output=True,
            timeout=120,
            **self._run_as,
        )
        pwfile.unlink()
        self.port = free_port()
        log = open(self.base / "postgres.log", "wb")
        self.proc = subprocess.Popen(
            [
                str(bindir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={sock}",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=40",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **self._run_as,
        )
        log.close()
        self._wait(timeout)
        import psycopg

        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        return self

    def _dsn(self, db: str) -> str:
        return (
            f"host=127.0.0.1 port={self.port} user={self.user} password={self.password} dbname={db}"
        )

    def _wait(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.log_tail()}")
            try:
                psycopg.connect(self._dsn("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError as err:
                last = str(err).strip().splitlines()[0] if str(err).strip() else "no answer"
            time.sleep(0.2)
        raise RuntimeError(f"postgres did not accept connections within {timeout:g} s ({last})")

    def log_tail(self) -> str:
        path = None if self.base is None else self.base / "postgres.log"
        if path is None or not path.is_file():
            return "no log"
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else "empty log"

    def database_size(self) -> int:
        """The MLflow database's size in bytes (``pg_database_size``)."""
        import psycopg

        with psycopg.connect(self._dsn(self.database), connect_timeout=10) as conn:
            return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])

    def pids(self) -> set[int]:
        """The postmaster and its backends."""
        return tree_pids(self.proc)

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown (SIGINT to the postmaster: backends are ended), then remove the folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None


def start_tracking_server(
    backend_uri: str,
    artifacts: Path,
    log_path: Path,
    env: dict[str, str],
    timeout: float = 180,
    workers: int = 1,
) -> tuple[subprocess.Popen, str]:
    """``attnstudy server`` on a free loopback port, as a team would start it (``workers``:
    its ``--workers``; more than one needs :func:`mlflow_db_upgrade` first). Returns (process,
    base URL); stop it with :func:`stop_process`."""
    from attnstudy.serving import ui

    port = free_port()
    log = open(log_path, "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "attnstudy.cli",
            "server",
            "--backend-store-uri",
            backend_uri,
            "--artifacts",
            str(artifacts),
            "--port",
            str(port),
            "--workers",
            str(workers),
        ],
        env=dict(os.environ) | env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    base = f"http://127.0.0.1:{port}"
    ui.wait_healthy(base, timeout, proc)
    return proc, base


def mlflow_db_upgrade(backend_uri: str, env: dict[str, str], timeout: float = 300) -> None:
    """``mlflow db upgrade URI``, as docs/cluster.md has a team run it before a server with
    several workers (the password in ``env``'s ``PGPASSWORD``).

    Raises:
        RuntimeError: it failed (its last line).
    """
    done = subprocess.run(
        [sys.executable, "-P", "-m", "mlflow", "db", "upgrade", backend_uri],
        env=dict(os.environ) | env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        raise RuntimeError(f"mlflow db upgrade failed: {lines[-1] if lines else 'no output'}")


def tree_pids(proc: subprocess.Popen | None) -> set[int]:
    """A process and its descendants (none if it is gone)."""
    import psutil

    if proc is None or proc.poll() is not None:
        return set()
    try:
        root = psutil.Process(proc.pid)
        return {root.pid, *(c.pid for c in root.children(recursive=True))}
    except psutil.Error:
        return set()


def stop_process(proc: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """SIGTERM (the CLI stops what it started), SIGKILL after ``timeout`` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def listeners(pids: set[int]) -> dict[int, list[str]]:
    """The sockets each process listens on (TCP LISTEN, and bound UDP sockets), ``ip:port``."""
    import psutil

    out: dict[int, list[str]] = {}
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            for c in psutil.Process(pid).net_connections(kind="inet"):
                udp = c.type == 2 and not c.raddr  # socket.SOCK_DGRAM
                if c.status == psutil.CONN_LISTEN or udp:
                    out.setdefault(pid, []).append(f"{c.laddr.ip}:{c.laddr.port}")
    return out


def is_loopback(address: str) -> bool:
    """Whether ``ip:port`` is on loopback (127.0.0.0/8, ::1, or IPv4-mapped 127.x)."""
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)
