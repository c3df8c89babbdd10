"""Artifacts and training checkpoints on an S3-compatible store, on loopback against moto's
server mode.

An experiment whose artifact location is ``s3://`` keeps its model in the bucket; with
``$ATTNSTUDY_CHECKPOINT_URI`` each checkpoint is uploaded too, and a training interrupted on one
node resumes on another (a fresh project root: no local checkpoint) from the bucket's checkpoint
to the same model as an uninterrupted training. Prerequisites: the ``[distributed]`` extra
(boto3) and ``moto[server]`` (``make test-deps`` installs both).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import torch
from prerequisites import require

BUCKET = "attnstudy-test"
MARK = 9.5  # a train/loss no epoch of the tiny model logs
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on a free loopback port with one empty bucket; yields its endpoint URL."""
    missing = [m for m in ("boto3", "moto") if importlib.util.find_spec(m) is None]
    require(
        not missing, f"no {', '.join(missing)} (make test-deps installs boto3 and moto[server])"
    )
    from moto.server import ThreadedMotoServer

    from attnstudy.executors.ray_head import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    saved = {k: os.environ.get(k) for k in [*S3_ENV, "MLFLOW_S3_ENDPOINT_URL"]}
    os.environ.update(S3_ENV | {"MLFLOW_S3_ENDPOINT_URL": url})
    try:
        import boto3

        boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _objects(url: str, prefix: str) -> dict[str, int]:
    import boto3

    client = boto3.client("s3", endpoint_url=url)
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}


def _node(tmp_path, monkeypatch, name: str):
    """A fresh project root, as on another node (its own checkpoints folder)."""
    root = tmp_path / name
    (root / "mlruns").mkdir(parents=True)
    monkeypatch.setenv("ATTNSTUDY_ROOT", str(root))
    return root


def test_a_malformed_checkpoint_uri_is_refused_in_one_line(monkeypatch):
    from attnstudy.config import ConfigError
    from attnstudy.study.checkpoint_store import CheckpointStore

    for bad in ("/srv/ckpt", "s3://", "s3://Upper_Case/x", "gs://bucket/x"):
        monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", bad)
        with pytest.raises(ConfigError, match=r"^ATTNSTUDY_CHECKPOINT_URI=.*give s3://BUCKET"):
            CheckpointStore.from_env()
    monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", "s3://my-bucket/team/ckpt/")
    store = CheckpointStore.from_env()
    assert store.key_of("0123abcd") == "team/ckpt/0123abcd/last.pt"  # the old layout
    assert store.for_experiment("tiny").key_of("0123abcd") == "team/ckpt/tiny/0123abcd/last.pt"
    assert store.for_experiment("My exp").key_of("k") == "team/ckpt/_4Dy_20exp/k/last.pt"
    assert CheckpointStore("b").for_experiment("a/b").key_of("k") == "a_2Fb/k/last.pt"
    monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", "")
    assert CheckpointStore.from_env() is None


def test_an_unreachable_store_fails_in_one_line_naming_the_object(monkeypatch, tmp_path):
    from attnstudy.executors.ray_head import free_port
    from attnstudy.study.checkpoint_store import CheckpointStore, CheckpointStoreError

    require(importlib.util.find_spec("boto3") is not None, "boto3 ([distributed] extra)")
    monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nobody
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "last.pt").write_bytes(b"x")
    with pytest.raises(CheckpointStoreError) as err:
        CheckpointStore("b-1", "p").upload("k", tmp_path / "last.pt")
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("cannot upload checkpoint s3://b-1/p/k/last.pt at http://127.0.0.1:")
    assert "unset ATTNSTUDY_CHECKPOINT_URI" in text


class _Silent:
    """An S3 endpoint on loopback that accepts connections and never answers (with ``head``,
    it answers HEAD requests for a 10-byte object and never a GET); counts what it was sent."""

    def __init__(self, head: bool = False):
        self.head = head
        self.accepted = 0
        self.gets = 0
        self._held: list[socket.socket] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:  # closed
                return
            self.accepted += 1
            self._held.append(conn)
            if self.head:
                threading.Thread(target=self._answer_heads, args=(conn,), daemon=True).start()

    def _answer_heads(self, conn: socket.socket):
        data = b""
        try:
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                request, data = data.split(b"\r\n\r\n", 1)
                if not request.startswith(b"HEAD "):
                    self.gets += request.startswith(b"GET ")
                    return  # held, never answered
                conn.sendall(
                    b'HTTP/1.1 200 OK\r\nContent-Length: 10\r\nETag: "e"\r\n'
                    b"Last-Modified: Mon, 07 Dec 2026 00:00:00 GMT\r\n\r\n"
                )
        except OSError:
            return

    def close(self):
        self._server.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent_store(monkeypatch):
    """A :class:`_Silent` endpoint factory, with the store's timeouts made small and botocore's
    random backoff between tries (at most 1 s + 2 s) taken out, so that a test takes seconds."""
    require(importlib.util.find_spec("boto3") is not None, "boto3 ([distributed] extra)")
    from botocore.retries.standard import ExponentialBackoff

    from attnstudy.study import checkpoint_store

    monkeypatch.setattr(checkpoint_store, "CONNECT_TIMEOUT_S", 0.5)
    monkeypatch.setattr(checkpoint_store, "READ_TIMEOUT_S", 0.3)
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
    for k, v in S3_ENV.items():
        monkeypatch.setenv(k, v)
    made: list[_Silent] = []

    def make(head: bool = False) -> _Silent:
        made.append(_Silent(head))
        monkeypatch.setenv("MLFLOW_S3_ENDPOINT_URL", made[-1].url)
        return made[-1]

    yield make
    for endpoint in made:
        endpoint.close()


