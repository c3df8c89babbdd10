"""The driver's error line names the cause first and what to do, never cut mid-word.

Stopping the tracking server or its PostgreSQL mid-study ended the driver with a line cut at about
350 characters exactly where MLflow's text gives the cause (``…NewConnectionErro``,
``…ResponseError('to``), and nothing said "database down" or "restart it and use --resume".
The errors here are MLflow's own, from a refused port and from a server that answers 500 (what a
tracking server answers while its database is down).
"""

from __future__ import annotations

import http.server
import threading

import pytest

from attnstudy.failure_causes import (
    CAUSES,
    RESUME,
    classify,
    clip,
    command_line,
    study_failed_line,
)
from attnstudy.study import Failure, StudyFailedError, StudyResult, error_text

LABELS = {c.label for c in CAUSES}


class _Answers500(http.server.BaseHTTPRequestHandler):
    """A tracking server whose database is down: /health 200 (MLflow's own), the API 500."""

    def _answer(self):
        if self.path.startswith("/health"):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")
            return
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(
            b'{"error_code": "INTERNAL_ERROR", "message": "(psycopg.OperationalError) '
            b'connection failed: Connection refused"}'
        )

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def db_down_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers500)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _mlflow_error(uri: str, monkeypatch) -> Exception:
    """MLflow's own exception for one API call to ``uri`` (no retries)."""
    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with pytest.raises(Exception) as caught:
        MlflowClient(uri).get_run("0" * 32)
    return caught.value


def _refused_uri() -> str:
    from attnstudy.distributed import free_port

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


def test_database_down_is_named_first(monkeypatch, db_down_server):
    err = _mlflow_error(db_down_server, monkeypatch)
    assert "too many 500 error responses" in str(err)
    assert classify(str(err)).label == "database down"
    assert error_text(err).startswith("database down: MlflowException: ")


def test_the_tracker_says_database_down_with_what_to_do(monkeypatch, db_down_server):
    from attnstudy.tracking import Tracker
    from attnstudy.tracking.client import TrackingError

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    tracker = Tracker(db_down_server, timeout=5)
    with pytest.raises(TrackingError) as caught:
        tracker.get_run("0" * 32)
    message = str(caught.value)
    assert message.startswith(f"database down: tracking server {db_down_server} answers"), message
    assert "start the database" in message and "--resume" in message


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
    from attnstudy.checkpoint_store import CheckpointStore

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


def test_the_study_line_leads_with_each_cause_once(monkeypatch, db_down_server):
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
    assert LABELS == {"checkpoint store", "database down", "tracking server down", "worker died"}
    assert all(c.advice.endswith(RESUME) for c in CAUSES)
