"""Typed, validated configuration of one trained model (core layer): data, model, training, the
stored run config (:class:`RunSpec`, its schema version and migration, its model key) and the
helpers every config uses (one-line errors, ``--set`` overrides).

The experiment file that combines them with the ablation settings is
:mod:`attnstudy.experiment`.

This module imports only the standard library and pydantic, so a usage error is reported
before torch or mlflow are imported.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import tomllib
import types
import urllib.parse
from pathlib import PurePath
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

SCHEMA_VERSION = 2
"""Version of the stored run config (``config.json``); :func:`migrate_run_config` upgrades older ones.

1: the layout up to the split of ``data.tokenization`` (one setting for both fields, default chars).
2: ``data.source_tokenization``/``data.target_tokenization`` (default spaces), ``data.alignment_base``,
   ``data.g2p_split_key``, ``data.max_source_len``/``max_target_len``; ``schema_version`` stored.
"""
MAX_LEN_BOUND = 100_000
"""Upper bound of ``data.max_source_len`` / ``max_target_len`` (tokens)."""
MAX_LEN_DEFAULT = 1000
"""The longest source and target of a task without its own bound (TSV sets its own)."""

MAX_EXAMPLES = 2_000_000
"""Upper bound of every example count (``n_train`` …): CMUdict has ~135k entries."""
SYNTHETIC_TOKEN_BUDGET = 50_000_000
"""Most source tokens a synthetic task may generate (Σ over splits of n × max_len)."""
ATTENTIONS = (
    "additive",
    "dot",
    "general",
    "concat",
    "scaled_dot",
    "multihead",
    "multihead_general",
    "uniform",
    "none",
)
"""The attention scores of the recurrent family: the keys of
:data:`attnstudy.models.attention.ATTENTIONS`, whose implementations they name (config validation
stays torch-free; a test holds the two equal)."""
FLOWS = ("bahdanau", "luong")
"""Where the recurrent decoder attends: before the RNN step (Bahdanau) or after it (Luong)."""


DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d{1,3})$")


def _check_device(value: str) -> str:
    if not DEVICE_PATTERN.match(value):
        raise ValueError("use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return value


Device = Annotated[str, AfterValidator(_check_device)]
"""``training.device`` / ``ablation.device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (resolved
where the work runs: :mod:`attnstudy.devices`)."""

Seed = Annotated[int, Field(ge=0, lt=2**63)]
"""A random seed: 0 ≤ seed < 2⁶³ (torch and numpy take signed 64-bit seeds)."""


class ConfigError(ValueError):
    """A configuration problem, phrased as one line that names the problem and the fix."""


def _plain_types(annotation: Any) -> set[type]:
    """The outer types an annotation admits: ``int | None`` → {int, NoneType},
    ``Literal[0, 1]`` → {int}, ``Annotated[int, …]`` → {int}, ``list[int]`` → {list}."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _plain_types(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return set().union(*(_plain_types(a) for a in get_args(annotation)))
    if origin is Literal:
        return {type(a) for a in get_args(annotation)}
    outer = origin or annotation
    return {outer} if isinstance(outer, type) else set()


def refuse_coercion(cls: type[BaseModel], value: Any, info: ValidationInfo) -> Any:
    """A ``mode="before"`` field validator: a number field refuses a boolean or a string.

    Pydantic's lax mode reads ``epochs = true`` as 1 and ``epochs = "3"`` as 3 — a guess at what
    a wrong type meant. Strict mode would also refuse a TOML list for a tuple field, so only these
    two coercions are refused.

    Raises:
        ValueError: naming the value and what to write instead.
    """
    kinds = _plain_types(cls.model_fields[info.field_name].annotation)
    if not kinds & {int, float} or not isinstance(value, bool | str):
        return value
    if isinstance(value, bool) and bool not in kinds:
        raise ValueError("expected a number, not a boolean; write a number")
    if isinstance(value, str) and str not in kinds:
        raise ValueError("expected a number, not a string; write it without quotes")
    return value


class _Strict(BaseModel):
    # finite floats only: inf/NaN would pass a range check (gt=0) and fail after the store is touched
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    _no_coercion = field_validator("*", mode="before")(classmethod(refuse_coercion))


class _TaskData(_Strict):
    """What every task's data section has: its ``task`` (each subclass declares its names) and
    how many examples of each split (``None``: the task's default or all)."""

    n_train: int | None = Field(None, ge=1, le=MAX_EXAMPLES)
    n_dev: int | None = Field(None, ge=1, le=MAX_EXAMPLES)
    n_test: int | None = Field(None, ge=1, le=MAX_EXAMPLES)

    def used_fields(self) -> list[str]:
        """The fields this task reads: all of its section's (the schema refuses any other)."""
        return list(type(self).model_fields)


class _DefaultLengths:
    """The length bounds of a task without settings of its own for them (all but TSV)."""

    max_source_len = MAX_LEN_DEFAULT
    """Longest source a model of this task is asked to decode (``predict`` refuses longer)."""
    max_target_len = MAX_LEN_DEFAULT
    """Longest target a decoding of this task produces."""