def _bound_s() -> float:
    """docs/cluster.md's bound on one request that gets no answer: MAX_ATTEMPTS × (connect +
    read), with the timeouts as patched, plus a second a try for an upload's wait for
    ``100 Continue`` (botocore's fixed 1 s) and one for a loaded machine."""
    from attnstudy.study import checkpoint_store as cs

    return cs.MAX_ATTEMPTS * (cs.CONNECT_TIMEOUT_S + cs.READ_TIMEOUT_S + 1.0) + 1.0


def test_a_silent_store_fails_a_download_after_three_tries(silent_store, tmp_path):
    """NEW-13: a store that accepts and never answers took 5 tries of 60 s and more; now the
    whole download gives up after MAX_ATTEMPTS tries, leaving nothing behind."""
    from attnstudy.study.checkpoint_store import MAX_ATTEMPTS, CheckpointStore, CheckpointStoreError

    endpoint = silent_store()
    start = time.monotonic()
    with pytest.raises(CheckpointStoreError) as err:
        CheckpointStore("ckpt", "p").download("k", tmp_path / "ckpt" / "last.pt")
    elapsed = time.monotonic() - start
    assert endpoint.accepted == MAX_ATTEMPTS == 3
    assert elapsed < _bound_s()
    text = str(err.value)
    assert text.startswith(f"cannot download checkpoint s3://ckpt/p/k/last.pt at {endpoint.url} ")
    assert "ReadTimeoutError" in text and "\n" not in text
    assert list((tmp_path / "ckpt").iterdir()) == []  # no partial download left


def test_a_store_that_never_answers_a_get_fails_after_three_tries(silent_store, tmp_path):
    """S3Transfer retried a GET that timed out 5 times, each after botocore's own tries."""
    from attnstudy.study.checkpoint_store import MAX_ATTEMPTS, CheckpointStore, CheckpointStoreError

    endpoint = silent_store(head=True)
    with pytest.raises(CheckpointStoreError, match=r"^cannot download checkpoint .*ReadTimeout"):
        CheckpointStore("ckpt", "p").download("k", tmp_path / "last.pt")
    assert endpoint.gets == MAX_ATTEMPTS
    assert not (tmp_path / "last.pt").exists()


def test_a_silent_store_fails_an_upload_after_three_tries(silent_store, tmp_path):
    from attnstudy.study.checkpoint_store import MAX_ATTEMPTS, CheckpointStore, CheckpointStoreError

    endpoint = silent_store()
    (tmp_path / "last.pt").write_bytes(b"x" * 100)
    start = time.monotonic()
    with pytest.raises(CheckpointStoreError, match=r"^cannot upload checkpoint s3://ckpt/p/k/"):
        CheckpointStore("ckpt", "p").upload("k", tmp_path / "last.pt")
    assert endpoint.accepted == MAX_ATTEMPTS
    assert time.monotonic() - start < _bound_s()
    assert (tmp_path / "last.pt").read_bytes() == b"x" * 100  # the local checkpoint stays


def test_artifacts_on_s3_are_accepted_for_a_cluster():
    from attnstudy.executors.distributed import check_artifact_location

    check_artifact_location("s3://bucket/mlflow/3", "tiny", "http://h:5000")


