"""The driver's error line names the cause first and what to do, never cut mid-word.

Stopping the tracking server or its PostgreSQL mid-study ended the driver with a line cut at about
350 characters exactly where MLflow's text gives the cause (``…NewConnectionErro``,
``…ResponseError('to``), and nothing said "database down" or "restart it and use --resume".
The errors here are MLflow's own, from a refused port and from small hostile servers on loopback
whose ``/health`` and API answer as a server with a database, an artifact store or itself down
would: MLflow's server answers 503 while its database is down, ``attnstudy server``'s ``/health``
503 naming the part that is down; an HTTP 500 while ``/health`` answers 200 is the server's own
failure (it was reported as "database down … the server needs no restart").
"""

from __future__ import annotations

import http.server
import threading

import pytest

from attnstudy.runtime.failure_causes import (
    CAUSES,
    RESUME,
    classify,
    clip,
    command_line,
    study_failed_line,
)
from attnstudy.study.driver import Failure, StudyFailedError, StudyResult, error_text

LABELS = {c.label for c in CAUSES}


def _mlflow_error(uri: str, monkeypatch) -> Exception:
    """MLflow's own exception for one API call to ``uri`` (no retries)."""
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(Exception) as caught:
        MlflowClient(uri).get_run("0" * 32)
    return caught.value


def _refused_uri() -> str:
    from attnstudy.executors.distributed import free_port

    return f"http://127.0.0.1:{free_port()}"


def _whole_words(clipped: str, original: str) -> bool:
    """Every word of ``clipped`` (less a final "…") is a word of ``original`` (punctuation
    that ends a word aside)."""
    words = {w.rstrip(",;:(") for w in original.split()}
    return all(w.rstrip(",;:(") in words for w in clipped.removesuffix("…").split())


