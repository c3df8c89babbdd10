"""The UI server's guardian: stops the MLflow server when the ``attnstudy ui`` process that
started it is gone, however it ended (``kill -9``, an OOM kill, a closed terminal).

Started by :func:`attnstudy.ui.start_server` as ``python -m attnstudy.ui_guard PGID`` with its
standard input a pipe whose other end only the CLI holds; when the CLI dies the pipe closes, this
process reads end-of-file and terminates the server's whole process group. It runs in a session
of its own, so a Ctrl-C at the terminal does not reach it.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def stop_group(pgid: int, timeout: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``timeout`` seconds."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pgid = int(argv[0])
    while sys.stdin.buffer.read(4096):  # the CLI never writes: this returns at end-of-file
        pass
    stop_group(pgid)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
