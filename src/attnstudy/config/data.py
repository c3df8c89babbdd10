"""The data section, one class per task (discriminated on ``task``): a setting the task does not
read is refused by the schema."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union, get_args

from pydantic import (
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from .base import MAX_EXAMPLES, MAX_LEN_BOUND, MAX_LEN_DEFAULT, SYNTHETIC_TOKEN_BUDGET, _Strict


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


class TSVSplit(_Strict):
    """``[data] split = {dev = 0.05, test = 0.1}``: one TSV file (``train_path``) split into
    train, dev and test by the salted SHA-256 of each example's source, every example of one
    source in the same split (:func:`attnstudy.data.tsv.split_examples`)."""

    dev: float = Field(gt=0, lt=1, description="share of the examples in dev (at least)")
    test: float = Field(gt=0, lt=1, description="share of the examples in test (at least)")
    salt: str = Field("attnstudy-tsv-v1", min_length=1, max_length=200)

    @model_validator(mode="after")
    def _check(self) -> TSVSplit:
        if self.dev + self.test >= 1:
            raise ValueError(
                f"dev ({self.dev}) + test ({self.test}) leave nothing for train; lower them"
            )
        return self


SPLIT_HINT = (
    "data.split = {dev = 0.05, test = 0.1} to split data.train_path into train, dev and test"
)
"""How a single TSV file is split, as the refusals name it."""


class TSVData(_TaskData):
    """Your own data: three TSV files (``source<TAB>target[<TAB>links]``), or one
    (``train_path``) that ``split`` splits into train, dev and test; tokenized by characters or
    spaces; examples longer than ``max_source_len``/``max_target_len`` are filtered and counted
    (:mod:`attnstudy.data.tsv`)."""

    task: Literal["tsv"]
    train_path: str = Field(min_length=1)
    split: TSVSplit | None = Field(None, json_schema_extra={"key_neutral": None})
    dev_path: str | None = Field(None, min_length=1, validate_default=True)
    test_path: str | None = Field(None, min_length=1, validate_default=True)
    source_tokenization: Literal["chars", "spaces"] = "spaces"
    target_tokenization: Literal["chars", "spaces"] = "spaces"
    alignment_base: Literal[0, 1] = Field(0, json_schema_extra={"key_neutral": 0})
    # which index of a link comes first: Pharaoh's "i-j" is source-target (fast_align,
    # awesome-align); some corpora write target-source
    alignment_order: Literal["source-target", "target-source"] = Field(
        "source-target", json_schema_extra={"key_neutral": "source-target"}
    )
    max_source_len: int = Field(MAX_LEN_DEFAULT, ge=1, le=MAX_LEN_BOUND)
    max_target_len: int = Field(MAX_LEN_DEFAULT, ge=1, le=MAX_LEN_BOUND)

    @field_validator("dev_path", "test_path")
    @classmethod
    def _one_file_or_three(cls, value: str | None, info: ValidationInfo) -> str | None:
        """Either ``split`` or both ``dev_path`` and ``test_path``, never both, never neither."""
        split = info.data.get("split")
        if value is None and split is None and "train_path" in info.data:
            raise PydanticCustomError(
                "tsv_file_missing", f"missing; task 'tsv' needs it, or {SPLIT_HINT}"
            )
        if value is not None and split is not None:
            raise PydanticCustomError(
                "tsv_split_and_file",
                "data.split splits data.train_path into train, dev and test: give either "
                "data.split or data.dev_path and data.test_path, not both",
            )
        return value

    def used_fields(self) -> list[str]:
        """All of its fields but ``split`` when unset, and ``dev_path``/``test_path`` when
        ``split`` replaces them (so three files keep the params and keys they had)."""
        unset = {"split"} if self.split is None else {"dev_path", "test_path"}
        return [n for n in type(self).model_fields if n not in unset]

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


class NTData(_DefaultLengths, _TaskData):
    """The Greek New Testament (SBLGNT) and the Berean Standard Bible with Biblica's manual word
    alignments (:mod:`attnstudy.data.nt`; the ``bible-alignments`` package, ``make test-deps``):
    one example per verse, ``direction`` Greek → English or back, subwords from the
    ``tokenizers`` library trained on the training split (``nt_tokenization``, ``nt_vocab_size``
    per language), split by chapter with ``split_salt``; ``n_train``/``n_dev``/``n_test`` take a
    prefix of each split's chapter order."""

    task: Literal["nt-greek-english"]
    direction: Literal["grc-en", "en-grc"] = "grc-en"
    nt_tokenization: Literal["bpe", "words"] = "bpe"
    nt_vocab_size: int = Field(8000, ge=100, le=1_000_000)
    split_salt: str = Field("attnstudy-nt-v1", min_length=1, max_length=200)
    nt_test_fraction: float = Field(0.10, gt=0, lt=1)
    nt_dev_fraction: float = Field(0.05, gt=0, lt=1)
    nt_min_test_verses: int = Field(300, ge=0, le=MAX_EXAMPLES)

    @model_validator(mode="after")
    def _check(self) -> NTData:
        if self.nt_test_fraction + self.nt_dev_fraction >= 1:
            raise ValueError(
                f"nt_test_fraction ({self.nt_test_fraction}) + nt_dev_fraction "
                f"({self.nt_dev_fraction}) leave nothing for train; lower them"
            )
        return self


DATA_CONFIGS: dict[str, type[_TaskData]] = {
    task: c
    for c in (SyntheticData, G2PData, TSVData, DatesData, NTData)
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
