"""A pretrained variant in an experiment file (``[model] source = "hf:FOLDER"``): validation,
folder resolution, labels and the model key — torch- and transformers-free (a fake folder of the
right files is enough)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from attnstudy.config import ConfigError, PretrainedConfig, RunSpec
from attnstudy.data.hf_folder import HFError, check_folder, decoder_shape, folder_digests
from attnstudy.experiment import load_experiment, parse_experiment

DATA = {"task": "copy", "vocab_size": 8, "min_len": 3, "max_len": 6, "n_train": 50}


EMPTY_SAFETENSORS = struct.pack("<Q", 2) + b"{}"
"""A safetensors file holding no tensor: its header is read, not checked against a config."""


def _folder(path: Path, model_type: str = "marian", weights: bytes = EMPTY_SAFETENSORS) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type, "is_encoder_decoder": True}
    config |= {"decoder_layers": 3, "decoder_attention_heads": 4}
    (path / "config.json").write_text(json.dumps(config))
    (path / "model.safetensors").write_bytes(weights)
    (path / "tokenizer.json").write_text("{}")
    return path


def _experiment(tmp_path: Path, models: str, extra: str = "") -> Path:
    toml = tmp_path / "exp" / "e.toml"
    toml.parent.mkdir(exist_ok=True)
    toml.write_text(
        '[experiment]\nname = "e"\n' + extra + '[data]\ntask = "copy"\nn_train = 50\n'
        "[model]\nembedding_dim = 8\n" + models
    )
    return toml


def test_a_relative_folder_resolves_against_the_experiment_file(tmp_path, monkeypatch):
    _folder(tmp_path / "models" / "tiny-marian")
    monkeypatch.chdir(tmp_path)  # not the experiment's folder
    toml = _experiment(
        tmp_path,
        '[[models]]\nmodel = { attention = "additive" }\n'
        '[[models]]\nmodel = { source = "hf:../models/tiny-marian" }\n',
    )
    specs = load_experiment(toml).runs()
    rnn, hf = specs
    assert rnn.model.architecture == "rnn" and rnn.model.embedding_dim == 8
    assert hf.model.architecture == "hf"
    assert hf.model.source == f"hf:{tmp_path / 'models' / 'tiny-marian'}"
    assert hf.label == "hf-tiny-marian" and hf.name == "copy/hf-tiny-marian/seed1"
    # the base [model] keys (embedding_dim) belong to the other architecture: not merged in
    assert (hf.model.n_layers, hf.model.n_heads) == (3, 4)


def test_the_model_key_follows_the_files_not_the_path(tmp_path):
    a = _folder(tmp_path / "a" / "m")
    b = _folder(tmp_path / "b" / "m")

    def spec(folder, **training):
        return RunSpec(
            experiment="e",
            seed=1,
            data=DATA,
            model={"source": f"hf:{folder}"},
            training=training,
        )

    def key(folder, data="d", **training):
        return spec(folder, **training).model_key(data, folder_digests(folder))

    assert key(a) == key(b)  # the same files elsewhere: the same model
    assert key(a) != key(a, "other data")
    # training settings do not apply to a model that is not trained, but the decoding budget does
    assert key(a, epochs=3) == key(a)
    assert key(a, max_decode_factor=3.0) != key(a)
    assert spec(a).used_fields()["training"] == {"max_decode_factor": 2.0}
    _folder(b, weights=b"other")
    assert key(a) != key(b)  # changed weights: another model
    with pytest.raises(ValueError, match="needs its folder's digests"):
        spec(a).model_key("d")
    (a / "model.safetensors").unlink()
    with pytest.raises(HFError, match="no \\*.safetensors"):
        folder_digests(a)


@pytest.mark.parametrize(
    "models, message",
    [
        ('model = { source = "tiny-marian" }', "must be hf:FOLDER"),
        ('model = { source = "hf:" }', "must be hf:FOLDER"),
        ('model = { source = "hf:x", heads = 2 }', "'heads' does not apply to a pretrained"),
        ('model = { source = "hf:x" }\nseeds = [1, 2]', "seeds = \\[1\\]"),
    ],
)
def test_bad_pretrained_variants_are_refused_in_one_line(tmp_path, models, message):
    toml = _experiment(tmp_path, "[[models]]\n" + models + "\n")
    with pytest.raises(ConfigError, match=message) as err:
        load_experiment(toml)
    assert "\n" not in str(err.value)


def test_the_experiments_seeds_do_not_multiply_a_pretrained_model(tmp_path):
    toml = _experiment(
        tmp_path, '[[models]]\nmodel = { source = "hf:x" }\n', extra="seeds = [1, 2]\n"
    )
    with pytest.raises(ConfigError, match="models\\[0\\].*the same model"):
        load_experiment(toml)
    raw = {"data": DATA, "experiment": {"seeds": [1, 2]}}
    raw["models"] = [{"model": {"source": "hf:x"}, "seeds": [7]}]
    assert [s.seed for s in parse_experiment(raw).runs()] == [7]


def test_folder_checks_without_transformers(tmp_path):
    folder = _folder(tmp_path / "m")
    check_folder(folder)  # the files and the config are fine: nothing raised, nothing hashed
    _folder(tmp_path / "gpt", model_type="gpt2")
    cfg = json.loads((tmp_path / "gpt" / "config.json").read_text()) | {"is_encoder_decoder": False}
    (tmp_path / "gpt" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(HFError, match="not an encoder-decoder"):
        check_folder(tmp_path / "gpt")
    _folder(tmp_path / "pegasus", model_type="pegasus")
    with pytest.raises(HFError, match="'pegasus' is not supported"):
        check_folder(tmp_path / "pegasus")
    assert decoder_shape({"num_layers": 6, "num_decoder_layers": 2, "num_heads": 8}) == (2, 8)
    assert decoder_shape({"num_layers": 6, "num_heads": 8}) == (6, 8)
    with pytest.raises(ConfigError, match="names no decoder layers"):
        decoder_shape({"model_type": "x"})
    assert PretrainedConfig(source=f"hf:{folder}").attention == "pretrained"


def test_the_families_match_the_adapter():
    pytest.importorskip("transformers")
    from attnstudy.data.hf_folder import SUPPORTED_FAMILIES
    from attnstudy.models.hf import FAMILIES

    assert sorted(FAMILIES) == list(SUPPORTED_FAMILIES)
