import pytest

from attnstudy.config import ConfigError, load_experiment, parse_experiment

BASE = {"experiment": {"name": "t"}, "data": {"task": "copy"}, "models": [{"model": {"attention": "additive"}}]}


def test_variants_and_seeds_resolve_to_runs():
    cfg = parse_experiment({"experiment": {"name": "t", "seeds": [1, 2]}, "model": {"decoder_hidden": 32},
                            "models": [{"model": {"attention": "additive"}},
                                       {"model": {"attention": "none"}, "seeds": [7]}]})
    runs = cfg.runs()
    assert [r.name for r in runs] == ["copy/additive-bahdanau/seed1", "copy/additive-bahdanau/seed2",
                                      "copy/none-bahdanau/seed7"]
    assert all(r.model.decoder_hidden == 32 for r in runs)
    assert runs[0].config_hash() != runs[1].config_hash()
    assert runs[0].flat_params()["model.attention"] == "additive"


def test_unknown_key_names_key_and_valid_keys():
    with pytest.raises(ConfigError, match=r"models\[0\]: unknown key 'model.hiden'.*valid keys: .*decoder_hidden"):
        parse_experiment({**BASE, "models": [{"model": {"hiden": 3}}]})
    with pytest.raises(ConfigError, match=r"unknown key 'ablation.n_exmples'.*n_examples"):
        parse_experiment({**BASE, "ablation": {"n_exmples": 3}})


def test_unknown_attention_lists_valid_names():
    with pytest.raises(ConfigError, match=r"'bahdanau_attn'.*'additive'.*'multihead'"):
        parse_experiment({**BASE, "models": [{"model": {"attention": "bahdanau_attn"}}]})


def test_dot_with_mismatched_sizes_names_both_sizes():
    with pytest.raises(ConfigError, match=r"d_query = decoder_hidden = 100 and d_key = .* = 256"):
        parse_experiment({**BASE, "model": {"decoder_hidden": 100, "encoder_hidden": 128},
                          "models": [{"model": {"attention": "dot"}}]})


def test_out_of_range_and_wrong_type():
    with pytest.raises(ConfigError, match=r"training.epochs.*greater than or equal to 1"):
        parse_experiment({**BASE, "training": {"epochs": 0}})
    with pytest.raises(ConfigError, match=r"training.lr"):
        parse_experiment({**BASE, "training": {"lr": "fast"}})


def test_overrides_apply_before_validation():
    cfg = parse_experiment(BASE, ["training.epochs=3", "models.0.model.flow=luong", "experiment.name=x"])
    assert cfg.runs()[0].training.epochs == 3
    assert cfg.runs()[0].model.flow == "luong"
    with pytest.raises(ConfigError, match="key=value"):
        parse_experiment(BASE, ["training.epochs"])
    with pytest.raises(ConfigError, match="no list entry"):
        parse_experiment(BASE, ["models.5.model.flow=luong"])


def test_param_longer_than_mlflow_limit_is_rejected():
    with pytest.raises(ConfigError, match="at most 6000"):
        parse_experiment({**BASE, "data": {"task": "tsv", "train_path": "x" * 7000, "dev_path": "d", "test_path": "t"}})


def test_load_experiment_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_experiment(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[data\n")
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_experiment(bad)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b"[experiment]\nname = \"caf\xe9\"\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_experiment(latin)


@pytest.mark.parametrize("name", ["quickstart", "g2p", "synthetic", "tiny"])
def test_shipped_experiments_validate(name):
    from pathlib import Path

    cfg = load_experiment(Path(__file__).parents[1] / "experiments" / f"{name}.toml")
    assert cfg.runs()
