"""The model section, one class per model family (discriminated on ``architecture``): the
recurrent family, the Transformer and a pretrained Hugging Face folder; the configuration part of
the family registry (:mod:`attnstudy.models.families`)."""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import (
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from .base import MAX_LEN_BOUND, ConfigError, _Strict


@dataclass(frozen=True)
class ScoreFields:
    """What the config needs of an attention score (:class:`attnstudy.models.attention.Score`):
    the recurrent model's fields it reads beyond the core (``uses``) and the field giving its
    number of heads (``heads``; None: one head)."""

    uses: tuple[str, ...] = ()
    heads: str | None = None


SCORE_SIZE_FIELDS = ("attention_dim", "heads", "attention_key_dim", "attention_value_dim")
"""The recurrent model's fields that belong to its attention score (:attr:`ScoreFields.uses`)."""


SCORES_SOURCE = Path(__file__).parents[1] / "models" / "attention.py"
"""The attention registry's module, read (not imported) for :data:`SCORE_FIELDS`."""


def read_score_fields(path: Path = SCORES_SOURCE) -> dict[str, ScoreFields]:
    """The scores of :data:`attnstudy.models.attention.ATTENTIONS` and the fields each uses, read
    from the module's source without importing it (torch): each entry's ``uses=`` and ``heads=``
    literals.

    Raises:
        RuntimeError: the module has no ``ATTENTIONS = {…}`` of ``Score(…)`` entries with literal
            ``uses`` and ``heads``.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if not (isinstance(target, ast.Name) and target.id == "ATTENTIONS"):
            continue
        if not isinstance(node.value, ast.Dict):
            break
        found: dict[str, ScoreFields] = {}
        for key, value in zip(node.value.keys, node.value.values):
            if not (isinstance(key, ast.Constant) and isinstance(value, ast.Call)):
                break
            try:
                kw = {
                    k.arg: ast.literal_eval(k.value)
                    for k in value.keywords
                    if k.arg in ("uses", "heads")
                }
            except ValueError:
                break
            found[key.value] = ScoreFields(tuple(kw.get("uses", ())), kw.get("heads"))
        else:
            for name, f in found.items():
                unknown = set(f.uses) - set(SCORE_SIZE_FIELDS)
                if unknown or (f.heads is not None and f.heads not in f.uses):
                    raise RuntimeError(
                        f"{path}: attention score {name!r} uses {sorted(unknown)} or heads="
                        f"{f.heads!r} outside its uses; a score's own fields are "
                        f"{', '.join(SCORE_SIZE_FIELDS)}"
                    )
            return found
        break
    raise RuntimeError(
        f"{path}: ATTENTIONS must be a dict literal of Score(…) entries with literal uses=… and "
        "heads=…"
    )


SCORE_FIELDS: dict[str, ScoreFields] = read_score_fields()
"""Every attention score the recurrent config accepts → the fields it uses: those of
:data:`attnstudy.models.attention.ATTENTIONS` (read from its source) and any added with
:func:`attnstudy.models.attention.register_attention`."""
ATTENTIONS = tuple(SCORE_FIELDS)
"""The built-in attention scores of the recurrent family (the registry's keys; a test holds the
two equal)."""


def register_score_fields(
    name: str, uses: tuple[str, ...] = (), heads: str | None = None, overwrite: bool = False
) -> None:
    """Accept ``attention = name`` (through :func:`attnstudy.models.attention.register_attention`).

    Raises:
        ValueError: a name that is taken (unless ``overwrite``) or not a lower-case identifier,
            or a field that is not one of :data:`SCORE_SIZE_FIELDS`.
    """
    if not (name.isidentifier() and name.islower()):
        raise ValueError(f"attention score name {name!r} must be a lower-case identifier")
    if name in SCORE_FIELDS and not overwrite:
        raise ValueError(f"an attention score named {name!r} is already registered")
    unknown = [f for f in (*uses, *([heads] if heads else [])) if f not in SCORE_SIZE_FIELDS]
    if heads is not None and heads not in uses:
        unknown.append(f"heads={heads!r} (not in uses)")
    if unknown:
        raise ValueError(
            f"attention score {name!r} uses {unknown}; a score's own fields are "
            f"{', '.join(SCORE_SIZE_FIELDS)}"
        )
    SCORE_FIELDS[name] = ScoreFields(tuple(uses), heads)


def unregister_score_fields(name: str) -> None:
    """Undo :func:`register_score_fields` (a built-in score stays)."""
    if name not in ATTENTIONS:
        SCORE_FIELDS.pop(name, None)


FLOWS = ("bahdanau", "luong")
"""Where the recurrent decoder attends: before the RNN step (Bahdanau) or after it (Luong)."""


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
    attention: str = "additive"  # a key of SCORE_FIELDS
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

    @field_validator("attention")
    @classmethod
    def _known_score(cls, value: str) -> str:
        if value not in SCORE_FIELDS:
            raise ValueError(
                f"unknown attention score {value!r}; valid: "
                + ", ".join(repr(a) for a in SCORE_FIELDS)
            )
        return value

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
        # the score's own fields, as its registry entry declares them, in one order
        uses = SCORE_FIELDS[self.attention].uses
        return names + [f for f in SCORE_SIZE_FIELDS if f in uses]

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
        """Attention heads: the score's ``heads`` field (:class:`ScoreFields`), else 1."""
        field = SCORE_FIELDS[self.attention].heads
        return int(getattr(self, field)) if field else 1

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
        if untied and untied[0] not in SCORE_FIELDS[self.attention].uses:
            using = [a for a, f in SCORE_FIELDS.items() if untied[0] in f.uses]
            raise ValueError(
                f"model.{untied[0]} applies to the {' and '.join(using)} scores only, not "
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
    trained (:mod:`attnstudy.study.pretrained`). ``architecture = "hf"`` is implied by ``source``.

    The model key covers the folder's config, tokenizer and weight digests
    (:func:`attnstudy.data.hf_folder.folder_digests`), not its path: the same files elsewhere are
    the
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
                "(attnstudy.data.hf_folder.folder_digests)"
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
        from attnstudy.runtime.paths import InputFileError, read_input_text

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
