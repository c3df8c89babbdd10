"""The guardian of a server this process started: stops it when the process that started it is
gone, however it ended (``kill -9``, an OOM kill, a closed terminal). It guards the UI's and
``attnstudy server``'s MLflow server and a study's private Ray head.

Started as ``python -m attnstudy.serving.ui_guard PGID`` with its standard input a pipe whose other
end
only the starting process holds; when that process dies the pipe closes, this process reads
end-of-file and stops the server: its process group and every process of its session (a Ray
head's workers each lead a group of their own, in the head's session). It runs in a session of
its own, so a Ctrl-C at the terminal does not reach it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple


def start_guard(pgid: int) -> subprocess.Popen:
    """Start the guardian of the server whose process group (and session) is ``pgid``; this
    process holds the only write end of its standard input. Stop it with :func:`release_guard`."""
    return subprocess.Popen(
        [sys.executable, "-m", "attnstudy.serving.ui_guard", str(pgid)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def release_guard(guard: subprocess.Popen, timeout: float = 10.0) -> None:
    """Once the server is stopped: close the guardian's pipe (end-of-file: it finds the server
    gone and exits) and wait for it, killing it after ``timeout`` seconds."""
    guard.stdin.close()
    try:
        guard.wait(timeout)
    except subprocess.TimeoutExpired:
        guard.kill()


class ProcStat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` the guardians need (proc(5))."""

    ppid: int
    pgid: int
    sid: int
    state: str  # "R", "S", "Z" (zombie), …


def proc_table() -> dict[int, ProcStat]:
    """pid → :class:`ProcStat` of every process, from ``/proc`` (empty where there is none).

    A process that ends while the table is read is left out."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            out[int(stat.parent.name)] = ProcStat(
                int(fields[1]), int(fields[2]), int(fields[3]), fields[0]
            )
        except (OSError, IndexError, ValueError):
            continue
    return out


def session_members(sid: int) -> set[int]:
    """PIDs of the live (non-zombie) processes of session ``sid``, from ``/proc``."""
    return {pid for pid, p in proc_table().items() if p.sid == sid and p.state != "Z"}


def stop_group(pgid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left of it, and of the session it
    leads (``pgid`` was started with ``start_new_session``), after ``timeout`` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and session_members(pgid):
        time.sleep(0.1)
    for pid in session_members(pgid):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def main(argv: list[str]) -> int:
    """Wait for end-of-file on stdin (the starting process has exited, however it ended), then
    stop the server (:func:`stop_group` of the process group ``argv[0]``);
    SIGINT is ignored: a Ctrl-C is for the starting process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pgid = int(argv[0])
    while sys.stdin.buffer.read(4096):  # the starter never writes: this returns at end-of-file
        pass
    stop_group(pgid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
