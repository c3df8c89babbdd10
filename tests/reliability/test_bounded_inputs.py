"""NEW-6, NEW-9: bounded inputs.

* A model folder's files are regular files of a bounded size, checked before any byte is read: a
  ``model.safetensors`` symlinked to ``/dev/zero`` hashed for ever, a FIFO waited for a writer for
  ever. A link to a regular file is fine (a Hugging Face hub snapshot is links into its blobs).
* An experiment's ``[[models]]`` entries × seeds are at most 1,000, as seeds alone were: a file of
  10,000 entries was accepted and started training them one after the other.

Every call that hung is run under an alarm, so a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TINY = ROOT / "experiments" / "tiny.toml"


@contextmanager
def within(seconds: int):
    """Fail with TimeoutError if the block takes longer (SIGALRM also interrupts a blocking
    ``open`` of a FIFO)."""

    def _late(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, _late)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _hf_folder(path: Path) -> Path:
    """The files a save_pretrained folder is checked for (contents unread by these checks)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(
        json.dumps({"model_type": "marian", "is_encoder_decoder": True}), encoding="utf-8"
    )
    (path / "tokenizer.json").write_text("{}", encoding="utf-8")
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    return path


def _replace(path: Path, how: str) -> None:
    path.unlink()
    if how == "/dev/zero":
        path.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "dangling":
        path.symlink_to(path.parent / "nowhere")
    else:
        raise AssertionError(how)


# ----------------------------------------------------------------------------- HF folders


@pytest.mark.parametrize("how", ["/dev/zero", "fifo", "dangling"])
@pytest.mark.parametrize("name", ["model.safetensors", "tokenizer.json", "config.json"])
def test_a_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path, name, how):
    from attnstudy.data.hf_folder import HFError, check_folder, folder_digests

    folder = _hf_folder(tmp_path / "m")
    _replace(folder / name, how)
    for call in (folder_digests, check_folder):
        t0 = time.monotonic()
        with within(20), pytest.raises(HFError) as info:
            call(folder)
        msg = str(info.value)
        assert time.monotonic() - t0 < 5
        assert "\n" not in msg and str(folder / name) in msg
        assert "not a regular file" in msg or "links to nothing" in msg


def test_other_json_files_transformers_reads_are_checked_too(tmp_path):
    from attnstudy.data.hf_folder import HFError, folder_files

    folder = _hf_folder(tmp_path / "m")
    (folder / "generation_config.json").symlink_to("/dev/zero")
    with within(20), pytest.raises(HFError, match="generation_config.json: not a regular file"):
        folder_files(folder)


def test_a_file_over_its_bound_is_refused_before_reading(tmp_path):
    """Sparse files: no disk used, nothing read (hashing them would take minutes)."""
    from attnstudy.data.hf_folder import HFError, folder_digests, folder_files
    from attnstudy.runtime import paths

    folder = _hf_folder(tmp_path / "m")
    os.truncate(folder / "model.safetensors", paths.MAX_WEIGHTS_FILE_BYTES + 1)
    with within(20), pytest.raises(HFError) as info:
        folder_digests(folder)
    msg = str(info.value)
    assert "model.safetensors" in msg and "64 GiB" in msg and "MAX_WEIGHTS_FILE_BYTES" in msg
    os.truncate(folder / "model.safetensors", 64)
    os.truncate(folder / "tokenizer.json", paths.MAX_TEXT_FILE_BYTES + 1)
    with within(20), pytest.raises(HFError) as info:
        folder_files(folder)
    msg = str(info.value)
    assert "tokenizer.json" in msg and "64 MiB" in msg and "MAX_TEXT_FILE_BYTES" in msg
    os.truncate(folder / "tokenizer.json", paths.MAX_TEXT_FILE_BYTES)  # at the bound: fine
    assert folder_files(folder)[1] == [folder / "tokenizer.json"]


def test_a_link_to_a_regular_file_is_read_through(tmp_path):
    """A hub snapshot (snapshots/<rev>/model.safetensors → ../../blobs/<sha>) is a folder of
    links: they are followed, and the digests are those of the files they point to."""
    from attnstudy.data.hf_folder import folder_digests

    folder = _hf_folder(tmp_path / "m")
    blobs = tmp_path / "blobs"
    linked = shutil.copytree(folder, tmp_path / "linked")
    blobs.mkdir()
    for f in folder.iterdir():
        (blobs / f.name).write_bytes(f.read_bytes())
        (linked / f.name).unlink()
        (linked / f.name).symlink_to(blobs / f.name)
    assert folder_digests(linked) == folder_digests(folder)


def test_a_pretrained_experiments_config_fifo_does_not_hang_validation(tmp_path):
    from attnstudy.config import ConfigError, PretrainedConfig

    folder = _hf_folder(tmp_path / "m")
    _replace(folder / "config.json", "fifo")
    with within(20), pytest.raises(ConfigError, match="config.json: not a regular file"):
        PretrainedConfig(source=f"hf:{folder}").model_type  # noqa: B018