class SyntheticData(_DefaultLengths, _TaskData):
    """A synthetic task: ``n_train``/``n_dev``/``n_test`` sequences (default 5,000 each) with
    lengths in ``[min_len, max_len]`` over ``vocab_size`` symbols, drawn with ``data_seed``."""

    task: Literal["copy", "reverse", "sort", "bigram_flip"] = "copy"
    data_seed: int = Field(0, ge=0, lt=2**63)
    vocab_size: int = Field(20, ge=2, le=10_000)
    min_len: int = Field(5, ge=1, le=1000)
    max_len: int = Field(30, ge=1, le=1000)

    @model_validator(mode="after")
    def _check(self) -> SyntheticData:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) is larger than max_len ({self.max_len})")
        total = sum((n or 5000) for n in (self.n_train, self.n_dev, self.n_test)) * self.max_len
        if total > SYNTHETIC_TOKEN_BUDGET:
            raise ValueError(
                f"n_train + n_dev + n_test examples of up to max_len = {self.max_len} tokens could be "
                f"{total:,} tokens, more than {SYNTHETIC_TOKEN_BUDGET:,}; lower the sizes or max_len"
            )
        return self


class G2PData(_DefaultLengths, _TaskData):
    """Grapheme-to-phoneme conversion on CMUdict; ``n_train``, ``n_dev`` and ``n_test`` (words)
    take a prefix of the fixed hash order, ``None`` = all. The split key groups a word with its
    apostrophe forms (``base_word``), or not (``word``, the split of salt attnstudy-g2p-v1);
    gold letter-phone links come from an aligner (:mod:`attnstudy.data.g2p_align`)."""

    task: Literal["g2p"]
    keep_stress: bool = False
    split_salt: str = Field("attnstudy-g2p-v2", min_length=1, max_length=200)
    g2p_split_key: Literal["base_word", "word"] = "base_word"
    g2p_test_words: int = Field(12_000, ge=1, le=MAX_EXAMPLES)
    g2p_dev_fraction: float = Field(0.05, gt=0, lt=1)
    g2p_alignments: bool = True
    g2p_aligner: Literal["em", "phonetisaurus"] = "em"


class TSVData(_TaskData):
    """Your own data: three TSV files (``source<TAB>target[<TAB>links]``), tokenized by
    characters or spaces; examples longer than ``max_source_len``/``max_target_len`` are filtered
    and counted (:mod:`attnstudy.data.tsv`)."""

    task: Literal["tsv"]
    train_path: str = Field(min_length=1)
    dev_path: str = Field(min_length=1)
    test_path: str = Field(min_length=1)
    source_tokenization: Literal["chars", "spaces"] = "spaces"
    target_tokenization: Literal["chars", "spaces"] = "spaces"
    alignment_base: Literal[0, 1] = Field(0, json_schema_extra={"key_neutral": 0})
    max_source_len: int = Field(MAX_LEN_DEFAULT, ge=1, le=MAX_LEN_BOUND)
    max_target_len: int = Field(MAX_LEN_DEFAULT, ge=1, le=MAX_LEN_BOUND)

    @model_validator(mode="before")
    @classmethod
    def _split_tokenization(cls, values: Any) -> Any:
        """``tokenization`` (one setting for both fields, up to schema 1) sets both new settings."""
        if isinstance(values, dict) and "tokenization" in values:
            values = dict(values)
            old = values.pop("tokenization")
            clash = [k for k in ("source_tokenization", "target_tokenization") if k in values]
            if clash:
                raise ValueError(
                    f"data.tokenization is replaced by data.source_tokenization and "
                    f"data.target_tokenization; remove it (it clashes with data.{clash[0]})"
                )
            values["source_tokenization"] = values["target_tokenization"] = old
        return values


class DatesData(_DefaultLengths, _TaskData):
    """Dates written in CLDR locales' formats and skeletons (:mod:`attnstudy.data.dates`); a pair
    (locale, pattern) is held out (test only) if its locale or its pattern is listed as held out."""

    task: Literal["dates"]
    data_seed: int = Field(0, ge=0, lt=2**63)
    dates_locales: tuple[str, ...] = (
        "en_US",
        "en_GB",
        "de_DE",
        "fr_FR",
        "es_ES",
        "it_IT",
        "nl_NL",
        "pt_BR",
    )
    dates_heldout_locales: tuple[str, ...] = ()
    dates_formats: tuple[Literal["short", "medium", "long", "full"], ...] = (
        "short",
        "medium",
        "long",
        "full",
    )
    dates_skeletons: tuple[str, ...] = ("yMd", "yMMMd", "yMMMMd", "yMEd", "yMMMEd", "yMMMMEEEEd")
    dates_heldout_patterns: tuple[str, ...] = ()
    dates_start: str = Field("1950-01-01", pattern=r"^\d{4}-\d{2}-\d{2}$")
    dates_end: str = Field("2049-12-31", pattern=r"^\d{4}-\d{2}-\d{2}$")
    dates_native_digits: bool = True
    dates_n_heldout: int | None = Field(None, ge=1, le=MAX_EXAMPLES)


DATA_CONFIGS: dict[str, type[_TaskData]] = {
    task: c
    for c in (SyntheticData, G2PData, TSVData, DatesData)
    for task in get_args(c.model_fields["task"].annotation)
}
"""How each task's data is configured: task name → its section's class (the configuration part of
:data:`attnstudy.data.tasks.TASKS`, whose names a test holds equal to these)."""
DEFAULT_TASK = SyntheticData.model_fields["task"].default


