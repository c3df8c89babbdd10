"""Typed, validated experiment configuration.

An experiment file (TOML) has base sections ``[data]``, ``[model]``, ``[training]`` and
``[ablation]``, and a list ``[[models]]`` of variants; each variant deep-merges its own
``data``/``model``/``training`` tables over the base and may name its own ``seeds``.
Every variant × seed is one :class:`RunSpec`: one trained model, one MLflow run.

This module imports only the standard library and pydantic, so a usage error is reported
before torch or mlflow are imported.
"""

from __future__ import annotations

import copy
import hashlib
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

TASKS = ("copy", "reverse", "sort", "bigram_flip", "g2p", "tsv", "dates")
SYNTHETIC_TASKS = ("copy", "reverse", "sort", "bigram_flip")
ATTENTIONS = ("additive", "dot", "general", "concat", "scaled_dot", "multihead", "uniform", "none")
FLOWS = ("bahdanau", "luong")
ABLATIONS = (
    "permutation",
    "permutation_global",
    "uniform",
    "erase_max",
    "erase_until_flip",
    "adversarial",
    "importance",
    "alignment",
)


class ConfigError(ValueError):
    """A configuration problem, phrased as one line that names the problem and the fix."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataConfig(_Strict):
    """Which task and how much of it.

    Synthetic tasks draw ``n_train``/``n_dev``/``n_test`` sequences with lengths in
    ``[min_len, max_len]`` over ``vocab_size`` symbols. ``g2p`` uses CMUdict; ``n_train``,
    ``n_dev`` and ``n_test`` (words) then take a prefix of the fixed hash order, ``None`` = all.
    """

    task: Literal["copy", "reverse", "sort", "bigram_flip", "g2p", "tsv", "dates"] = "copy"
    data_seed: int = Field(0, ge=0)
    # synthetic
    vocab_size: int = Field(20, ge=2, le=10_000)
    min_len: int = Field(5, ge=1, le=1000)
    max_len: int = Field(30, ge=1, le=1000)
    n_train: int | None = Field(None, ge=1)
    n_dev: int | None = Field(None, ge=1)
    n_test: int | None = Field(None, ge=1)
    # g2p
    keep_stress: bool = False
    split_salt: str = "attnstudy-g2p-v1"
    g2p_test_words: int = Field(12_000, ge=1)
    g2p_dev_fraction: float = Field(0.05, gt=0, lt=1)
    # tsv
    train_path: str | None = None
    dev_path: str | None = None
    test_path: str | None = None
    tokenization: Literal["chars", "spaces"] = "chars"
    # dates (issue #7; see attnstudy.data.dates): CLDR locales, formats and skeletons; a pair
    # (locale, pattern) is held out (test only) if its locale or its pattern is listed as held out
    dates_locales: tuple[str, ...] = ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pt_BR")
    dates_heldout_locales: tuple[str, ...] = ()
    dates_formats: tuple[Literal["short", "medium", "long", "full"], ...] = ("short", "medium", "long", "full")
    dates_skeletons: tuple[str, ...] = ("yMd", "yMMMd", "yMMMMd", "yMEd", "yMMMEd", "yMMMMEEEEd")
    dates_heldout_patterns: tuple[str, ...] = ()
    dates_start: str = Field("1950-01-01", pattern=r"^\d{4}-\d{2}-\d{2}$")
    dates_end: str = Field("2049-12-31", pattern=r"^\d{4}-\d{2}-\d{2}$")
    dates_native_digits: bool = True
    dates_n_heldout: int | None = Field(None, ge=1)
    # g2p alignments (issue #7; see attnstudy.data.g2p_align): gold letter-phone links
    g2p_alignments: bool = True
    g2p_aligner: Literal["em", "phonetisaurus"] = "em"

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"data.min_len ({self.min_len}) is larger than data.max_len ({self.max_len})")
        if self.task == "tsv" and not (self.train_path and self.dev_path and self.test_path):
            raise ValueError("task 'tsv' needs data.train_path, data.dev_path and data.test_path")
        return self


class ModelConfig(_Strict):
    """Encoder, attention score and decoder flow (DESIGN.md §3)."""

    cell: Literal["gru", "lstm"] = "gru"
    bidirectional: bool = True
    layers: int = Field(1, ge=1, le=8)
    embedding_dim: int = Field(64, ge=1, le=4096)
    encoder_hidden: int = Field(128, ge=1, le=8192)
    decoder_hidden: int = Field(256, ge=1, le=8192)
    attention: Literal["additive", "dot", "general", "concat", "scaled_dot", "multihead", "uniform", "none"] = "additive"
    flow: Literal["bahdanau", "luong"] = "bahdanau"
    input_feeding: bool = True
    attention_dim: int = Field(128, ge=1, le=8192)
    heads: int = Field(4, ge=1, le=64)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)

    @property
    def key_dim(self) -> int:
        """Size of an encoder state (the attention key): hidden × directions."""
        return self.encoder_hidden * (2 if self.bidirectional else 1)

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.attention == "dot" and self.decoder_hidden != self.key_dim:
            raise ValueError(
                f"attention 'dot' needs d_query == d_key, but d_query = decoder_hidden = "
                f"{self.decoder_hidden} and d_key = encoder_hidden × directions = {self.key_dim}; "
                f"set model.decoder_hidden = {self.key_dim} or use 'general'"
            )
        if self.attention == "multihead" and self.attention_dim % self.heads:
            raise ValueError(
                f"attention 'multihead' needs attention_dim divisible by heads, got "
                f"attention_dim = {self.attention_dim} and heads = {self.heads}"
            )
        return self


class TrainingConfig(_Strict):
    """Teacher-forced training with Adam, clipping and early stopping."""

    epochs: int = Field(10, ge=1, le=10_000)
    batch_size: int = Field(64, ge=1, le=65_536)
    lr: float = Field(1e-3, gt=0, le=10)
    clip_norm: float = Field(1.0, gt=0)
    patience: int = Field(3, ge=1)
    # learning-rate schedule (JoeyNMT's names): "plateau" multiplies the lr by decrease_factor when
    # the early-stopping metric has not improved for more than scheduling_patience epochs
    scheduling: Literal["constant", "plateau"] = "constant"
    decrease_factor: float = Field(0.5, gt=0, lt=1)
    scheduling_patience: int = Field(1, ge=0)
    min_lr: float = Field(1e-5, ge=0)
    early_stopping: Literal["auto", "loss", "exact_match", "per", "wer", "token_accuracy"] = "auto"
    beam_size: int = Field(1, ge=1, le=64)
    max_decode_factor: float = Field(2.0, gt=0)
    bucket_batches: bool = True
    # intra-op threads: small recurrent models gain little from more, and lose badly on a busy machine
    threads: int = Field(1, ge=1, le=256)


class AdversarialConfig(_Strict):
    """Jain & Wallace (2019) ``AdversaryMulti`` search settings."""

    k: int = Field(5, ge=1)
    steps: int = Field(500, ge=1)
    lr: float = Field(0.01, gt=0)
    lam: float = Field(500.0, ge=0)
    eps_opt: float = Field(0.01, ge=0)
    eps_eval: float = Field(0.05, ge=0)
    init_sd: float = Field(3.0, ge=0)


class AblationConfig(_Strict):
    """Which ablations run, on how many test examples, from which prefix."""

    ablations: list[Literal[ABLATIONS]] = Field(default_factory=lambda: list(ABLATIONS))  # type: ignore[valid-type]
    n_examples: int = Field(200, ge=1)
    prefix: Literal["greedy", "reference"] = "greedy"
    seed: int = Field(0, ge=0)
    n_permutations: int = Field(100, ge=1)
    n_random_orders: int = Field(5, ge=1)
    bootstrap_resamples: int = Field(1000, ge=10)
    chunk_rows: int = Field(4096, ge=1)
    adversarial: AdversarialConfig = AdversarialConfig()


class ExperimentMeta(_Strict):
    name: str = Field("default", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")
    seeds: list[int] = Field(default_factory=lambda: [1], min_length=1)
    tracking_uri: str | None = None
    tracking_timeout: float = Field(30.0, gt=0, le=3600)


class ModelVariant(_Strict):
    """One ``[[models]]`` entry: overrides over the base sections."""

    name: str | None = None
    seeds: list[int] | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)


class RunSpec(_Strict):
    """Everything that determines one trained model."""

    experiment: str
    seed: int
    data: DataConfig
    model: ModelConfig
    training: TrainingConfig

    @property
    def name(self) -> str:
        """Run name, e.g. ``g2p/additive-bahdanau/seed1``."""
        return f"{self.data.task}/{self.model.attention}-{self.model.flow}/seed{self.seed}"

    def config_hash(self) -> str:
        """SHA-256 (first 16 hex digits) of everything that determines the trained model."""
        payload = self.model_dump(mode="json", exclude={"experiment"})
        payload["training"].pop("threads", None)
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def flat_params(self) -> dict[str, str]:
        """Flattened params (``model.attention = additive``) for MLflow."""
        return flatten({"seed": self.seed, **self.model_dump(mode="json", exclude={"experiment"})})


class ExperimentConfig(_Strict):
    experiment: ExperimentMeta = ExperimentMeta()
    data: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    ablation: AblationConfig = AblationConfig()
    models: list[ModelVariant] = Field(default_factory=lambda: [ModelVariant()], min_length=1)

    def runs(self) -> list[RunSpec]:
        """Resolve every variant × seed into a validated :class:`RunSpec`.

        Raises:
            ConfigError: if a merged section is invalid (names the variant and the field).
        """
        specs: list[RunSpec] = []
        for i, variant in enumerate(self.models):
            seeds = variant.seeds or self.experiment.seeds
            merged = {
                "data": _deep_merge(self.data, variant.data),
                "model": _deep_merge(self.model, variant.model),
                "training": _deep_merge(self.training, variant.training),
            }
            for seed in seeds:
                try:
                    specs.append(RunSpec(experiment=self.experiment.name, seed=seed, **merged))
                except ValidationError as err:
                    raise ConfigError(f"models[{i}]: {_describe(err)}") from None
        return specs


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten nested dicts to dotted keys with string values (MLflow params)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = json.dumps(v) if isinstance(v, list | tuple) else str(v)
    return out


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _describe(err: ValidationError, prefix: str = "") -> str:
    """One line for the first pydantic error: location, problem, and the valid keys/names."""
    e = err.errors()[0]
    loc = prefix + ".".join(str(p) for p in e["loc"])
    if e["type"] == "extra_forbidden":
        model = err.title
        valid = ", ".join(sorted(_fields_at(model, e["loc"][:-1])))
        return f"unknown key '{loc}'" + (f" (valid keys: {valid})" if valid else "")
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    given = e.get("input")
    if e["type"] in ("literal_error", "enum"):
        return f"{loc}: unknown value {given!r}; {msg[0].lower() + msg[1:]}"
    return f"{loc}: {msg}" + (f" (got {given!r})" if not isinstance(given, dict) and given is not None else "")


_MODELS: dict[str, type[BaseModel]] = {}


def _fields_at(title: str, loc: tuple) -> list[str]:
    model = _MODELS.get(title)
    if model is None:
        return []
    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        sub = getattr(field, "annotation", None) if field else None
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            model = sub
        elif str(part) in ("data", "model", "training") and model in (ExperimentConfig, ModelVariant, RunSpec):
            model = {"data": DataConfig, "model": ModelConfig, "training": TrainingConfig}[str(part)]
        else:
            return []
    return list(model.model_fields)


for _m in (ExperimentConfig, RunSpec, DataConfig, ModelConfig, TrainingConfig, AblationConfig):
    _MODELS[_m.__name__] = _m


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value`` (value as a TOML literal, else a bare string).

    Raises:
        ConfigError: if there is no ``=`` or the key is empty.
    """
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r} (e.g. --set training.epochs=3)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set has an empty key in {item!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to a raw config dict; ``models.N.section.key`` targets a variant.

    Raises:
        ConfigError: for a malformed override or an index past the end of ``models``.
    """
    raw = copy.deepcopy(raw)
    for item in overrides:
        path, value = parse_override(item)
        node: Any = raw
        for i, part in enumerate(path[:-1]):
            if isinstance(node, list):
                try:
                    node = node[int(part)]
                except (ValueError, IndexError):
                    raise ConfigError(f"--set {item}: no list entry {part!r} in '{'.'.join(path[:i])}'") from None
            else:
                node = node.setdefault(part, {})
                if not isinstance(node, dict | list):
                    raise ConfigError(f"--set {item}: '{'.'.join(path[: i + 1])}' is not a table")
        if isinstance(node, list):
            raise ConfigError(f"--set {item}: cannot set a key on a list")
        node[path[-1]] = value
    return raw


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment TOML file.

    Args:
        path: the experiment file.
        overrides: ``key=value`` strings (``--set``), applied before validation.

    Returns:
        The validated config; ``.runs()`` resolves the variants.

    Raises:
        ConfigError: missing/unreadable file, malformed TOML, unknown key, wrong type or value.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"experiment file not found: {p} (see experiments/ for examples)")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text; save the experiment file as UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{p}: malformed TOML: {err}") from None
    except OSError as err:
        raise ConfigError(f"cannot read {p}: {err.strerror}") from None
    return parse_experiment(raw, overrides or [], source=str(p))


def parse_experiment(raw: dict[str, Any], overrides: list[str] | None = None, source: str = "config") -> ExperimentConfig:
    """Validate a raw experiment dict (see :func:`load_experiment`).

    Raises:
        ConfigError: as :func:`load_experiment`.
    """
    raw = apply_overrides(raw, overrides or [])
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_describe(err)}") from None
    # the base sections must be valid on their own, so an error names the base, not a variant
    for section, model in (("data", DataConfig), ("model", ModelConfig), ("training", TrainingConfig)):
        try:
            model.model_validate(getattr(cfg, section))
        except ValidationError as err:
            raise ConfigError(f"{source}: {_describe(err, section + '.')}") from None
    try:
        cfg.runs()
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    for spec in cfg.runs():
        for key, value in spec.flat_params().items():
            if len(value) > 6000:
                raise ConfigError(
                    f"{source}: value of '{key}' is {len(value)} characters; MLflow params hold at most 6000"
                )
    return cfg