@pytest.mark.slow
def test_the_cli_refuses_a_dev_zero_weights_file_quickly(tmp_path):
    """The review's reproduction: ``ablate hf:hf/z --tsv ex.tsv`` with model.safetensors →
    /dev/zero was killed by its timeout; now one line, exit 2."""
    folder = _hf_folder(tmp_path / "hf" / "z")
    _replace(folder / "model.safetensors", "/dev/zero")
    (tmp_path / "ex.tsv").write_text("a b\tc d\n", encoding="utf-8")
    root = tmp_path / "root"
    (root / "mlruns").mkdir(parents=True)
    env = dict(
        os.environ,
        ATTNSTUDY_ROOT=str(root),
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    )
    for k in ("MLFLOW_TRACKING_URI", "ATTNSTUDY_DEBUG"):
        env.pop(k, None)
    args = ["ablate", f"hf:{folder}", "--tsv", str(tmp_path / "ex.tsv"), "--n-examples", "1"]
    try:
        res = subprocess.run(
            [sys.executable, "-m", "attnstudy.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=90,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("ablate hf:FOLDER with model.safetensors -> /dev/zero still hangs")
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("attnstudy: error: "), res.stderr[-2000:]
    assert "model.safetensors: not a regular file" in lines[0]


# ----------------------------------------------------------------------------- our model folders


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny untrained model saved as a model folder."""
    from attnstudy.data.vocab import Vocab
    from attnstudy.experiment import load_experiment
    from attnstudy.models.families import build_model
    from attnstudy.models.io import save_model_dir

    spec = load_experiment(TINY).runs()[0]
    src = Vocab.build([list("abcdefgh")])
    tgt = Vocab.build([list("abcdefgh")])
    model = build_model(spec.model, len(src), len(tgt))
    return save_model_dir(tmp_path_factory.mktemp("own") / "m", model, spec, src, tgt)


@pytest.mark.parametrize("how", ["/dev/zero", "fifo"])
@pytest.mark.parametrize("name", ["weights.pt", "config.json", "src_vocab.json"])
def test_own_model_folder_files_must_be_regular(model_folder, tmp_path, name, how):
    from attnstudy.models.io import ModelLoadError, load_model_dir

    folder = shutil.copytree(model_folder, tmp_path / "m")
    _replace(folder / name, how)
    with within(20), pytest.raises(ModelLoadError) as info:
        load_model_dir(folder)
    assert f"{folder / name}: not a regular file" in str(info.value)


def test_own_model_folder_file_over_its_bound(model_folder, tmp_path):
    from attnstudy.models.io import ModelLoadError, load_model_dir
    from attnstudy.runtime import paths

    folder = shutil.copytree(model_folder, tmp_path / "m")
    assert load_model_dir(folder).spec.model.attention  # loads as it is
    os.truncate(folder / "config.json", paths.MAX_TEXT_FILE_BYTES + 1)
    with within(20), pytest.raises(ModelLoadError, match=r"config.json: .* 64 MiB"):
        load_model_dir(folder)


# ----------------------------------------------------------------------------- [[models]] × seeds


def _experiment(tmp_path: Path, n_models: int, seeds: list[int] | None = None) -> Path:
    base = TINY.read_text(encoding="utf-8").split("[[models]]")[0]
    if seeds is not None:
        base = base.replace("seeds = [1]", f"seeds = {seeds}")
    entries = "".join(
        f'[[models]]\nname = "v{i}"\nmodel = {{ attention = "additive", flow = "bahdanau" }}\n'
        for i in range(n_models)
    )
    path = tmp_path / "many.toml"
    path.write_text(base + entries, encoding="utf-8")
    return path


def test_ten_thousand_models_are_refused_at_validation(tmp_path):
    from attnstudy.config import ConfigError
    from attnstudy.experiment import load_experiment

    path = _experiment(tmp_path, 10_000)
    t0 = time.monotonic()
    with within(60), pytest.raises(ConfigError) as info:
        load_experiment(path)
    msg = str(info.value)
    assert "\n" not in msg and "10,000" in msg and "1,000" in msg and "[[models]]" in msg
    assert time.monotonic() - t0 < 30


def test_models_times_seeds_is_what_is_capped(tmp_path):
    from attnstudy.config import ConfigError
    from attnstudy.experiment import MAX_MODELS, load_experiment

    assert MAX_MODELS == 1000
    with pytest.raises(ConfigError, match=r"2 \[\[models\]\] entries × their seeds are 1,200"):
        load_experiment(_experiment(tmp_path, 2, list(range(600))))
    assert len(load_experiment(_experiment(tmp_path, 2, list(range(500)))).runs()) == 1000


def test_the_cli_refuses_it_with_exit_2(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    env.pop("ATTNSTUDY_DEBUG", None)
    res = subprocess.run(
        [sys.executable, "-m", "attnstudy.cli", "train", str(_experiment(tmp_path, 1001))],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert "1,001" in lines[0] and "at most 1,000" in lines[0]
