"""Training is logged to MLflow and the stored model loads through every URI form."""

import math

import pytest
import torch

pytestmark = pytest.mark.slow


def test_model_runs_have_params_epoch_metrics_and_artifacts(tiny_models):
    from attnstudy.tracking import Tracker

    tracker = Tracker()
    run = tracker.get_run(tiny_models[0].run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "copy/additive-bahdanau/seed1"
    assert run.data.params["model.attention"] == "additive"
    assert run.data.params["model.flow"] == "bahdanau"
    assert run.data.tags["kind"] == "model" and run.data.tags["config_hash"] == tiny_models[0].spec.config_hash()
    history = tracker.client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == [1, 2]
    assert all(math.isfinite(m.value) for m in history)
    for key in ("dev/exact_match", "dev/per", "test/per", "test/wer", "test/exact_match"):
        assert key in run.data.metrics
    arts = {a.path for a in tracker.client.list_artifacts(run.info.run_id, "model")}
    assert arts == {"model/weights.pt", "model/config.json", "model/src_vocab.json", "model/tgt_vocab.json"}
    preds = tracker.load_table(run.info.run_id, "predictions/test.parquet")
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
    from attnstudy.tracking import TrackingError

    with pytest.raises(TrackingError, match="no run with id 'deadbeef'"):
        api.load_model("runs:/deadbeef")
    with pytest.raises(TrackingError, match="no such registered model version"):
        api.load_model("models:/nope/3")
