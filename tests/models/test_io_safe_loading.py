"""Loading a model never unpickles code (docs/design.md §5)."""

import pickle

import pytest
import torch

from attnstudy.config import ModelConfig, RunSpec
from attnstudy.data.vocab import Vocab
from attnstudy.models import build_model
from attnstudy.models.io import ModelLoadError, load_model_dir, save_model_dir


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling this would create the marker file
        return (open, (str(self.marker), "w"))


@pytest.fixture
def model_dir(tmp_path):
    spec = RunSpec(
        experiment="t",
        seed=1,
        data={"task": "copy"},
        model=ModelConfig(embedding_dim=4, encoder_hidden=4, decoder_hidden=8, attention_dim=4),
        training={},
    )
    sv, tv = Vocab.build([list("abc")]), Vocab.build([list("abc")])
    return save_model_dir(tmp_path / "m", build_model(spec.model, len(sv), len(tv)), spec, sv, tv)


def test_plain_model_round_trips(model_dir):
    loaded = load_model_dir(model_dir)
    assert not loaded.model.training
    assert loaded.spec.model.attention == "additive"


def test_malicious_pickle_is_refused_and_runs_nothing(model_dir, tmp_path):
    marker = tmp_path / "pwned"
    with open(model_dir / "weights.pt", "wb") as f:
        pickle.dump({"encoder.embedding.weight": _Exploit(marker)}, f)
    with pytest.raises(
        ModelLoadError, match="refusing to load .*weights.pt: not a plain state_dict"
    ):
        load_model_dir(model_dir)
    assert not marker.exists()
    # the same through torch.save's zip format
    torch.save({"x": _Exploit(marker)}, model_dir / "weights.pt")
    with pytest.raises(ModelLoadError, match="refusing"):
        load_model_dir(model_dir)
    assert not marker.exists()


def test_invalid_config_and_missing_files_are_named(model_dir):
    (model_dir / "config.json").write_text(
        '{"experiment": "t", "seed": 1, "model": {"attention": "telepathy"}}'
    )
    with pytest.raises(ModelLoadError, match="invalid model config"):
        load_model_dir(model_dir)
    (model_dir / "src_vocab.json").unlink()
    with pytest.raises(ModelLoadError, match="lacks src_vocab.json"):
        load_model_dir(model_dir)


def test_weights_that_do_not_match_the_config_are_refused(model_dir):
    torch.save({"encoder.embedding.weight": torch.zeros(3, 3)}, model_dir / "weights.pt")
    with pytest.raises(ModelLoadError, match="do not match the config"):
        load_model_dir(model_dir)