def _task(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("task", DEFAULT_TASK)
    return getattr(value, "task", DEFAULT_TASK)


DataConfig = Annotated[
    Union[tuple(Annotated[c, Tag(t)] for t, c in DATA_CONFIGS.items())],  # noqa: UP007
    Discriminator(_task),
]
"""A data section: the class of its ``task`` (:data:`DATA_CONFIGS`; ``copy`` when unnamed), so a
setting the task does not read is refused by the schema."""
_DATA_ADAPTER = TypeAdapter(DataConfig)


def data_config(**values: Any) -> _TaskData:
    """A validated data section from keyword values (``data_config(task="g2p", n_train=1000)``).

    Raises:
        pydantic.ValidationError: an unknown task, a setting the task does not read, a bad value.
    """
    return _DATA_ADAPTER.validate_python(values)


def validate_data_config(raw: Any) -> _TaskData:
    """Validate a raw data section (a dict, or a section already validated).

    Raises:
        pydantic.ValidationError: as :func:`data_config`.
    """
    return _DATA_ADAPTER.validate_python(raw)


def data_config_json(text: str) -> _TaskData:
    """A data section from its JSON (the in-process data cache's key)."""
    return _DATA_ADAPTER.validate_json(text)


class ModelConfig(_Strict):
    """The recurrent family (``architecture = "rnn"``, the default): encoder, attention score and
    decoder flow (docs/design.md §3)."""

    architecture: Literal["rnn"] = Field("rnn", json_schema_extra={"key_neutral": "rnn"})
    cell: Literal["gru", "lstm"] = "gru"
    bidirectional: bool = True
    layers: int = Field(1, ge=1, le=8)
    embedding_dim: int = Field(64, ge=1, le=4096)
    encoder_hidden: int = Field(128, ge=1, le=8192)
    decoder_hidden: int = Field(256, ge=1, le=8192)
    attention: Literal[ATTENTIONS] = "additive"
    flow: Literal[FLOWS] = "bahdanau"
    input_feeding: bool = True
    attention_dim: int = Field(128, ge=1, le=8192)
    heads: int = Field(4, ge=1, le=64)
    # per-head query/key and value sizes of scaled_dot / multihead (None: attention_dim // heads)
    attention_key_dim: int | None = Field(
        None, ge=1, le=8192, json_schema_extra={"key_neutral": None}
    )
    attention_value_dim: int | None = Field(
        None, ge=1, le=8192, json_schema_extra={"key_neutral": None}
    )
    dropout: float = Field(0.1, ge=0.0, lt=1.0)

    @model_validator(mode="before")
    @classmethod
    def _other_architecture(cls, values: Any) -> Any:
        if isinstance(values, dict):
            foreign = sorted(set(values) & TRANSFORMER_ONLY_KEYS)
            if foreign:
                raise ValueError(
                    f"'{foreign[0]}' is a key of the transformer architecture; set "
                    f'model.architecture = "transformer" or remove it'
                )
        return values

    pretrained: ClassVar[bool] = False
    """Whether the family is a folder evaluated as it is (never trained here)."""

    @property
    def architecture_tag(self) -> str:
        """The ``architecture`` run tag."""
        return self.architecture

    def used_fields(self) -> list[str]:
        """The fields this model uses: the recurrent core, and each score's own sizes."""
        names = [
            "architecture",
            "cell",
            "bidirectional",
            "layers",
            "embedding_dim",
            "encoder_hidden",
            "decoder_hidden",
            "attention",
            "flow",
            "dropout",
        ]
        if self.flow == "luong":
            names.append("input_feeding")
        if self.attention in ("additive", "concat", "scaled_dot", "multihead"):
            names.append("attention_dim")
        if self.attention in ("multihead", "multihead_general"):
            names.append("heads")
        if self.attention in ("scaled_dot", "multihead"):
            names += ["attention_key_dim", "attention_value_dim"]
        return names

    def key_files(self, folder_digests: dict[str, str] | None) -> dict[str, str] | None:
        """What of its files enters the model key: nothing (it is keyed by its used fields)."""
        return None

    @property
    def key_dim(self) -> int:
        """Size of an encoder state (the attention key): hidden × directions."""
        return self.encoder_hidden * (2 if self.bidirectional else 1)

    @property
    def label(self) -> str:
        """The variant label: score and flow, e.g. ``additive-bahdanau``."""
        return f"{self.attention}-{self.flow}"

    @property
    def n_layers(self) -> int:
        """Layers with cross-attention: one (the recurrent decoder attends once per step)."""
        return 1

    @property
    def n_heads(self) -> int:
        """Attention heads."""
        return self.heads if self.attention in ("multihead", "multihead_general") else 1

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.attention == "dot" and self.decoder_hidden != self.key_dim:
            raise ValueError(
                f"attention 'dot' needs d_query == d_key, but d_query = decoder_hidden = "
                f"{self.decoder_hidden} and d_key = encoder_hidden × directions = {self.key_dim}; "
                f"set model.decoder_hidden = {self.key_dim} or use 'general'"
            )
        if self.attention == "multihead" and self.attention_dim % self.heads:
            if self.attention_key_dim is None or self.attention_value_dim is None:
                raise ValueError(
                    f"attention 'multihead' needs attention_dim divisible by heads (or both "
                    f"attention_key_dim and attention_value_dim), got attention_dim = "
                    f"{self.attention_dim} and heads = {self.heads}"
                )
        if self.attention == "multihead_general" and self.decoder_hidden % self.heads:
            raise ValueError(
                f"attention 'multihead_general' splits the decoder state into heads, so "
                f"decoder_hidden ({self.decoder_hidden}) must be divisible by heads ({self.heads})"
            )
        if self.attention == "multihead_general" and self.key_dim % self.heads:
            raise ValueError(
                f"attention 'multihead_general' splits the encoder state into heads, so "
                f"encoder_hidden × directions ({self.key_dim}) must be divisible by heads "
                f"({self.heads})"
            )
        untied = [
            k for k in ("attention_key_dim", "attention_value_dim") if getattr(self, k) is not None
        ]
        if untied and self.attention not in ("scaled_dot", "multihead"):
            raise ValueError(
                f"model.{untied[0]} applies to the scaled_dot and multihead scores only, not "
                f"{self.attention!r}"
            )
        return self


class TransformerConfig(_Strict):
    """The Transformer encoder-decoder (Vaswani et al. 2017), ``architecture = "transformer"``.

    ``layers`` encoder and ``layers`` decoder layers of ``heads`` heads over ``d_model``;
    ``layer_norm`` before (``pre``, Xiong et al. 2020) or after (``post``, the paper) each
    sublayer; ``positions`` sinusoidal (§3.5) or learned (``max_positions`` of them);
    ``tie_embeddings`` shares the target embedding with the output projection (Press & Wolf 2017).
    ``attention``: ``multihead`` cross-attention, or the ``uniform`` / ``none`` baselines.
    """

    architecture: Literal["transformer"]
    layers: int = Field(2, ge=1, le=24)
    heads: int = Field(4, ge=1, le=64)
    d_model: int = Field(128, ge=2, le=8192)
    d_ff: int = Field(512, ge=1, le=65_536)
    dropout: float = Field(0.1, ge=0.0, lt=1.0)
    layer_norm: Literal["pre", "post"] = "pre"
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = Field(1024, ge=2, le=MAX_LEN_BOUND + 2)
    tie_embeddings: bool = False
    attention: Literal["multihead", "uniform", "none"] = "multihead"

    @model_validator(mode="before")
    @classmethod
    def _other_architecture(cls, values: Any) -> Any:
        if isinstance(values, dict):
            foreign = sorted(set(values) & RNN_ONLY_KEYS)
            if foreign:
                raise ValueError(
                    f"'{foreign[0]}' is a key of the rnn architecture, not of a transformer "
                    f"(its keys: {', '.join(TransformerConfig.model_fields)})"
                )
        return values

    pretrained: ClassVar[bool] = False
    """Whether the family is a folder evaluated as it is (never trained here)."""

    @property
    def architecture_tag(self) -> str:
        """The ``architecture`` run tag."""
        return self.architecture

    def used_fields(self) -> list[str]:
        """The fields this model uses: all of them."""
        return list(type(self).model_fields)

    def key_files(self, folder_digests: dict[str, str] | None) -> dict[str, str] | None:
        """What of its files enters the model key: nothing (it is keyed by its used fields)."""
        return None

    @property
    def label(self) -> str:
        """The variant label, e.g. ``transformer-L2H4`` (``…-uniform`` / ``…-none`` baselines)."""
        base = f"transformer-L{self.layers}H{self.heads}"
        return base if self.attention == "multihead" else f"{base}-{self.attention}"

    @property
    def n_layers(self) -> int:
        """Decoder layers with cross-attention."""
        return self.layers

    @property
    def n_heads(self) -> int:
        return self.heads

    @model_validator(mode="after")
    def _check(self) -> TransformerConfig:
        if self.d_model % self.heads:
            raise ValueError(
                f"a transformer needs d_model divisible by heads, got d_model = {self.d_model} "
                f"and heads = {self.heads}"
            )
        if self.d_model % 2:
            raise ValueError(f"d_model must be even (sine/cosine pairs), got {self.d_model}")
        return self


def decoder_shape(config: dict[str, Any]) -> tuple[int, int]:
    """(decoder layers, cross-attention heads) from a Hugging Face ``config.json`` dict: Marian
    and BART name them ``decoder_layers`` / ``decoder_attention_heads``, T5
    ``num_decoder_layers`` (else ``num_layers``) / ``num_heads``.

    Raises:
        ConfigError: neither naming is present.
    """
    for layers, heads in (
        ("decoder_layers", "decoder_attention_heads"),
        ("num_decoder_layers", "num_heads"),
        ("num_layers", "num_heads"),
    ):
        if isinstance(config.get(layers), int) and isinstance(config.get(heads), int):
            return config[layers], config[heads]
    raise ConfigError(
        f"config of model_type {config.get('model_type')!r} names no decoder layers and heads"
    )


class PretrainedConfig(_Strict):
    """A researcher's own Hugging Face encoder-decoder, ``source = "hf:FOLDER"`` (Marian, BART
    or T5 saved with ``save_pretrained``): evaluated and ablated on the experiment's data, not
    trained (:mod:`attnstudy.pretrained`). ``architecture = "hf"`` is implied by ``source``.

    The model key covers the folder's config, tokenizer and weight digests
    (:func:`attnstudy.hf_folder.folder_digests`), not its path: the same files elsewhere are the
    same model, a changed file is another one.
    """

    architecture: Literal["hf"] = "hf"
    source: str = Field(max_length=4096)

    @field_validator("source")
    @classmethod
    def _hf_uri(cls, v: str) -> str:
        if not v.startswith("hf:") or not v[3:].strip():
            raise ValueError(
                f"model.source must be hf:FOLDER (a save_pretrained folder), got {v!r}"
            )
        return v

    @model_validator(mode="before")
    @classmethod
    def _other_architecture(cls, values: Any) -> Any:
        if isinstance(values, dict):
            foreign = sorted(set(values) - {"architecture", "source"})
            if foreign:
                raise ValueError(
                    f"'{foreign[0]}' does not apply to a pretrained model (source = hf:…), whose "
                    "architecture is in its folder; remove it"
                )
        return values

    pretrained: ClassVar[bool] = True
    """Whether the family is a folder evaluated as it is (never trained here): its training
    section holds only the decoding budget of its evaluation, its key is its files' digests, its
    tokenizer splits the data."""

    @property
    def architecture_tag(self) -> str:
        """The ``architecture`` run tag: ``hf:<model_type>``."""
        return f"{self.architecture}:{self.model_type}"

    def used_fields(self) -> list[str]:
        """The fields this model uses: all of them (its source)."""
        return list(type(self).model_fields)

    def key_files(self, folder_digests: dict[str, str] | None) -> dict[str, str]:
        """What of its files enters the model key: the folder's digests, not its path.

        Raises:
            ValueError: without ``folder_digests``.
        """
        if folder_digests is None:
            raise ValueError(
                "the model key of a pretrained model needs its folder's digests "
                "(attnstudy.hf_folder.folder_digests)"
            )
        return dict(folder_digests)

    @property
    def folder(self) -> str:
        """The model folder (absolute once the experiment file resolved it)."""
        return self.source[3:]

    @property
    def attention(self) -> str:
        """The attention tag of a pretrained model: ``pretrained`` (multi-head cross-attention in
        every decoder layer, as its config says)."""
        return "pretrained"

    @property
    def label(self) -> str:
        """The variant label ``hf-<folder name>``."""
        return f"hf-{PurePath(self.folder).name}"

    def _config(self) -> dict[str, Any]:
        from .paths import InputFileError, read_input_text

        path = PurePath(self.folder) / "config.json"
        try:
            raw = json.loads(read_input_text(path))
        except InputFileError as e:  # a FIFO or /dev/zero: refused before reading
            raise ConfigError(str(e)) from None
        except (OSError, ValueError) as e:
            raise ConfigError(f"{path}: cannot read the model's config ({e})") from None
        return raw if isinstance(raw, dict) else {}

    def _shape(self) -> tuple[int, int]:
        return decoder_shape(self._config())

    @property
    def model_type(self) -> str:
        """The family, ``model_type`` of the folder's ``config.json`` (``marian``, ``bart``, ``t5``)."""
        return str(self._config().get("model_type", "?"))

    @property
    def n_layers(self) -> int:
        """Decoder layers with cross-attention, from the folder's ``config.json``.

        Raises:
            HFError: the folder or its config is unreadable.
        """
        return self._shape()[0]

    @property
    def n_heads(self) -> int:
        """Cross-attention heads, from the folder's ``config.json``."""
        return self._shape()[1]


RNN_ONLY_KEYS = set(ModelConfig.model_fields) - set(TransformerConfig.model_fields)
"""Keys of the recurrent family that a Transformer config refuses (``cell``, ``flow``, …)."""
TRANSFORMER_ONLY_KEYS = set(TransformerConfig.model_fields) - set(ModelConfig.model_fields)
"""Keys of the Transformer that a recurrent config refuses (``d_model``, …)."""
MODEL_CONFIGS: dict[str, type[_Strict]] = {
    get_args(c.model_fields["architecture"].annotation)[0]: c
    for c in (ModelConfig, TransformerConfig, PretrainedConfig)
}
"""How each model family is configured: its ``architecture`` value → its config class (the
configuration part of :data:`attnstudy.models.families.FAMILIES`)."""
ARCHITECTURES = tuple(MODEL_CONFIGS)
DEFAULT_ARCHITECTURE = ModelConfig.model_fields["architecture"].default
PRETRAINED_ARCHITECTURE = next(a for a, c in MODEL_CONFIGS.items() if c.pretrained)


def _architecture(value: Any) -> str:
    if isinstance(value, dict):
        implied = PRETRAINED_ARCHITECTURE if "source" in value else DEFAULT_ARCHITECTURE
        return value.get("architecture", implied)
    return getattr(value, "architecture", DEFAULT_ARCHITECTURE)


AnyModelConfig = Annotated[
    Union[tuple(Annotated[c, Tag(a)] for a, c in MODEL_CONFIGS.items())],  # noqa: UP007
    Discriminator(_architecture),
]
"""A model section: :class:`ModelConfig` (``architecture = "rnn"``, the default),
:class:`TransformerConfig`, or :class:`PretrainedConfig` (``source = "hf:FOLDER"``)."""


def validate_model_config(
    raw: dict[str, Any],
) -> ModelConfig | TransformerConfig | PretrainedConfig:
    """Validate a raw model section of any architecture.

    Raises:
        ValidationError: as pydantic (an unknown architecture names the valid ones).
    """
    arch = _architecture(raw)
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"model.architecture: unknown value {arch!r}; valid: {', '.join(ARCHITECTURES)}"
        )
    return MODEL_CONFIGS[arch].model_validate(raw)


