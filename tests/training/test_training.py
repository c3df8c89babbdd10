import pytest
import torch

from attnstudy.api import load_data
from attnstudy.experiment import load_experiment
from attnstudy.models.training import train, translate


@pytest.fixture(scope="module")
def spec():
    from pathlib import Path

    cfg = load_experiment(
        Path(__file__).parents[2] / "experiments" / "tiny.toml", ["training.epochs=2"]
    )
    return cfg.runs()[0]


def test_same_seed_gives_identical_metrics_and_weights(spec, tmp_path):
    splits, sv, tv = load_data(spec)
    a = train(spec, splits, sv, tv, tmp_path / "a", progress=False)
    b = train(spec, splits, sv, tv, tmp_path / "b", progress=False)
    assert a.history == b.history
    for (k, v), (_, w) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(v, w), k
    other = train(
        spec.model_copy(update={"seed": 2}), splits, sv, tv, tmp_path / "c", progress=False
    )
    assert other.history != a.history


def test_checkpoint_holds_model_optimizer_and_rng_and_resume_matches(spec, tmp_path):
    splits, sv, tv = load_data(spec)
    full = train(spec, splits, sv, tv, tmp_path / "full", progress=False)
    one = spec.model_copy(update={"training": spec.training.model_copy(update={"epochs": 1})})
    train(one, splits, sv, tv, tmp_path / "part", progress=False)
    ckpt = torch.load(tmp_path / "part" / "last.pt", weights_only=True)
    assert {"model", "optimizer", "rng", "epoch", "history", "best_state"} <= set(ckpt)
    resumed = train(spec, splits, sv, tv, tmp_path / "part", resume=True, progress=False)
    assert resumed.history == full.history
    assert translate(resumed.model, splits.test, sv, tv, spec) == translate(
        full.model, splits.test, sv, tv, spec
    )


def test_empty_training_split_is_rejected(spec, tmp_path):
    splits, sv, tv = load_data(spec)
    from attnstudy.data.types import Splits

    with pytest.raises(ValueError, match="training split is empty"):
        train(spec, Splits([], splits.dev, splits.test), sv, tv, tmp_path, progress=False)


@pytest.fixture(scope="module")
def plateau_spec(spec):
    training = spec.training.model_copy(
        update={
            "epochs": 5,
            "patience": 10,
            "scheduling": "plateau",
            "scheduling_patience": 0,
            "decrease_factor": 0.5,
            "early_stopping": "exact_match",
        }
    )
    return spec.model_copy(update={"training": training})


def test_plateau_schedule_halves_lr_after_each_epoch_without_improvement(plateau_spec, tmp_path):
    splits, sv, tv = load_data(plateau_spec)
    result = train(plateau_spec, splits, sv, tv, tmp_path, progress=False)
    lrs = [h["train/lr"] for h in result.history]
    scores = [h["dev/exact_match"] for h in result.history]
    expected, best = [plateau_spec.training.lr], -1.0
    for score in scores[:-1]:
        improved = score > best
        best = max(best, score)
        expected.append(expected[-1] if improved else expected[-1] * 0.5)
    assert lrs == pytest.approx(expected)
    assert min(lrs) < plateau_spec.training.lr  # the tiny model stalls, so the schedule did act


def test_resume_with_plateau_schedule_matches_uninterrupted(plateau_spec, tmp_path):
    splits, sv, tv = load_data(plateau_spec)
    full = train(plateau_spec, splits, sv, tv, tmp_path / "full", progress=False)
    part = plateau_spec.model_copy(
        update={"training": plateau_spec.training.model_copy(update={"epochs": 3})}
    )
    train(part, splits, sv, tv, tmp_path / "part", progress=False)
    ckpt = torch.load(tmp_path / "part" / "last.pt", weights_only=True)
    assert "scheduler" in ckpt
    del ckpt["scheduler"]  # a checkpoint from before the schedule existed: rebuilt from the history
    torch.save(ckpt, tmp_path / "part" / "last.pt")
    resumed = train(plateau_spec, splits, sv, tv, tmp_path / "part", resume=True, progress=False)
    assert resumed.history == full.history


def test_inverse_sqrt_factor_warms_up_linearly_then_decays_as_the_inverse_square_root():
    from attnstudy.models.training import inverse_sqrt_factor

    assert [inverse_sqrt_factor(s, 4) for s in (0, 1, 2, 3)] == [0.25, 0.25, 0.5, 0.75]
    assert inverse_sqrt_factor(4, 4) == 1.0  # the peak is the configured lr
    assert inverse_sqrt_factor(16, 4) == pytest.approx(0.5)
    assert inverse_sqrt_factor(400, 4) == pytest.approx(0.1)