@pytest.mark.slow
def test_a_training_interrupted_on_one_node_resumes_from_the_bucket_on_another(
    s3, tmp_path, monkeypatch, tiny_config
):
    from mlflow import MlflowClient

    from attnstudy.runtime.paths import checkpoint_dir as checkpoint_dir_of
    from attnstudy.study import model_runs
    from attnstudy.tracking import Tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = tiny_config.runs()[0]
    checkpoint_dir = functools.partial(checkpoint_dir_of, spec.experiment)
    at = f"checkpoints/{spec.experiment}"  # the experiment's checkpoints in the bucket
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"epochs": 3})})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker(uri)
    reference_exp = tracker.experiment_id("reference")  # artifacts on disk, no shared store
    MlflowClient(uri).create_experiment("shared", artifact_location=f"s3://{BUCKET}/mlflow")
    shared_exp = tracker.experiment_id("shared")

    # the reference: trained without interruption on a node of its own
    _node(tmp_path, monkeypatch, "reference")
    monkeypatch.delenv("ATTNSTUDY_CHECKPOINT_URI", raising=False)
    reference = model_runs.train_spec(spec, tracker, experiment_id=reference_exp, progress=False)
    ref_weights = checkpoint_dir(reference.key) / "model"

    # node 1: checkpoints shared through the bucket; interrupted after epoch 1
    monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", f"s3://{BUCKET}/checkpoints")
    node1 = _node(tmp_path, monkeypatch, "node1")
    real_train = model_runs.train

    def interrupted(*args, on_epoch=None, **kw):
        def hook(epoch, metrics):
            on_epoch(epoch, metrics)
            if epoch == 1:
                raise KeyboardInterrupt

        return real_train(*args, on_epoch=hook, **kw)

    monkeypatch.setattr(model_runs, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model_runs.train_spec(spec, tracker, experiment_id=shared_exp, progress=False)
    monkeypatch.setattr(model_runs, "train", real_train)
    key = reference.key
    stored = _objects(s3, "checkpoints/")
    assert list(stored) == [f"{at}/{key}/last.pt"]
    local = torch.load(
        node1 / "mlruns" / "checkpoints" / spec.experiment / key / "last.pt", weights_only=True
    )
    assert local["epoch"] == 1

    # a mark in the bucket's copy (epoch 1's logged train/loss) shows where the resume read from
    import boto3

    client = boto3.client("s3", endpoint_url=s3)
    marked = tmp_path / "marked.pt"
    client.download_file(BUCKET, f"{at}/{key}/last.pt", str(marked))
    ckpt = torch.load(marked, weights_only=True)
    assert ckpt["epoch"] == 1
    ckpt["history"][0]["train/loss"] = MARK
    torch.save(ckpt, marked)
    client.upload_file(str(marked), BUCKET, f"{at}/{key}/last.pt")

    # node 2: no local checkpoint; --resume takes epoch 1 from the bucket and trains 2 and 3
    _node(tmp_path, monkeypatch, "node2")
    assert not (checkpoint_dir(key) / "last.pt").exists()
    resumed = model_runs.train_spec(
        spec, tracker, experiment_id=shared_exp, resume=True, progress=False
    )
    assert not resumed.reused and resumed.key == key
    history = tracker.client.get_metric_history(resumed.run_id, "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3]
    ref_history = tracker.client.get_metric_history(reference.run_id, "train/loss")
    assert sorted((m.step, m.value) for m in history) == sorted(
        (m.step, MARK if m.step == 1 else m.value) for m in ref_history
    )
    # the same model as the uninterrupted training: weights and test metrics
    ours = torch.load(checkpoint_dir(key) / "model" / "weights.pt", weights_only=True)
    theirs = torch.load(ref_weights / "weights.pt", weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    test = {k: v for k, v in resumed.metrics.items() if k.startswith("test/")}
    assert test and test == {k: reference.metrics[k] for k in test}
    # the bucket holds the last checkpoint (epoch 3) and the run's artifacts, model included
    last = torch.load(checkpoint_dir(key) / "last.pt", weights_only=True)
    assert last["epoch"] == 3
    artifacts = _objects(s3, "mlflow/")
    assert any(k.startswith(f"mlflow/{resumed.run_id}/artifacts/") for k in artifacts)
    assert any(k.endswith("/weights.pt") for k in artifacts), sorted(artifacts)[:20]
    assert _objects(s3, "checkpoints/")[f"{at}/{key}/last.pt"] == (
        (checkpoint_dir(key) / "last.pt").stat().st_size
    )


@pytest.mark.parametrize("shared", [True, False])
def test_the_resume_note_says_where_a_training_resumes(monkeypatch, capfd, tmp_path, shared):
    """Every ``--resume`` on a cluster said that a training resumes only on the node
    that holds its checkpoint, also with ``ATTNSTUDY_CHECKPOINT_URI`` set (it resumed on the
    head, from the bucket). The note now follows the variable; the study itself is stubbed, and
    so is the tracking server's health check that comes before it (no server listens here)."""
    from cli_in_process import run_cli

    from attnstudy import api
    from attnstudy.config import ConfigError
    from attnstudy.executors import distributed
    from attnstudy.runtime import store_check

    class Executor:  # no Ray: the note comes before the study
        def __init__(self, address=None):
            self.address = address

    def stop(*args, **kwargs):
        raise ConfigError("stopped before the study")

    def healthy(uri, timeout):
        assert uri == "http://127.0.0.1:5000"

    monkeypatch.setattr(store_check, "check_server", healthy)
    monkeypatch.setattr(distributed, "RayExecutor", Executor)
    monkeypatch.setattr(api, "run", stop)
    tiny = Path(__file__).parents[2] / "experiments" / "tiny.toml"
    argv = ["run", str(tiny), "--executor", "ray", "--ray-address", "127.0.0.1:6379", "--resume"]
    env = {
        "ATTNSTUDY_CHECKPOINT_URI": "s3://team-bucket/ckpt" if shared else None,
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
        "RAY_ADDRESS": None,
    }
    res = run_cli(capfd, argv, cwd=tmp_path, env=env)
    assert res.returncode == 2 and "stopped before the study" in res.stderr, res.stderr
    (note,) = [ln for ln in res.stderr.splitlines() if "--resume on a cluster" in ln]
    if shared:
        assert note.endswith(
            "--resume on a cluster continues an interrupted training from its last checkpoint on "
            "whichever node its task runs: checkpoints are shared through s3://team-bucket/ckpt "
            "(ATTNSTUDY_CHECKPOINT_URI)"
        ), note
        assert "only if" not in note
    else:
        assert "only if its task runs on the node that holds it" in note
        assert "set ATTNSTUDY_CHECKPOINT_URI=s3://BUCKET/PREFIX to share" in note


@pytest.mark.slow
def test_a_resume_never_takes_another_experiments_checkpoint_from_the_bucket(
    s3, tmp_path, monkeypatch, caplog
):
    """A resume "resumed" every training from another experiment's finished
    checkpoint in the bucket (the key had no experiment) and re-logged its epochs. Two
    experiments with the same model key: beta's resume on a fresh node takes neither alpha's
    checkpoint nor one of the old layout (whose experiment nothing says; a note names it)."""
    import logging

    import boto3

    from attnstudy.experiment import load_experiment
    from attnstudy.study import model_runs
    from attnstudy.tracking import Tracker

    caplog.set_level(logging.WARNING, logger="attnstudy")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", f"s3://{BUCKET}/per-exp")
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tiny = Path(__file__).parents[2] / "experiments" / "tiny.toml"
    models = 'models=[{model={attention="additive",flow="bahdanau"}}]'
    specs = {}
    for name in ("alpha", "beta"):
        cfg = load_experiment(tiny, ["training.epochs=1", models, f'experiment.name="{name}"'])
        (specs[name],) = cfg.runs()

    _node(tmp_path, monkeypatch, "node1")
    first = model_runs.train_spec(
        specs["alpha"], tracker, experiment_id=tracker.experiment_id("alpha"), progress=False
    )
    key = first.key
    assert sorted(_objects(s3, "per-exp/")) == [f"per-exp/alpha/{key}/last.pt"]
    # alpha's finished checkpoint, marked, and a copy where the old layout kept it
    client = boto3.client("s3", endpoint_url=s3)
    marked = tmp_path / "marked.pt"
    client.download_file(BUCKET, f"per-exp/alpha/{key}/last.pt", str(marked))
    ckpt = torch.load(marked, weights_only=True)
    ckpt["history"][0]["train/loss"] = MARK
    torch.save(ckpt, marked)
    for k in (f"per-exp/alpha/{key}/last.pt", f"per-exp/{key}/last.pt"):
        client.upload_file(str(marked), BUCKET, k)

    _node(tmp_path, monkeypatch, "node2")  # no local checkpoint: only the bucket could give one
    second = model_runs.train_spec(
        specs["beta"],
        tracker,
        experiment_id=tracker.experiment_id("beta"),
        resume=True,
        progress=False,
    )
    assert not second.reused and second.key == key
    history = tracker.metric_history(second.run_id, "train/loss")
    assert [s for s, _ in history] == [1] and history[0][1] != MARK
    assert history == tracker.metric_history(first.run_id, "train/loss")  # trained anew
    assert sorted(_objects(s3, "per-exp/")) == [
        f"per-exp/{key}/last.pt",
        f"per-exp/alpha/{key}/last.pt",
        f"per-exp/beta/{key}/last.pt",
    ]
    notes = [r.getMessage() for r in caplog.records if r.name == "attnstudy"]
    (note,) = [n for n in notes if "before checkpoints were kept per experiment" in n]
    assert f"(s3://{BUCKET}/per-exp/{key}/last.pt) is not resumed" in note, note
    assert f"move it to s3://{BUCKET}/per-exp/beta/{key}/last.pt" in note, note