class TrainingConfig(_Strict):
    """Teacher-forced training with Adam, clipping and early stopping."""

    epochs: int = Field(10, ge=1, le=10_000)
    batch_size: int = Field(64, ge=1, le=65_536)
    lr: float = Field(1e-3, gt=0, le=10)
    clip_norm: float = Field(1.0, gt=0, le=1e6)
    patience: int = Field(3, ge=1, le=10_000)
    # learning-rate schedule (JoeyNMT's names): "plateau" multiplies the lr by decrease_factor when
    # the early-stopping metric has not improved for more than scheduling_patience epochs;
    # "inverse_sqrt" (fairseq's name; Vaswani et al. 2017, eq. 3 with its peak at lr) raises the lr
    # linearly from 0 to lr over warmup_steps updates, then decays it as lr·√(warmup_steps/step)
    scheduling: Literal["constant", "plateau", "inverse_sqrt"] = "constant"
    warmup_steps: int = Field(4000, ge=1, le=10_000_000, json_schema_extra={"key_neutral": 4000})
    # checkpoint averaging (Vaswani et al. 2017, §6.1; fairseq's average_checkpoints): the weights of
    # the last N epochs averaged after training, kept where the average beats the best epoch on dev
    average_last: int = Field(1, ge=1, le=50, json_schema_extra={"key_neutral": 1})
    decrease_factor: float = Field(0.5, gt=0, lt=1)
    scheduling_patience: int = Field(1, ge=0, le=10_000)
    min_lr: float = Field(1e-5, ge=0, le=10)
    early_stopping: Literal["auto", "loss", "exact_match", "per", "wer", "token_accuracy"] = "auto"
    beam_size: int = Field(1, ge=1, le=64)
    # free-running decoding stops after ceil(factor × source length) + 2 steps (and max_target_len + 1)
    max_decode_factor: float = Field(2.0, gt=0, le=100)
    bucket_batches: bool = True
    # intra-op threads: small recurrent models gain little from more, and lose badly on a busy machine
    threads: int = Field(1, ge=1, le=256)
    # label smoothing of the training loss (Szegedy et al. 2016, §7); dev/loss stays cross-entropy
    label_smoothing: float = Field(0.0, ge=0.0, lt=1.0, json_schema_extra={"key_neutral": 0.0})
    # where training runs: "auto" (a GPU if this torch has CUDA and one is visible, else the CPU),
    # "cpu", "cuda" or "cuda:N"; resolved where the work runs, logged as the run's device tag, not
    # part of the model key (like threads)
    device: Device = "auto"
    # mixed precision for training only (float16 with loss scaling on CUDA, bfloat16 on the CPU);
    # evaluation, the stored weights and every ablation stay float32
    amp: bool = Field(False, json_schema_extra={"key_neutral": False})