@pytest.fixture(scope="module")
def warmup_spec(spec):
    training = spec.training.model_copy(
        update={"epochs": 4, "patience": 10, "scheduling": "inverse_sqrt", "warmup_steps": 10}
    )
    return spec.model_copy(update={"training": training})


def test_inverse_sqrt_schedule_steps_once_per_update_and_resumes(warmup_spec, tmp_path):
    from attnstudy.data.batching import make_batches
    from attnstudy.models.training import inverse_sqrt_factor

    splits, sv, tv = load_data(warmup_spec)
    full = train(warmup_spec, splits, sv, tv, tmp_path / "full", progress=False)
    per_epoch = len(make_batches(splits.train, sv, tv, warmup_spec.training.batch_size, False))
    lr = warmup_spec.training.lr
    # the lr logged after epoch e is the one the next update would use: after k = e·batches updates
    expected = [lr * inverse_sqrt_factor(e * per_epoch + 1, 10) for e in range(1, 5)]
    assert [h["train/lr"] for h in full.history] == pytest.approx(expected, rel=1e-12)
    assert expected[0] < lr and expected[-1] < expected[1]  # warmed up, then decayed
    part = warmup_spec.model_copy(
        update={"training": warmup_spec.training.model_copy(update={"epochs": 2})}
    )
    train(part, splits, sv, tv, tmp_path / "part", progress=False)
    resumed = train(warmup_spec, splits, sv, tv, tmp_path / "part", resume=True, progress=False)
    assert resumed.history == full.history


def test_average_states_is_the_elementwise_mean():
    from attnstudy.models.training import average_states

    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(5)}
    out = average_states([a, b])
    assert torch.equal(out["w"], torch.tensor([2.0, 4.0])) and int(out["n"]) == 5
    with pytest.raises(ValueError, match="different tensors"):
        average_states([a, {"w": a["w"]}])


@pytest.mark.parametrize("forced", [False, True])
def test_checkpoint_averaging_keeps_the_average_only_where_it_beats_the_best_epoch(
    spec, tmp_path, monkeypatch, forced
):
    import attnstudy.models.training as training

    avg_spec = spec.model_copy(
        update={
            "training": spec.training.model_copy(
                update={"epochs": 4, "patience": 10, "average_last": 3}
            )
        }
    )
    splits, sv, tv = load_data(avg_spec)
    plain = train(
        spec.model_copy(
            update={"training": avg_spec.training.model_copy(update={"average_last": 1})}
        ),
        splits,
        sv,
        tv,
        tmp_path / "plain",
        progress=False,
    )
    if forced:  # the average's dev score made better than any epoch's: it must be kept
        real = training.evaluate_split
        calls = {"n": 0}

        def evaluate_split(model, examples, *args, **kw):
            metrics, hyps = real(model, examples, *args, **kw)
            calls["n"] += 1
            if calls["n"] == 5:  # after the 4 epochs' dev decodes: the average's
                metrics = dict(metrics, per=-1.0, exact_match=2.0)
            return metrics, hyps

        monkeypatch.setattr(training, "evaluate_split", evaluate_split)
    result = train(avg_spec, splits, sv, tv, tmp_path / "avg", progress=False)
    assert result.history == plain.history  # averaging changes no epoch of training
    ckpt = torch.load(tmp_path / "avg" / "last.pt", weights_only=True)
    epochs = [e for e, _ in ckpt["recent"]]
    assert epochs == [2, 3, 4]
    mean = training.average_states([w for _, w in ckpt["recent"]])
    got = result.model.state_dict()
    if result.averaged is not None:
        assert result.averaged_epochs == (2, 3, 4)
        for k in mean:
            assert torch.equal(got[k].cpu(), mean[k]), k
    else:
        assert not forced
        for k, v in plain.model.state_dict().items():
            assert torch.equal(got[k], v), k
    if forced:
        assert result.averaged is not None and result.averaged["dev/per"] == -1.0


def test_early_stopping_says_when_and_why_it_stopped(spec, tmp_path, capsys):
    """Training that ran out of patience stopped after epoch 3 of 8 without a word."""
    still = spec.model_copy(  # a learning rate too small to change exact_match: no improvement
        update={
            "training": spec.training.model_copy(
                update={"epochs": 8, "patience": 2, "lr": 1e-12, "early_stopping": "exact_match"}
            )
        }
    )
    splits, sv, tv = load_data(still)
    result = train(still, splits, sv, tv, tmp_path, progress=True)
    assert result.stopped_early and len(result.history) == 3
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == (
        f"{still.name}: stopped early after epoch 3 of 8: dev/exact_match did not improve for "
        "2 epochs"
    )
    train(still, splits, sv, tv, tmp_path / "quiet", progress=False)  # --quiet: nothing
    assert capsys.readouterr().err == ""
