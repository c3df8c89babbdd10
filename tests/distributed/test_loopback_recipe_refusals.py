"""The one-machine recipe's refusals (``python -m attnstudy.executors.loopback_cluster``): each in
one line,
exit 2, before Ray starts anything (seconds)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


def _refusal(*args: str) -> tuple[int, str]:
    res = subprocess.run(
        [sys.executable, "-m", "attnstudy.executors.loopback_cluster", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return res.returncode, res.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0"], "--nodes must be at least 1, got 0"),
        (["--num-cpus", "0"], "--num-cpus must be at least 1, got 0"),
        (["--port", "80"], "--port must be between 1024 and 65535, got 80"),
        (["--object-store-mb", "10"], "--object-store-mb must be at least 75"),
        (["--nodes", "two"], "argument --nodes: invalid int value: 'two'"),
    ],
)
def test_bad_values_are_refused_in_one_line(args, message):
    code, err = _refusal(*args)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("attnstudy: error: "), err
    assert message in err, err


def test_a_port_in_use_is_refused_before_ray_waits_for_it():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, err = _refusal("--nodes", "1", "--port", str(port))
    assert code == 2
    assert err == f"attnstudy: error: port {port} is in use; choose another with --port\n"
