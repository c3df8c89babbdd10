"""Artifacts and training checkpoints on an S3-compatible store, on loopback against moto's
server mode.

An experiment whose artifact location is ``s3://`` keeps its model in the bucket; with
``$ATTNSTUDY_CHECKPOINT_URI`` each checkpoint is uploaded too, and a training interrupted on one
node resumes on another (a fresh project root: no local checkpoint) from the bucket's checkpoint
to the same model as an uninterrupted training. Prerequisites: the ``[distributed]`` extra
(boto3) and ``moto[server]`` (``make test-deps`` installs both).
"""

from __future__ import annotations

import importlib.util
import os

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

    from attnstudy.ray_head import free_port

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
    from attnstudy.checkpoint_store import CheckpointStore
    from attnstudy.config import ConfigError

    for bad in ("/srv/ckpt", "s3://", "s3://Upper_Case/x", "gs://bucket/x"):
        monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", bad)
        with pytest.raises(ConfigError, match=r"^ATTNSTUDY_CHECKPOINT_URI=.*give s3://BUCKET"):
            CheckpointStore.from_env()
    monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", "s3://my-bucket/team/ckpt/")
    store = CheckpointStore.from_env()
    assert store.key_of("0123abcd") == "team/ckpt/0123abcd/last.pt"
    monkeypatch.setenv("ATTNSTUDY_CHECKPOINT_URI", "")
    assert CheckpointStore.from_env() is None


def test_an_unreachable_store_fails_in_one_line_naming_the_object(monkeypatch, tmp_path):
    from attnstudy.checkpoint_store import CheckpointStore, CheckpointStoreError
    from attnstudy.ray_head import free_port

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


def test_artifacts_on_s3_are_accepted_for_a_cluster():
    from attnstudy.distributed import check_artifact_location

    check_artifact_location("s3://bucket/mlflow/3", "tiny", "http://h:5000")


@pytest.mark.slow
def test_a_training_interrupted_on_one_node_resumes_from_the_bucket_on_another(
    s3, tmp_path, monkeypatch, tiny_config
):
    from mlflow import MlflowClient

    from attnstudy import model_runs
    from attnstudy.paths import checkpoint_dir
    from attnstudy.tracking import Tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = tiny_config.runs()[0]
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
    assert list(stored) == [f"checkpoints/{key}/last.pt"]
    local = torch.load(node1 / "mlruns" / "checkpoints" / key / "last.pt", weights_only=True)
    assert local["epoch"] == 1

    # a mark in the bucket's copy (epoch 1's logged train/loss) shows where the resume read from
    import boto3

    client = boto3.client("s3", endpoint_url=s3)
    marked = tmp_path / "marked.pt"
    client.download_file(BUCKET, f"checkpoints/{key}/last.pt", str(marked))
    ckpt = torch.load(marked, weights_only=True)
    assert ckpt["epoch"] == 1
    ckpt["history"][0]["train/loss"] = MARK
    torch.save(ckpt, marked)
    client.upload_file(str(marked), BUCKET, f"checkpoints/{key}/last.pt")

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
    assert _objects(s3, "checkpoints/")[f"checkpoints/{key}/last.pt"] == (
        (checkpoint_dir(key) / "last.pt").stat().st_size
    )
