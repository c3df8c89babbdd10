"""Every wait on a tracking server has a deadline (NEW-3 of the 2026-12-06 review): a refused
connection fails at once; a server whose ``/health`` answers but whose API never does costs at most
``--tracking-timeout`` (+ start-up), not retries × timeout (72 s with a 3 s timeout before)."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time

import pytest


class _HealthOnly(http.server.BaseHTTPRequestHandler):
    """Answers ``GET /health`` with 200 and never answers anything else; counts the API requests."""

    api_requests: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.rstrip("/") == "/health":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")
            return
        type(self).api_requests.append(self.path)
        time.sleep(3600)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def hanging_server():
    _HealthOnly.api_requests.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HealthOnly)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _cli(*args, timeout=60):
    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return out, time.monotonic() - t0


def test_a_server_that_hangs_in_its_api_costs_the_timeout_once(hanging_server):
    out, took = _cli(
        "predict",
        "runs:/0123456789abcdef0123456789abcdef",
        "abc",
        "--tracking-uri",
        hanging_server,
        "--tracking-timeout",
        "3",
    )
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"attnstudy: error: tracking server {hanging_server} did not answer")
    # The deadline is paid once: one API request, no retries (urllib3's retries × timeout took 72 s
    # with a 3 s timeout). The wall-clock bound is only a loose guard (start-up under load varies);
    # the request count is what the test holds.
    assert len(_HealthOnly.api_requests) == 1, _HealthOnly.api_requests
    assert took < 40, took


def test_a_refused_connection_fails_at_once():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from attnstudy.tracking.client import TrackingError, check_server

    t0 = time.monotonic()
    with pytest.raises(TrackingError, match=r"refused the connection .* sqlite:///PATH/mlflow.db"):
        check_server(f"http://127.0.0.1:{port}", 10)
    assert time.monotonic() - t0 < 2