def test_server_down_is_named_first_and_not_cut_mid_word(monkeypatch):
    err = _mlflow_error(_refused_uri(), monkeypatch)
    assert classify(str(err)).label == "tracking server down"
    line = error_text(err)
    assert line.startswith("tracking server down: MlflowException: API request to "), line
    assert len(line) <= 300 and line.endswith("…")
    rest = line.removeprefix("tracking server down: ")
    assert _whole_words(rest, f"MlflowException: {err}"), line


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A tracking server on loopback that answers ``/health`` with ``health`` (status, body) and
    every API request with ``api`` (set on a subclass)."""

    health: tuple[int, bytes] = (200, b"OK")
    api = 500

    def _answer(self):
        code, body = self.health if self.path.startswith("/health") else (self.api, b"{}")
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


_HANDLERS: dict[str, type[_Hostile]] = {}
"""The handler class of each hostile server, by URI."""


@pytest.fixture
def hostile():
    """Starts a :class:`_Hostile` server: ``hostile(api, health=(200, b"OK"))`` gives its URI
    (its handler class in :data:`_HANDLERS`)."""
    servers = []

    def start(api: int, health: tuple[int, bytes] = (200, b"OK")) -> str:
        handler = type("Handler", (_Hostile,), {"api": api, "health": health})
        servers.append(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler))
        threading.Thread(target=servers[-1].serve_forever, daemon=True).start()
        uri = f"http://127.0.0.1:{servers[-1].server_address[1]}"
        _HANDLERS[uri] = handler
        return uri

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _tracker_line(uri: str, monkeypatch, health: tuple[int, bytes] | None = None) -> str:
    """The Tracker's one line for ``get_run`` against ``uri`` (MLflow's retries off), its
    ``/health`` answering ``health`` from then on (the Tracker is opened while it answers 200)."""
    from attnstudy.tracking import Tracker
    from attnstudy.tracking.client import TrackingError

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    tracker = Tracker(uri, timeout=5)
    if health is not None:
        _HANDLERS[uri].health = health
    with pytest.raises(TrackingError) as caught:
        tracker.get_run("0" * 32)
    return str(caught.value)


def test_an_http_500_with_a_healthy_server_is_not_database_down(monkeypatch, hostile):
    """/health 200 and the API 500 was "database down … the server needs no restart"."""
    uri = hostile(500)
    line = _tracker_line(uri, monkeypatch)
    assert line.startswith(
        f"tracking server failed: {uri} answered HTTP 500, and its /health answers 200 OK (no "
        "part reported down); check the server's log for the error, then run the command again"
    ), line
    assert "database" not in line and "needs no restart" not in line
    assert classify(line).label == "tracking server failed"
    study = study_failed_line([f"copy/x/seed1 (training: ServerUnansweredError: {line})"])
    assert study.startswith("tracking server failed (check the tracking server's log"), study
    # MLflow's own text, as a part of a study that did not pass through the Tracker
    assert classify(str(_mlflow_error(uri, monkeypatch))).label == "tracking server failed"


def test_the_cli_names_a_failed_server_not_its_database(monkeypatch, hostile, capfd, tmp_path):
    """``attnstudy predict runs:/… abc`` against the server above, at the command line."""
    from cli_in_process import run_cli

    uri = hostile(500)
    argv = ["predict", "runs:/0123456789abcdef0123456789abcdef", "abc", "--tracking-uri", uri]
    res = run_cli(capfd, argv, cwd=tmp_path, env={"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"})
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("attnstudy: error: ")]
    assert res.returncode == 1 and len(errors) == 1, res.stderr
    assert errors[0].startswith(
        f"attnstudy: error: tracking server failed: {uri} answered HTTP 500"
    )
    assert "database" not in errors[0]


def test_an_http_503_is_database_down(monkeypatch, hostile):
    """PostgreSQL stopped behind MLflow's server: it answers 503 (TEMPORARILY_UNAVAILABLE) and
    the line had no cause."""
    uri = hostile(503)  # /health 200: a plain mlflow server's
    line = _tracker_line(uri, monkeypatch)
    assert line.startswith(
        f"database down: tracking server {uri} answers, but not for its database (HTTP 503; "
        "/health answers 200 OK); start the database (the server needs no restart), then "
    ), line
    err = _mlflow_error(uri, monkeypatch)
    assert "too many 503 error responses" in str(err)
    assert classify(str(err)).label == "database down"
    assert error_text(err).startswith("database down: MlflowException: ")


DB_DOWN = b"the database postgresql+psycopg://u@127.0.0.1:1/m does not answer: connection failed"
S3_DOWN = (
    b"the artifact store s3://team/mlflow at http://127.0.0.1:1 does not answer: Could not "
    b'connect to the endpoint URL: "http://127.0.0.1:1/team?list-type=2"'
)


@pytest.mark.parametrize("api", [500, 503])
def test_health_names_the_part_that_is_down(monkeypatch, hostile, api):
    """attnstudy server's /health answers 503 naming its database or its artifact store; the
    Tracker's line says which (an S3 outage was "database down")."""
    uri = hostile(api)
    line = _tracker_line(uri, monkeypatch, (503, DB_DOWN))
    assert line.startswith(
        f"database down: tracking server {uri} answers, but {DB_DOWN.decode()} (HTTP {api}; "
        "/health answers 503); start the database (the server needs no restart)"
    ), line
    uri = hostile(api)
    line = _tracker_line(uri, monkeypatch, (503, S3_DOWN))
    assert line.startswith(
        f"artifact store down: tracking server {uri} answers, but {S3_DOWN.decode()} (HTTP "
        f"{api}; /health answers 503); start the artifact store or correct the server's access"
    ), line
    assert "database" not in line
    assert classify(line).label == "artifact store down"
    assert command_line(RuntimeError(line)) == line  # named first, advice given: as it is


def test_the_preflight_check_names_a_down_artifact_store(hostile):
    from attnstudy.tracking.client import TrackingError, check_server

    uri = hostile(500, (503, S3_DOWN))
    with pytest.raises(TrackingError) as caught:
        check_server(uri, 0.5)
    message = str(caught.value)
    assert message.startswith(f"artifact store down: tracking server {uri} answers, but "), message
    assert "the artifact store s3://team/mlflow at http://127.0.0.1:1 does not answer" in message


def test_an_unreachable_artifact_location_is_the_artifact_store():
    """An experiment's own s3:// location written by a node directly (botocore's error)."""
    text = (
        "copy/x/seed1 (training: EndpointConnectionError: Could not connect to the endpoint URL: "
        '"http://127.0.0.1:1/team/mlflow/3/abc/artifacts/config.json")'
    )
    assert classify(text).label == "artifact store down"
    assert study_failed_line([text]).startswith("artifact store down (start the artifact store")