def check_tracking_uri(uri: str) -> str:
    """The URI if it names a store that persists.

    Raises:
        ValueError: for an in-memory SQLite store (``sqlite://``, ``sqlite:///:memory:``), whose runs
            vanish when the process ends, or a ``file:`` store (MLflow 3 refuses it without an opt-in).
    """
    bare = uri.strip()
    if bare in ("sqlite://", "sqlite:///", "sqlite:///:memory:") or bare.endswith(":memory:"):
        raise ConfigError(
            f"tracking URI {uri!r} is an in-memory store: nothing would persist; "
            "use sqlite:///PATH/mlflow.db or an http(s):// server"
        )
    if bare.startswith("file:") or bare.startswith("/"):
        raise ConfigError(
            f"tracking URI {uri!r} is a file store, which MLflow 3 does not open by default; "
            "use sqlite:///PATH/mlflow.db or an http(s):// server"
        )
    return uri


RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,255}$")
"""A run id as MLflow validates one (``_validate_run_id``), in ASCII."""
RUN_PATH_PART = re.compile(r"^[A-Za-z0-9_.-]+$")
"""One part of a path inside a run (``runs:/<id>/<part>/…``) once decoded: letters, digits, ``_.-``
(not only dots)."""
URI_DECODE_ROUNDS = 10
"""Percent-decoding rounds after which a path still changing is refused (MLflow's ``_decode``
stops at 10 too)."""


