"""Checkpoints are kept per experiment.

The model key leaves out the experiment, and the checkpoints were kept under it alone
(``mlruns/checkpoints/<model key>/``, ``PREFIX/<model key>/last.pt`` in a shared store), so a
``--resume`` in one experiment continued another experiment's training: a finished 12-epoch
checkpoint was replayed, 12 epochs re-logged in under a second. Now the path carries the
experiment (:func:`attnstudy.runtime.paths.experiment_folder`); a checkpoint of the old layout is
not
resumed, with a note naming it. The bucket's side is in tests/distributed/test_s3_artifacts.py.
"""

from __future__ import annotations

import logging
import shutil
import unicodedata
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"
ADDITIVE_ONLY = 'models=[{model={attention="additive",flow="bahdanau"}}]'
MARK = 9.5  # a train/loss no epoch of the tiny model logs


def _spec(experiment: str):
    from attnstudy.experiment import load_experiment

    cfg = load_experiment(
        TINY, ["training.epochs=1", ADDITIVE_ONLY, f'experiment.name="{experiment}"']
    )
    (spec,) = cfg.runs()
    return spec


def _train(spec, *, resume: bool = False):
    from attnstudy import api
    from attnstudy.tracking import Tracker

    tracker = Tracker()
    exp = tracker.experiment_id(spec.experiment)
    return api.train_spec(spec, tracker, experiment_id=exp, resume=resume, progress=False)


def _mark(path: Path) -> None:
    """Put :data:`MARK` into a checkpoint's first logged train/loss (it shows a resume read it)."""
    ckpt = torch.load(path, weights_only=True)
    ckpt["history"][0]["train/loss"] = MARK
    torch.save(ckpt, path)


def _losses(run_id: str) -> list[float]:
    from attnstudy.tracking import Tracker

    return [v for _, v in Tracker(create=False).metric_history(run_id, "train/loss")]


@pytest.mark.parametrize(
    "name, folder",
    [
        ("tiny", "tiny"),
        ("copy-adversary", "copy-adversary"),
        ("Tiny", "_54iny"),
        ("my_exp", "my_5Fexp"),
        ("a/b", "a_2Fb"),
        ("..", "_2E_2E"),
        ("My exp", "_4Dy_20exp"),
        ("δ", "_CE_B4"),
    ],
)
def test_the_experiment_folder_of_a_name(name, folder):
    from attnstudy.runtime.paths import experiment_folder

    assert experiment_folder(name) == folder


def test_experiment_folders_are_one_to_one_also_ignoring_case():
    from attnstudy.runtime.paths import EXPERIMENT_FOLDER_MAX, experiment_folder

    long = "Å" * 150
    names = [
        "tiny", "Tiny", "TINY", "tiny_", "tiny-", "_54iny", "_5F54iny", "a.b", "a_2Eb", "a/b",
        "a b", "é", unicodedata.normalize("NFD", "é"), "", ".", "..", "~", long, long + "x",
        "x" * 300, "x" * 301, "x" * 199 + "_",
    ]  # fmt: skip
    folders = [experiment_folder(n) for n in names]
    assert len({f.casefold() for f in folders}) == len(names), folders
    for f in folders:
        assert len(f) <= EXPERIMENT_FOLDER_MAX and f not in ("", ".", "..")
        assert set(f) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_ABCDEF"), f
    assert experiment_folder("x" * 300).startswith("x" * 134 + "__")


def test_a_resume_never_takes_another_experiments_checkpoint(fresh_root, caplog):
    """On one machine: experiment alpha trained the model; a resume of the same
    model in experiment beta took alpha's finished checkpoint and re-logged its epochs. Beta now
    trains from epoch 1, and a checkpoint of the old layout (any experiment's) is not taken
    either, with a note naming it."""
    from attnstudy.runtime.paths import checkpoint_dir, old_checkpoint_dir

    caplog.set_level(logging.WARNING, logger="attnstudy")
    alpha, beta = _spec("alpha"), _spec("beta")
    first = _train(alpha)
    key = first.key
    mine = checkpoint_dir("alpha", key) / "last.pt"
    assert mine.is_file() and not old_checkpoint_dir(key).exists()
    _mark(mine)  # alpha's own, finished: a resume of beta that read it would log MARK
    old = old_checkpoint_dir(key) / "last.pt"
    old.parent.mkdir(parents=True)
    shutil.copy(mine, old)  # as the old layout kept it: whose, nobody knows

    second = _train(beta, resume=True)
    assert not second.reused and second.key == key and second.run_id != first.run_id
    losses = _losses(second.run_id)
    assert len(losses) == 1 and MARK not in losses
    assert losses == _losses(first.run_id)  # trained anew: alpha's own first epoch, unmarked
    assert (checkpoint_dir("beta", key) / "last.pt").is_file()
    notes = [r.getMessage() for r in caplog.records if r.name == "attnstudy"]
    (note,) = [n for n in notes if "before checkpoints were kept per experiment" in n]
    assert f"({old}) is not resumed" in note, note
    assert f"move it to {checkpoint_dir('beta', key) / 'last.pt'}" in note
    assert torch.load(old, weights_only=True)["history"][0]["train/loss"] == MARK  # left as it was


def test_a_resume_still_takes_its_own_experiments_checkpoint(fresh_root, monkeypatch):
    """An interrupted training of one experiment resumes from its checkpoint (the mark shows
    that the first epoch came from it)."""
    from attnstudy.runtime.paths import checkpoint_dir
    from attnstudy.study import model_runs
    from attnstudy.tracking import Tracker

    spec = _spec("alpha")
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"epochs": 2})})
    real_train = model_runs.train

    def interrupted(*args, on_epoch=None, **kw):
        def hook(epoch, metrics):
            on_epoch(epoch, metrics)
            if epoch == 1:
                raise KeyboardInterrupt

        return real_train(*args, on_epoch=hook, **kw)

    monkeypatch.setattr(model_runs, "train", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _train(spec)
    monkeypatch.setattr(model_runs, "train", real_train)
    key = model_runs.model_key(spec)
    _mark(checkpoint_dir("alpha", key) / "last.pt")
    resumed = _train(spec, resume=True)
    history = Tracker(create=False).metric_history(resumed.run_id, "train/loss")
    assert [s for s, _ in history] == [1, 2] and history[0][1] == MARK