def test_a_dead_worker_is_named_first():
    text = (
        "copy/additive-bahdanau/seed1 (training: the Ray worker running it died "
        "(WorkerCrashedError: The worker died unexpectedly while executing this task.))"
    )
    assert classify(text).label == "worker died"
    line = study_failed_line([text])
    assert line.startswith("worker died (see the Ray logs of its node"), line
    assert f"then {RESUME}): 1 part(s) of the study failed: copy/additive" in line


def test_a_silent_checkpoint_store_is_named_not_the_tracking_server(monkeypatch):
    """NEW-13: a checkpoint store's read timeout was labelled "tracking server down", with the
    advice to restart the tracking server."""
    from attnstudy.study.checkpoint_store import CheckpointStore

    class ReadTimeoutError(Exception):  # botocore's, by name (no boto3 needed here)
        pass

    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", "http://127.0.0.1:18803")
    err = CheckpointStore("ckpt", "p")._fail(
        "download",
        "86d20dc84b9d4c6a",
        ReadTimeoutError('Read timeout on endpoint URL: "http://127.0.0.1:18803/ckpt/p/x"'),
    )
    text = str(err)
    assert classify(text).label == "checkpoint store"
    line = command_line(err)
    assert line.startswith(
        "checkpoint store: cannot download checkpoint s3://ckpt/p/86d20dc84b9d4c6a/last.pt at "
        "http://127.0.0.1:18803 (ReadTimeoutError: Read timeout"
    ), line
    assert "check that the checkpoint store at http://127.0.0.1:18803 answers" in line
    assert "tracking server" not in line and line.count("unset ATTNSTUDY_CHECKPOINT_URI") == 1
    # a study's line: the cause with its advice, once
    study = study_failed_line([f"copy/x/seed1 (training: CheckpointStoreError: {text})"])
    assert study.startswith("checkpoint store (check that the S3 endpoint named"), study
    assert "tracking server" not in study


@pytest.mark.parametrize(
    "text",
    [
        "TrainingDivergedError: loss is NaN at epoch 3",
        "sqlite3.OperationalError: database is locked",  # a local store: no cluster cause
        "DataError: the data on this node differ from the driver's",
    ],
)
def test_other_errors_have_no_cluster_cause(text):
    assert classify(text) is None
    assert study_failed_line([f"x (training: {text})"]) == (
        f"1 part(s) of the study failed: x (training: {text})"
    )


def test_the_study_line_leads_with_each_cause_once(monkeypatch):
    down = _mlflow_error(_refused_uri(), monkeypatch)
    result = StudyResult("s1")
    result.failures += [
        Failure("copy/additive-bahdanau/seed1", "training", error_text(down)),
        Failure("copy/none-bahdanau/seed1", "ablation", error_text(down)),
        Failure("copy/none-bahdanau/seed2", "training", "ValueError: bad value"),
    ]
    line = str(StudyFailedError(result))
    assert line.startswith(
        "tracking server down (restart the tracking server (attnstudy server …), then "
        f"{RESUME}): 3 part(s) of the study failed: copy/additive-bahdanau/seed1 (training: "
        "tracking server down: MlflowException: API request to http://127.0.0.1:"
    ), line
    assert line.count("restart the tracking server") == 1
    assert line.endswith("; copy/none-bahdanau/seed2 (training: ValueError: bad value)")
    for part in line.split("; copy/")[1:]:
        assert "NewConnectionErro " not in part and not part.endswith("Erro")


def test_the_cli_line_puts_the_cause_first_and_says_what_to_do(monkeypatch):
    err = _mlflow_error(_refused_uri(), monkeypatch)
    line = command_line(err)
    assert line.startswith("tracking server down: API request to ")
    assert line.endswith(f"; restart the tracking server (attnstudy server …), then {RESUME}")
    assert "NewConnectionError" in line  # the whole first line: nothing cut


@pytest.mark.parametrize("limit", [20, 37, 80, 300])
def test_clip_cuts_between_words(limit):
    text = "API request to http://h:1/api failed with exception NewConnectionError " * 8
    out = clip(text, limit)
    assert len(out) <= limit and out.endswith("…")
    assert _whole_words(out, text), out
    assert clip("short text", limit) == "short text"


def test_every_cause_has_advice_ending_in_resume():
    assert LABELS == {
        "checkpoint store",
        "database down",
        "artifact store down",
        "tracking server failed",
        "tracking server down",
        "worker died",
    }
    assert all(c.advice.endswith(RESUME) for c in CAUSES)