def split_runs_uri(uri: str) -> tuple[str, str]:
    """(run id, artifact path inside the run) of ``runs:/<run_id>[/<path>]``; the path is ``""``
    when the URI gives none.

    MLflow percent-decodes an artifact path, repeatedly until it stops changing, before it reads
    it (``mlflow.utils.uri._decode``), so ``%2e%2e``, ``%252e%252e`` or ``..%2f`` is ``..`` to it.
    The path is decoded the same way, and the decoded path must be plain names
    (:data:`RUN_PATH_PART`) joined by ``/``: no ``..``, ``.`` or empty part, no backslash, drive,
    scheme, ``#``, ``?``, control or non-ASCII character — nothing that could leave the run. The
    decoded path is returned, so what is checked is what is read. The run id is taken verbatim
    and must look like one (:data:`RUN_ID_PATTERN`, no encoding).

    Raises:
        ConfigError: a malformed run id, or a path that could leave the run (one line).
    """
    rest = uri.removeprefix("runs:/").strip("/")
    run_id, _, raw = rest.partition("/")
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise ConfigError(
            f"{uri}: {run_id!r} is not a run id (letters, digits, '_' and '-'); "
            "use runs:/<run_id>[/model]"
        )
    if not raw:
        return run_id, ""
    path = raw
    for _ in range(URI_DECODE_ROUNDS):
        decoded = urllib.parse.unquote(path, errors="replace")
        if decoded == path:
            break
        path = decoded
    else:
        path = None  # still changing: MLflow refuses it too
    parts = None if path is None else path.removesuffix("/").split("/")
    if parts is None or any(not RUN_PATH_PART.fullmatch(p) or not p.strip(".") for p in parts):
        shown = "" if path is None or path == raw else f" (read as {path!r} once decoded)"
        raise ConfigError(
            f"{uri}: the path inside the run{shown} must be plain names (letters, digits, "
            "'_', '.', '-') joined by '/': it must not hold '..', '.', empty parts or other "
            "characters (it would leave the run); use runs:/<run_id>[/model]"
        )
    return run_id, "/".join(parts)


