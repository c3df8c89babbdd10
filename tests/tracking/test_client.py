"""Training is logged to MLflow and the stored model loads through every URI form."""

import math

import pytest
import torch

pytestmark = pytest.mark.slow


def test_model_runs_have_params_epoch_metrics_and_artifacts(tiny_models):
    from attnstudy.tracking import Tracker

    tracker = Tracker()
    run = tracker.get_run(tiny_models[0].run_id)
    assert run.status == "FINISHED"
    assert run.name == "copy/additive-bahdanau/seed1"
    assert run.params["model.attention"] == "additive"
    assert run.params["model.flow"] == "bahdanau"
    assert run.tags["kind"] == "model" and run.tags["model_key"] == tiny_models[0].key
    history = tracker.client.get_metric_history(run.run_id, "train/loss")
    assert [m.step for m in history] == [1, 2]
    assert all(math.isfinite(m.value) for m in history)
    keys = ("dev/exact_match", "dev/token_error_rate", "test/token_error_rate", "test/wer")
    for key in (*keys, "test/exact_match"):  # a copy task's token error rate by its own name
        assert key in run.metrics
    arts = {a.path for a in tracker.client.list_artifacts(run.run_id, "model")}
    assert arts == {
        "model/weights.pt",
        "model/config.json",
        "model/src_vocab.json",
        "model/tgt_vocab.json",
    }
    preds = tracker.load_table(run.run_id, "predictions/test.parquet")
    assert len(preds) == 20
    assert {"source", "reference", "hypothesis", "correct", "edit_distance"} <= set(preds.columns)


def test_model_loads_through_runs_models_version_and_alias(tiny_models):
    from attnstudy import api
    from attnstudy.tracking import Tracker

    tracker = Tracker()
    run_id = tiny_models[0].run_id
    _, a = api.load_model(f"runs:/{run_id}")
    name = api.registered_name(tiny_models[0].spec)
    _, b = api.load_model(f"models:/{name}/1")
    tracker.set_alias(name, "champion", "1")
    rid, c = api.load_model(f"models:/{name}@champion")
    assert rid == run_id
    for m in (b, c):
        for (k, v), (_, w) in zip(a.model.state_dict().items(), m.model.state_dict().items()):
            assert torch.equal(v, w), k
    out = api.predict_loaded(a, ["abcd", "zz"])
    assert out[1]["n_unknown"] == 2
    assert all(isinstance(r["output"], str) for r in out)


def test_finished_run_with_same_config_is_reused(tiny_models, tiny_config):
    from attnstudy import api

    again = api.train_experiment(tiny_config, progress=False)
    assert [r.reused for r in again] == [True, True]
    assert [r.run_id for r in again] == [m.run_id for m in tiny_models]


def test_unknown_uris_fail_with_one_clear_message(tiny_models):
    from attnstudy import api
    from attnstudy.tracking import ModelNotFoundError

    with pytest.raises(ModelNotFoundError, match="no run with id 'deadbeef'"):
        api.load_model("runs:/deadbeef")
    with pytest.raises(ModelNotFoundError, match="models:/nope/3: no registered model 'nope' in"):
        api.load_model("models:/nope/3")
    name = api.registered_name(tiny_models[0].spec)
    rid, _ = api.load_model(f"models:/{name}/latest")
    assert rid == tiny_models[0].run_id


@pytest.mark.parametrize("kind", ["closed port", "listens but never answers"])
def test_unreachable_server_fails_within_the_configured_deadline(kind):
    """Loopback only: a closed port, and a socket that accepts connections but never answers. It took
    39 s and 47 s with the old defaults; the message names the configured deadline."""
    import socket

    from attnstudy.tracking import TrackingError, check_server, resolve_timeout

    assert resolve_timeout() == 10.0  # the default
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        if kind == "listens but never answers":
            s.listen(8)
        else:
            s.close()
        with pytest.raises(TrackingError) as err:
            check_server(f"http://127.0.0.1:{port}", 0.7)
    msg = str(err.value)
    if kind == "closed port":  # refused: said at once, with the way to a local store
        assert f"tracking server http://127.0.0.1:{port} refused the connection" in msg
        assert "sqlite:///PATH/mlflow.db" in msg
    else:
        assert f"tracking server http://127.0.0.1:{port} did not answer within 0.7 s" in msg
        assert "no answer" in msg
    assert "--tracking-uri" in msg


def test_server_is_checked_before_the_data_is_read(tmp_path, monkeypatch):
    from attnstudy import api
    from attnstudy.experiment import parse_experiment
    from attnstudy.study import model_runs
    from attnstudy.tracking import TrackingError

    cfg = parse_experiment(
        {
            "experiment": {
                "name": "x",
                "tracking_uri": "http://127.0.0.1:9",
                "tracking_timeout": 0.3,
            },
            "data": {
                "task": "tsv",
                "train_path": str(tmp_path / "nope.tsv"),
                "dev_path": "d",
                "test_path": "t",
            },
        }
    )
    monkeypatch.setattr(
        model_runs, "check_data", lambda cfg: pytest.fail("data read before the server was checked")
    )
    with pytest.raises(TrackingError, match="refused the connection"):
        api.open_tracker(cfg)
