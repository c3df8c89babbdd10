from pathlib import Path

import pytest
from pydantic import ValidationError

from attnstudy.config import ConfigError
from attnstudy.experiment import load_experiment, parse_experiment

BASE = {
    "experiment": {"name": "t"},
    "data": {"task": "copy"},
    "models": [{"model": {"attention": "additive"}}],
}


def test_variants_and_seeds_resolve_to_runs():
    cfg = parse_experiment(
        {
            "experiment": {"name": "t", "seeds": [1, 2]},
            "model": {"decoder_hidden": 32},
            "models": [
                {"model": {"attention": "additive"}},
                {"model": {"attention": "none"}, "seeds": [7]},
            ],
        }
    )
    runs = cfg.runs()
    assert [r.name for r in runs] == [
        "copy/additive-bahdanau/seed1",
        "copy/additive-bahdanau/seed2",
        "copy/none-bahdanau/seed7",
    ]
    assert all(r.model.decoder_hidden == 32 for r in runs)
    assert runs[0].model_key("d") != runs[1].model_key("d")
    assert runs[0].flat_params()[0]["model.attention"] == "additive"


def test_unknown_key_names_key_and_valid_keys():
    with pytest.raises(
        ConfigError, match=r"models\[0\]: unknown key 'model.hiden'.*valid keys: .*decoder_hidden"
    ):
        parse_experiment({**BASE, "models": [{"model": {"hiden": 3}}]})
    with pytest.raises(ConfigError, match=r"unknown key 'ablation.n_exmples'.*n_examples"):
        parse_experiment({**BASE, "ablation": {"n_exmples": 3}})


def test_unknown_attention_lists_valid_names():
    with pytest.raises(ConfigError, match=r"'bahdanau_attn'.*'additive'.*'multihead'"):
        parse_experiment({**BASE, "models": [{"model": {"attention": "bahdanau_attn"}}]})


def test_dot_with_mismatched_sizes_names_both_sizes():
    with pytest.raises(ConfigError, match=r"d_query = decoder_hidden = 100 and d_key = .* = 256"):
        parse_experiment(
            {
                **BASE,
                "model": {"decoder_hidden": 100, "encoder_hidden": 128},
                "models": [{"model": {"attention": "dot"}}],
            }
        )


def test_out_of_range_and_wrong_type():
    with pytest.raises(ConfigError, match=r"training.epochs.*greater than or equal to 1"):
        parse_experiment({**BASE, "training": {"epochs": 0}})
    with pytest.raises(ConfigError, match=r"training.lr"):
        parse_experiment({**BASE, "training": {"lr": "fast"}})


def test_overrides_apply_before_validation():
    cfg = parse_experiment(
        BASE, ["training.epochs=3", "models.0.model.flow=luong", "experiment.name=x"]
    )
    assert cfg.runs()[0].training.epochs == 3
    assert cfg.runs()[0].model.flow == "luong"
    with pytest.raises(ConfigError, match="key=value"):
        parse_experiment(BASE, ["training.epochs"])
    with pytest.raises(ConfigError, match="no list entry"):
        parse_experiment(BASE, ["models.5.model.flow=luong"])


def test_param_longer_than_mlflow_limit_is_shortened_with_its_hash_and_kept_whole():
    """A value over MLflow's 6,000 characters (e.g. every CLDR locale) used to make the config
    unloadable; it is logged shortened with its SHA-256, and the full value goes to an artifact."""
    import hashlib

    locales = [f"xx_{i:05d}" for i in range(800)]  # 800 × 8 chars + quotes: ~9,600 characters
    cfg = parse_experiment({**BASE, "data": {"task": "dates", "dates_locales": locales}})
    params, full = cfg.runs()[0].flat_params()
    value = params["data.dates_locales"]
    assert len(value) <= 6000 and all(len(v) <= 6000 for v in params.values())
    assert hashlib.sha256(full["data.dates_locales"].encode()).hexdigest()[:16] in value
    assert (
        full["data.dates_locales"].startswith('["xx_00000"')
        and len(full["data.dates_locales"]) > 9000
    )


