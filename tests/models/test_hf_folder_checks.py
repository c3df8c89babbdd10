"""Hugging Face folders transformers cannot read get one line naming the folder and what is wrong
(NEW-5 of the 2026-12-06 review), checked from the files before transformers is asked: custom code
(auto_map), an unsupported family, a doctored safetensors header, a config that does not describe
the weights (it made transformers build a 10,000-layer model for 50 s and print 99 lines), a
tokenizer that cannot be loaded."""

from __future__ import annotations

import json
import shutil
import struct

import pytest

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from attnstudy.models.hf_tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("hf") / "base", steps=0)


def _copy(base, tmp_path, edit_config=None):
    folder = tmp_path / "m"
    shutil.copytree(base, folder)
    if edit_config:
        cfg = json.loads((folder / "config.json").read_text())
        edit_config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _refused(folder, needle):
    from attnstudy.data.hf_folder import HFError
    from attnstudy.models.hf import load_pretrained

    with pytest.raises(HFError) as err:
        load_pretrained(folder)
    message = str(err.value)
    assert "\n" not in message and str(folder) in message and needle in message, message
    return message


def test_custom_code_is_refused_before_transformers_reads_the_config(base, tmp_path):
    def evil(cfg):
        cfg["model_type"] = "evilmt"
        cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig"}

    _refused(_copy(base, tmp_path, evil), "never runs code from a model folder")


def test_an_unsupported_family_is_named(base, tmp_path):
    def other(cfg):
        cfg["model_type"] = "pegasus"

    _refused(_copy(base, tmp_path, other), "model_type 'pegasus' is not supported")


def test_a_config_that_does_not_describe_the_weights_is_refused_at_once(base, tmp_path):
    def huge(cfg):
        cfg.update(decoder_layers=10_000, d_model=2**20, vocab_size=2**30)

    _refused(_copy(base, tmp_path, huge), "the config does not describe these weights")

    def more_layers(cfg):
        cfg["decoder_layers"] = cfg["decoder_layers"] + 3

    message = _refused(_copy(base, tmp_path / "b", more_layers), "decoder layers")
    assert "its weights hold 2" in message


def test_a_doctored_safetensors_header_names_the_file(base, tmp_path):
    folder = _copy(base, tmp_path)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[:8] = struct.pack("<Q", 2**62)
    weights.write_bytes(bytes(data))
    _refused(folder, "model.safetensors: its header claims")


def test_a_tokenizer_transformers_cannot_load_is_one_line(base, tmp_path):
    folder = _copy(base, tmp_path)
    (folder / "tokenizer.json").unlink()
    _refused(folder, "transformers cannot load its tokenizer")


def test_the_base_folder_loads(base):
    from attnstudy.models.hf import load_pretrained

    assert load_pretrained(base).has_attention