NOT_IN_MODEL_KEY = {
    "data.train_path",
    "data.dev_path",
    "data.test_path",
    "model.source",
    "training.threads",
    "training.device",
}
"""Used fields that do not determine the trained model: file paths (their content is in the data
digest; a pretrained model's folder is keyed on its files' digests), the thread count and the
device."""
MAX_PARAM_CHARS = 6000
"""MLflow's limit on a param value."""


def _section_fields(
    section: str, cfg: BaseModel, task: str, model: ModelConfig | None = None
) -> list[str]:
    """Names of the fields of one section that the task and architecture use."""
    if section in ("data", "model"):
        return cfg.used_fields()
    names = list(type(cfg).model_fields)
    if cfg.scheduling == "constant":
        names = [n for n in names if n not in ("decrease_factor", "scheduling_patience", "min_lr")]
    return names


class RunSpec(_Strict):
    """Everything that determines one trained model (stored as the model's ``config.json``)."""

    schema_version: int = Field(SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)
    experiment: str
    seed: Seed
    data: DataConfig
    model: AnyModelConfig
    training: TrainingConfig
    # the [[models]] entry's name, if it has one (labels runs; not part of the model key)
    variant: str | None = Field(None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")

    @property
    def label(self) -> str:
        """The variant label: its ``name``, else the model's (``additive-bahdanau``,
        ``transformer-L2H4``)."""
        return self.variant or self.model.label

    @property
    def name(self) -> str:
        """Run name, e.g. ``g2p/additive-bahdanau/seed1``, ``g2p/transformer-L2H4/seed1``."""
        return f"{self.data.task}/{self.label}/seed{self.seed}"

    def used_fields(self) -> dict[str, dict[str, Any]]:
        """The fields the task and architecture use, per section, as JSON values.

        A g2p run has no ``dates_*`` fields, a ``dot`` model no ``attention_dim``, a constant
        learning rate no schedule settings.
        """
        out: dict[str, dict[str, Any]] = {}
        for section in ("data", "model", "training"):
            cfg = getattr(self, section)
            if section == "training" and self.model.pretrained:
                # not trained here: only the decoding budget of its evaluation applies
                out[section] = {"max_decode_factor": cfg.max_decode_factor}
                continue
            dumped = cfg.model_dump(mode="json")
            out[section] = {k: dumped[k] for k in _section_fields(section, cfg, self.data.task)}
        return out

    def model_key(self, data_digest: str, folder_digests: dict[str, str] | None = None) -> str:
        """The key of the trained model: reuse, ``--resume`` checkpoints and the tags all use it.

        SHA-256 (first 16 hex digits) of the schema version, the seed, the used fields (without
        file paths and threads: :data:`NOT_IN_MODEL_KEY`) and the digest of the materialised
        data splits (:func:`attnstudy.data.types.splits_digest`), so replaced data files give a
        new key while the same data at another path does not. A field marked ``key_neutral`` (one
        added later) is left out while it has that value, so adding it changes no earlier key.

        Args:
            data_digest: hex SHA-256 of the train/dev/test examples.
            folder_digests: a pretrained model's config, tokenizer and weight digests
                (:func:`attnstudy.hf_folder.folder_digests`), which replace its folder's path.

        Raises:
            ValueError: a pretrained model without ``folder_digests``.
        """
        payload: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "seed": self.seed,
            "data_digest": data_digest,
        }
        for section, fields in self.used_fields().items():
            model_fields = type(getattr(self, section)).model_fields
            kept = {}
            for name, value in fields.items():
                if f"{section}.{name}" in NOT_IN_MODEL_KEY:
                    continue
                extra = model_fields[name].json_schema_extra or {}
                if (
                    isinstance(extra, dict)
                    and "key_neutral" in extra
                    and value == extra["key_neutral"]
                ):
                    continue
                kept[name] = value
            payload[section] = kept
        files = self.model.key_files(folder_digests)  # a folder: its files, not its path
        if files is not None:
            payload["model"]["digests"] = files
        blob = json.dumps(payload, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def flat_params(self) -> tuple[dict[str, str], dict[str, str]]:
        """Flattened used fields (``model.attention = additive``) for MLflow.

        Returns:
            (params, full): values over :data:`MAX_PARAM_CHARS` are shortened in ``params`` to a
            prefix with the value's SHA-256, and kept whole in ``full`` (logged as an artifact).
        """
        flat = flatten({"seed": self.seed, **self.used_fields()})
        return shorten_params(flat)


def shorten_params(flat: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Shorten param values over MLflow's limit: ``prefix… [sha256 <hex>, N chars: see params_full.json]``.

    Returns:
        (params that fit, the full values of those that were shortened).
    """
    params, full = {}, {}
    for key, value in flat.items():
        if len(value) <= MAX_PARAM_CHARS:
            params[key] = value
            continue
        digest = hashlib.sha256(value.encode()).hexdigest()[:16]
        tail = f"… [sha256 {digest}, {len(value)} chars: see params_full.json]"
        params[key] = value[: MAX_PARAM_CHARS - len(tail)] + tail
        full[key] = value
    return params, full


def migrate_run_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Upgrade a stored run config (``config.json``) to :data:`SCHEMA_VERSION`.

    Schema 1 → 2: ``data.tokenization`` becomes both ``source_tokenization`` and
    ``target_tokenization`` (its value was the old default, ``chars``, when missing), and the G2P
    split key is ``word`` (schema 1 did not group apostrophe forms).

    Raises:
        ValueError: for a config from a newer schema than this code knows.
    """
    raw = copy.deepcopy(raw)
    version = int(raw.get("schema_version", 1))
    if version > SCHEMA_VERSION:
        raise ValueError(
            f"the model config has schema_version {version}, newer than this attnstudy "
            f"({SCHEMA_VERSION}); upgrade attnstudy to load it"
        )
    if version < 2:
        data = raw.setdefault("data", {})
        tok = data.pop("tokenization", "chars")
        data.setdefault("source_tokenization", tok)
        data.setdefault("target_tokenization", tok)
        data.setdefault("g2p_split_key", "word")
    data = raw.get("data")
    if isinstance(data, dict):  # configs stored before the per-task sections held every task's
        fields = DATA_CONFIGS.get(_task(data))
        if fields is not None:
            raw["data"] = {k: v for k, v in data.items() if k in fields.model_fields}
    raw["schema_version"] = SCHEMA_VERSION
    return raw


def load_run_spec(text: str) -> RunSpec:
    """Read a stored ``config.json`` of any known schema version.

    Raises:
        ValueError: not JSON, a newer schema, or an invalid config.
    """
    return RunSpec.model_validate(migrate_run_config(json.loads(text)))


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
    parts = list(e["loc"])
    arch = task = None  # the discriminated sections put their tag after "model"/"data": drop it
    for i in range(len(parts) - 1):
        if parts[i] == "model" and parts[i + 1] in ARCHITECTURES:
            arch = parts.pop(i + 1)
            break
    for i in range(len(parts) - 1):
        if parts[i] == "data" and parts[i + 1] in DATA_CONFIGS:
            task = parts.pop(i + 1)
            break
    if prefix == "data." and parts and parts[0] in DATA_CONFIGS:  # a data section on its own
        task = parts.pop(0)
    loc = (prefix + ".".join(str(p) for p in parts)).rstrip(".") or "config"
    in_data = parts[-1:] == ["data"] or (not parts and prefix == "data.")
    if e["type"] == "union_tag_invalid" and in_data:
        given = e.get("input")
        task = _task(given) if isinstance(given, dict) else given
        return f"{loc}.task: unknown value {task!r}; valid: {', '.join(DATA_CONFIGS)}"
    if e["type"] == "missing" and task is not None:
        return f"{loc}: missing; task {task!r} needs it"
    if e["type"] == "union_tag_invalid":
        given = e.get("input")
        arch = _architecture(given) if isinstance(given, dict) else given
        valid = ", ".join(a for a, c in MODEL_CONFIGS.items() if not c.pretrained)
        return f"{loc}.architecture: unknown value {arch!r}; valid: {valid}"
    if e["type"] == "extra_forbidden":
        if task is not None and (parts[:-1] == ["data"] or (prefix == "data." and len(parts) == 1)):
            fields = list(DATA_CONFIGS[task].model_fields)
        else:
            fields = _fields_at(err.title, tuple(parts[:-1]), arch, task)
        valid = ", ".join(sorted(fields))
        return f"unknown key '{loc}'" + (f" (valid keys: {valid})" if valid else "")
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    given = e.get("input")
    if e["type"] in ("literal_error", "enum"):
        return f"{loc}: unknown value {given!r}; {msg[0].lower() + msg[1:]}"
    return f"{loc}: {msg}" + (
        f" (got {given!r})" if not isinstance(given, dict) and given is not None else ""
    )


describe_error = _describe


_MODELS: dict[str, type[BaseModel]] = {}


def _fields_at(
    title: str, loc: tuple, arch: str | None = None, task: str | None = None
) -> list[str]:
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
        elif str(part) in ("data", "model", "training") and model.__name__ in (
            "ExperimentConfig",
            "ModelVariant",
            "RunSpec",
        ):
            model = {
                "data": DATA_CONFIGS.get(task or DEFAULT_TASK, SyntheticData),
                "model": MODEL_CONFIGS.get(arch or DEFAULT_ARCHITECTURE, ModelConfig),
                "training": TrainingConfig,
            }[str(part)]
        else:
            return []
    return list(model.model_fields)


def register_config_model(model: type[BaseModel]) -> None:
    """Let :func:`describe_error` list the valid keys of ``model`` (by its class name)."""
    _MODELS[model.__name__] = model


for _m in (RunSpec, *DATA_CONFIGS.values(), *MODEL_CONFIGS.values(), TrainingConfig):
    register_config_model(_m)


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
                    raise ConfigError(
                        f"--set {item}: no list entry {part!r} in '{'.'.join(path[:i])}'"
                    ) from None
            else:
                node = node.setdefault(part, {})
                if not isinstance(node, dict | list):
                    raise ConfigError(f"--set {item}: '{'.'.join(path[: i + 1])}' is not a table")
        if isinstance(node, list):
            raise ConfigError(f"--set {item}: cannot set a key on a list")
        node[path[-1]] = value
    return raw