def test_load_experiment_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_experiment(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[data\n")
    with pytest.raises(ConfigError, match="malformed TOML"):
        load_experiment(bad)
    latin = tmp_path / "latin.toml"
    latin.write_bytes(b'[experiment]\nname = "caf\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_experiment(latin)


SHIPPED = sorted(p.stem for p in (Path(__file__).parents[2] / "experiments").glob("*.toml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_experiments_validate(name):
    cfg = load_experiment(Path(__file__).parents[2] / "experiments" / f"{name}.toml")
    assert cfg.runs()


def test_the_shipped_experiments_are_all_there_with_distinct_names():
    assert {"quickstart", "dates-variants", "dates-full", "copy80", "g2p-best"} <= set(SHIPPED)
    names = [
        load_experiment(Path(__file__).parents[2] / "experiments" / f"{n}.toml").experiment.name
        for n in SHIPPED
    ]
    assert len(set(names)) == len(names), names
    variants = load_experiment(Path(__file__).parents[2] / "experiments" / "dates-variants.toml")
    full = load_experiment(Path(__file__).parents[2] / "experiments" / "dates-full.toml")
    assert len(variants.runs()) == 13 and len(full.runs()) == 39
    assert variants.ablation.n_examples == 300 and full.ablation.n_examples == 1000
    # dates-seeds and dates-seeds-rest: the 13 variants split in two, seeds 1-3, their seed-1 runs
    # under dates-variants' model keys (same data digest, same used fields) — copies of its
    # settings that must not drift; the same models up to the machine's float rounding
    seeds = load_experiment(Path(__file__).parents[2] / "experiments" / "dates-seeds.toml")
    rest = load_experiment(Path(__file__).parents[2] / "experiments" / "dates-seeds-rest.toml")
    by_label = {r.label: r for r in variants.runs()}

    def but_the_solver(cfg) -> dict:
        settings = cfg.ablation.model_dump()
        settings.pop("adversarial", None)
        return settings

    for part, n in ((seeds, 15), (rest, 24)):
        # the same battery; the three-seed studies keep J&W's solver at 250 iterations, with which
        # their committed tables were made (dates-variants was regenerated with the default)
        assert len(part.runs()) == n and but_the_solver(part) == but_the_solver(variants)
        assert (part.ablation.adversarial.solver, part.ablation.adversarial.steps) == ("jw", 250)
        assert len({r.model_key("d") for r in part.runs()}) == n
        seed1 = [r for r in part.runs() if r.seed == 1]
        assert all(r.model_key("d") == by_label[r.label].model_key("d") for r in seed1)
    assert [r.label for r in seeds.runs() if r.seed == 1] == [
        "additive-bahdanau",
        "general-luong",
        "uniform-bahdanau",
        "none-bahdanau",
        "transformer-L2H4",
    ]
    labels = [{r.label for r in p.runs()} for p in (seeds, rest)]
    assert labels[0].isdisjoint(labels[1]) and labels[0] | labels[1] == set(by_label)


# --- the model key: used fields, schema version, data digest ------------------------------------


def _spec(**sections):
    from attnstudy.config import RunSpec

    return RunSpec(
        experiment="e", seed=1, **{k: sections.get(k, {}) for k in ("data", "model", "training")}
    )


def test_params_and_key_hold_only_the_fields_the_task_and_architecture_use():
    g2p = _spec(data={"task": "g2p"}, model={"attention": "dot", "decoder_hidden": 256})
    params, _ = g2p.flat_params()
    assert "data.split_salt" in params and not any(k.startswith("data.dates_") for k in params)
    assert "model.attention_dim" not in params and "model.heads" not in params  # dot uses neither
    assert "training.decrease_factor" not in params  # constant learning rate: no schedule settings
    # a model field the score does not use changes nothing
    other = _spec(
        data={"task": "g2p"}, model={"attention": "dot", "decoder_hidden": 256, "heads": 8}
    )
    assert other.model_key("d") == g2p.model_key("d")
    # a data field the task does not read is refused by its section's schema
    with pytest.raises(ValidationError, match=r"data\.g2p\.vocab_size\n  Extra inputs"):
        _spec(data={"task": "g2p", "vocab_size": 7})
    assert g2p.model_key("d") != g2p.model_key("e")  # the data digest is part of the key
    assert _spec(training={"threads": 4}).model_key("d") == _spec().model_key("d")
    assert _spec(training={"lr": 0.002}).model_key("d") != _spec().model_key("d")


def test_a_field_added_later_at_its_neutral_default_keeps_every_key():
    from pydantic import Field

    from attnstudy.config import RunSpec, TrainingConfig

    class LaterTraining(
        TrainingConfig
    ):  # what adding a field with a behaviour-preserving default looks like
        warmup_steps: int = Field(0, json_schema_extra={"key_neutral": 0})

    class LaterSpec(RunSpec):
        training: LaterTraining

    base = _spec()
    later = LaterSpec(experiment="e", seed=1, data={}, model={}, training={})
    assert later.model_key("d") == base.model_key("d")
    assert LaterSpec(
        experiment="e", seed=1, data={}, model={}, training={"warmup_steps": 5}
    ).model_key("d") != base.model_key("d")


def test_stored_configs_of_schema_1_migrate():
    import json

    from attnstudy.config import SCHEMA_VERSION, load_run_spec, migrate_run_config

    old = {
        "experiment": "x",
        "seed": 1,
        "data": {
            "task": "tsv",
            "tokenization": "chars",
            "train_path": "a",
            "dev_path": "b",
            "test_path": "c",
        },
        "model": {},
        "training": {},
    }
    spec = load_run_spec(json.dumps(old))
    assert spec.schema_version == SCHEMA_VERSION
    assert (spec.data.source_tokenization, spec.data.target_tokenization) == ("chars", "chars")
    g2p = load_run_spec(json.dumps({**old, "data": {"task": "g2p"}}))
    assert g2p.data.g2p_split_key == "word"  # schema 1 did not group apostrophe forms
    # settings another task reads (every stored config held every task's) are dropped
    assert migrate_run_config({**old, "data": {"task": "copy"}})["data"] == {"task": "copy"}
    with pytest.raises(ValueError, match="newer than this attnstudy"):
        load_run_spec(json.dumps({**old, "schema_version": SCHEMA_VERSION + 1}))


def test_old_tokenization_setting_still_works_for_experiment_files():
    cfg = parse_experiment(
        {
            **BASE,
            "data": {
                "task": "tsv",
                "train_path": "a",
                "dev_path": "b",
                "test_path": "c",
                "tokenization": "chars",
            },
        }
    )
    d = cfg.runs()[0].data
    assert (d.source_tokenization, d.target_tokenization) == ("chars", "chars")
    with pytest.raises(ConfigError, match="data.tokenization is replaced"):
        parse_experiment(
            {
                **BASE,
                "data": {
                    "task": "tsv",
                    "train_path": "a",
                    "dev_path": "b",
                    "test_path": "c",
                    "tokenization": "chars",
                    "source_tokenization": "spaces",
                },
            }
        )


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("training.clip_norm=inf", "training.clip_norm"),
        ("training.max_decode_factor=inf", "training.max_decode_factor"),
        ("training.max_decode_factor=1000000", "training.max_decode_factor"),
        ("training.lr=nan", "training.lr"),
        ("experiment.seeds=[1180591620717411303424]", "experiment.seeds"),
        ("experiment.seeds=[-1]", "experiment.seeds"),
        # a seed twice trained one model twice under one label; the report then crashed
        ("experiment.seeds=[1,2,1]", "experiment.seeds: seed(s) [1] listed more than once"),
        ("trained_adversary.seeds=[3,3]", "trained_adversary.seeds: seed(s) [3] listed"),
        # pydantic's lax mode read these as 1, 3 and 1: a guess at what a wrong type meant
        ("training.epochs=true", "training.epochs: expected a number, not a boolean"),
        ('training.epochs="3"', "training.epochs: expected a number, not a string; write it"),
        ("data.alignment_base=0", "unknown key 'data.alignment_base' (valid keys: data_seed"),
        ('training.lr="0.1"', "training.lr: expected a number, not a string"),
        ("ablation.n_examples=false", "ablation.n_examples: expected a number, not a boolean"),
        ('ablation.permutation.n="5"', "ablation.permutation.n: expected a number, not a string"),
        ("report.verdict.used_flip=true", "report.verdict.used_flip: expected a number, not a"),
        ("ablation.ablations=[]", "ablation.ablations"),
        ("data.n_train=1000000000", "data.n_train"),
        ("data.n_train=2000000", "tokens"),  # synthetic: 2·10⁶ × 30 tokens is over the budget
        ('experiment.name=".."', "only dots"),
        ('experiment.tracking_uri="sqlite://"', "in-memory"),
        ('experiment.tracking_uri="sqlite:///:memory:"', "in-memory"),
        ("data.min_len=40", "data: min_len (40) is larger than max_len (30)"),
    ],
)
def test_values_that_would_fail_after_the_store_is_touched_are_refused(override, needle):
    with pytest.raises(
        ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        parse_experiment(BASE, [override])


def test_a_tsv_setting_is_checked_on_a_tsv_task():
    tsv = {"task": "tsv", "train_path": "a", "dev_path": "b", "test_path": "c"}
    with pytest.raises(ConfigError, match="data.alignment_base: expected a number, not a boolean"):
        parse_experiment({**BASE, "data": tsv}, ["data.alignment_base=true"])
    with pytest.raises(ConfigError, match="data.test_path: missing; task 'tsv' needs it"):
        parse_experiment({**BASE, "data": {k: v for k, v in tsv.items() if k != "test_path"}})
    with pytest.raises(ConfigError, match="data.task: unknown value 'csv'; valid: copy, reverse"):
        parse_experiment({**BASE, "data": {**tsv, "task": "csv"}})


def test_a_variant_of_another_task_takes_none_of_the_base_data_keys():
    base = {**BASE, "data": {"task": "g2p", "keep_stress": True, "n_train": 100}}
    copy = {"model": {}, "data": {"task": "copy", "vocab_size": 9}}
    g2p, other = parse_experiment({**base, "models": [{"model": {}}, copy]}).runs()
    assert g2p.data.keep_stress and g2p.data.n_train == 100
    assert other.data.task == "copy" and other.data.vocab_size == 9 and other.data.n_train is None
    # a task reading the same settings (the synthetic ones) merges over the base as before
    same = {**BASE, "data": {"vocab_size": 7, "n_train": 50}}
    (rev,) = parse_experiment({**same, "models": [{"data": {"task": "reverse"}}]}).runs()
    assert (rev.data.task, rev.data.vocab_size, rev.data.n_train) == ("reverse", 7, 50)


def test_every_task_of_the_registry_has_its_data_section():
    from attnstudy.config import DATA_CONFIGS
    from attnstudy.data.tasks import TASKS

    assert list(DATA_CONFIGS) == list(TASKS)


# --- relative data paths ------------------------------------------------------------------------


def _tsv_experiment(folder, path="data/train.tsv"):
    exp = folder / "exp.toml"
    exp.write_text(
        f'[data]\ntask = "tsv"\ntrain_path = "{path}"\ndev_path = "{path}"\ntest_path = "{path}"\n'
        f'[[models]]\ndata = {{ train_path = "{path}" }}\n',
        encoding="utf-8",
    )
    return exp


def _file(path, text="a b\tx y\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_relative_data_paths_resolve_against_the_experiment_files_folder(tmp_path, monkeypatch):
    folder, cwd = tmp_path / "experiments", tmp_path / "work"
    cwd.mkdir()
    train = _file(folder / "data" / "train.tsv")
    monkeypatch.chdir(cwd)
    spec = load_experiment(_tsv_experiment(folder)).runs()[0]
    assert spec.data.train_path == str(train) and spec.data.test_path == str(train)
    # the same file reached both ways (the working directory is the file's folder) is no conflict
    monkeypatch.chdir(folder)
    assert load_experiment(folder / "exp.toml").runs()[0].data.dev_path == str(train)


def test_a_relative_path_naming_two_different_files_is_refused(tmp_path, monkeypatch):
    folder, cwd = tmp_path / "experiments", tmp_path / "work"
    ours = _file(folder / "data" / "train.tsv")
    theirs = _file(cwd / "data" / "train.tsv", "c d\tz\n")
    monkeypatch.chdir(cwd)
    with pytest.raises(ConfigError) as err:
        load_experiment(_tsv_experiment(folder))
    message = str(err.value)
    assert "\n" not in message
    assert "data.train_path = 'data/train.tsv' names two different files" in message
    assert str(ours) in message and str(theirs) in message


def test_a_path_found_only_against_the_working_directory_is_refused(tmp_path, monkeypatch):
    folder, cwd = tmp_path / "experiments", tmp_path / "work"
    folder.mkdir()
    theirs = _file(cwd / "data" / "train.tsv")
    monkeypatch.chdir(cwd)
    with pytest.raises(ConfigError, match="resolve against its folder") as err:
        load_experiment(_tsv_experiment(folder))
    assert str(folder / "data" / "train.tsv") in str(err.value) and str(theirs) in str(err.value)


def test_set_paths_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    folder, cwd = tmp_path / "experiments", tmp_path / "work"
    _file(folder / "data" / "train.tsv")
    mine = _file(cwd / "mine.tsv")
    monkeypatch.chdir(cwd)
    spec = load_experiment(
        _tsv_experiment(folder), ["data.test_path=mine.tsv", "models.0.data.train_path=mine.tsv"]
    ).runs()[0]
    assert spec.data.test_path == str(mine) and spec.data.train_path == str(mine)
    assert spec.data.dev_path == str(folder / "data" / "train.tsv")


@pytest.mark.parametrize(
    ("variant", "needle"),
    [
        (
            {"model": {"attention": "additive", "heads": 3}},
            "models[0]: model.heads = 3 is not used by additive-bahdanau (task copy); remove it",
        ),
        (
            {"model": {"attention": "dot", "attention_dim": 16}},
            "models[0]: model.attention_dim = 16 is not used by dot-bahdanau (task copy)",
        ),
        (
            {"data": {"dates_start": "1990-01-01"}},
            "models[0]: unknown key 'data.dates_start' (valid keys: data_seed, max_len, min_len",
        ),
    ],
)
def test_a_variant_setting_its_model_does_not_use_is_refused(variant, needle):
    """`--set models.0.model.heads=3` on additive attention trained (or reused) the single-head
    model without a word; a base section's setting may still serve only some variants."""
    with pytest.raises(ConfigError) as err:
        parse_experiment({**BASE, "models": [variant]})
    assert needle in str(err.value)
    shared = {**BASE, "model": {"heads": 2}}
    shared["models"] = [{"model": {"attention": "additive"}}, {"model": {"attention": "multihead"}}]
    assert [s.model.n_heads for s in parse_experiment(shared).runs()] == [1, 2]


def test_an_experiment_file_without_settings_is_refused(tmp_path):
    """An empty file (or only comments) started a 10-epoch copy study named 'default'."""
    for text in ("", "# nothing yet\n"):
        p = tmp_path / "empty.toml"
        p.write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError) as err:
            load_experiment(p)
        assert str(err.value) == (
            f'{p}: the file holds no settings; give at least [data] task = "…" (see experiments/ '
            "for examples)"
        )
    assert load_experiment(p, ['data.task="reverse"']).data["task"] == "reverse"


@pytest.mark.parametrize(
    "deep",
    [
        "x = " + "[" * 1000 + "]" * 1000,  # a recursion in tomllib
        "x = " + "{a = " * 1000 + "1" + "}" * 1000,
        "[" + ".".join(["a"] * 1000) + "]\nb = 1",  # parsed; then a recursion in copying
    ],
    ids=["array", "inline-table", "table-header"],
)
def test_a_value_nested_too_deeply_is_refused_in_one_line(tmp_path, deep):
    """NEW-14: a value nested 1,000 deep gave a 3,002-line RecursionError traceback."""
    path = tmp_path / "deep.toml"
    path.write_text(f'{deep}\n[data]\ntask = "copy"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_experiment(path)
    text = str(err.value)
    assert text.startswith(f"{path}: ") and "nested too deeply (more than 32 levels" in text
    assert "\n" not in text


def test_the_deepest_shipped_experiment_is_far_from_the_nesting_limit():
    import tomllib

    from attnstudy.config import MAX_NESTING
    from attnstudy.config.errors import nesting_depth

    assert nesting_depth([]) == 1 and nesting_depth({"a": [1, {"b": []}]}) == 4
    assert nesting_depth(7) == 0
    shipped = (Path(__file__).parents[2] / "experiments").glob("*.toml")
    deepest = max(nesting_depth(tomllib.loads(p.read_text(encoding="utf-8"))) for p in shipped)
    assert deepest <= 6 < MAX_NESTING


def test_the_specs_are_built_once_per_content(monkeypatch):
    """``runs()`` is asked by the CLI, the checks and the executors: the specs are built once and
    handed out again while the config's content is the same; a copy with another experiment name
    or a section dict changed in place gets specs of its own (never a stale spec)."""
    import attnstudy.experiment as experiment

    cfg = experiment.load_experiment(Path(__file__).parents[2] / "experiments" / "quickstart.toml")
    built = []
    real = experiment.RunSpec
    monkeypatch.setattr(experiment, "RunSpec", lambda **kw: built.append(kw) or real(**kw))
    first = cfg.runs()  # load_experiment's own check built them: none built here
    again = cfg.runs()
    assert built == [] and len(first) == 6 and again == first and again is not first
    assert all(a is b for a, b in zip(again, first))
    renamed = cfg.model_copy(update={"experiment": cfg.experiment.model_copy(update={"name": "x"})})
    assert [s.experiment for s in renamed.runs()] == ["x"] * 6 and len(built) == 6
    assert renamed.runs() == renamed.runs() and len(built) == 6
    cfg.data["n_train"] = 123
    assert 123 in {s.data.n_train for s in cfg.runs()} and len(built) == 12


def test_a_value_json_cannot_hold_is_still_refused_by_name():
    """The specs' reuse keys on the config's JSON; a value JSON cannot hold (a Python object
    given through the API) skips the reuse and gets the same one-line refusal as before, not a
    serialisation error."""

    class Odd:
        pass

    from attnstudy.experiment import ExperimentConfig

    cfg = ExperimentConfig(data={"n_train": Odd()})  # built directly: no section check first
    with pytest.raises(ConfigError, match="n_train"):
        cfg.runs()
