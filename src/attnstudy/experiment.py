"""The experiment file (TOML): base sections ``[data]``, ``[model]``, ``[training]`` and
``[ablation]`` and a list ``[[models]]`` of variants; each variant deep-merges its own
``data``/``model``/``training`` tables over the base and may name its own ``seeds``. A variant
of another architecture than the base ``[model]`` (``model.architecture``, default ``rnn``)
takes none of the base model keys: the base section describes models of its architecture; a
variant of a task with other data settings than the base ``[data]``'s (another section class of
``config.DATA_CONFIGS``: ``g2p`` after ``copy``, not ``reverse``) likewise takes none of the base
data keys. Every
variant × seed is one :class:`~attnstudy.config.RunSpec`: one trained model, one MLflow run,
labelled by the variant's ``name`` or its model (``additive-bahdanau``, ``transformer-L2H4``);
two variants with one label in one task are refused.

This module imports only the standard library, pydantic and the torch-free configuration and
catalogue modules, so a usage error is reported before torch or mlflow are imported.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PrivateAttr, ValidationError, field_validator
from pydantic_core import PydanticSerializationError

from attnstudy.verdict.findings import ReportConfig, VerdictThresholds

from .analysis.catalogue import AblationConfig
from .config import (
    DATA_CONFIGS,
    MAX_NESTING,
    MODEL_CONFIGS,
    ConfigError,
    RunSpec,
    Seed,
    TrainingConfig,
    _architecture,
    _deep_merge,
    _describe,
    _Strict,
    _task,
    apply_overrides,
    check_nesting,
    check_tracking_uri,
    examples_hint,
    register_config_model,
    validate_data_config,
    validate_model_config,
)


def _distinct_seeds(v: list[int]) -> list[int]:
    """Refuse a seed listed twice: it would train one model twice under one label (the report's
    per-model tables then have two rows with one name)."""
    if len(set(v)) != len(v):
        twice = sorted({s for s in v if v.count(s) > 1})
        raise ValueError(f"seed(s) {twice} listed more than once: give each seed once")
    return v


Seeds = Annotated[list[Seed], AfterValidator(_distinct_seeds)]
"""A list of distinct seeds."""

MAX_MODELS = 1000
"""Most models one experiment trains: its ``[[models]]`` entries × their seeds, refused at
validation beyond it (each list of seeds is capped at the same number). Without the cap a file of
10,000 entries was accepted and started training them one after another; a larger study is
several experiment files."""


class ExperimentMeta(_Strict):
    """``[experiment]``: the MLflow experiment name (letters, digits, ``_.-``), the training seeds
    (one model per variant and seed), and the tracking store and its connection timeout (seconds).
    """

    name: str = Field("default", min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.\-]+$")
    seeds: Seeds = Field(default_factory=lambda: [1], min_length=1, max_length=MAX_MODELS)
    tracking_uri: str | None = None
    # seconds to wait for a tracking server; None: $ATTNSTUDY_TRACKING_TIMEOUT, else 10
    tracking_timeout: float | None = Field(None, gt=0, le=3600)
    # worker processes of the local executor (models trained and ablated side by side); None:
    # the cores divided by training.threads, capped by the models; 1: one after another in this
    # process (attnstudy.executors.local_workers)
    workers: int | None = Field(None, ge=1, le=256)
    # Ray executor: how often Ray runs a training or ablation task again after its worker or node
    # died (an error the task raises is never retried); a retry takes over its earlier attempt's
    # run and continues it (executors/distributed.py)
    task_retries: int = Field(2, ge=0, le=10)

    @field_validator("name")
    @classmethod
    def _not_dots(cls, v: str) -> str:
        if set(v) == {"."}:
            raise ValueError(
                f"experiment.name {v!r} is only dots; it names folders, so use letters or digits"
            )
        return v

    @field_validator("tracking_uri")
    @classmethod
    def _persistent(cls, v: str | None) -> str | None:
        return None if v is None else check_tracking_uri(v)


class ModelVariant(_Strict):
    """One ``[[models]]`` entry: overrides over the base sections."""

    name: str | None = Field(None, min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")
    seeds: Seeds | None = Field(None, min_length=1, max_length=MAX_MODELS)
    data: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)


class TrainedAdversaryConfig(_Strict):
    """``[trained_adversary]``: model-consistent adversarial training (Wiegreffe & Pinter 2019, §4;
    :mod:`attnstudy.analysis.consistent_adversary`), off while ``lambdas`` is empty.

    For each selected base model and each λ, a second model of the same configuration is trained
    to keep the base model's per-step outputs (TVD) while moving its attention away (−λ·KL), then
    compared with the base model on ``n_examples`` test examples (reference prefix).

    Attributes:
        lambdas: the λ values (≥ 0, distinct; empty: off).
        variants: the variant labels to attack (``[[models]]`` names or ``additive-bahdanau`` …);
            default every variant whose attention is learned (not ``uniform``/``none``, not a
            pretrained folder).
        seeds: the base models' seeds (default the first seed of the experiment).
        init: ``"base"`` (start from the base model's trained weights: λ = 0 is the base model)
            or ``"scratch"`` (a fresh initialisation, as W&P train it; on a V-way output TVD from
            a random start fits slowly).
        epochs, lr, batch_size: the adversary's optimisation (lr and batch size default to the
            base model's).
        n_train: training examples used (a prefix of the training split; default all).
        n_examples: test examples compared (default ``ablation.n_examples``).
        layer: the cross-attention layer whose head mean is pushed away and compared.
    """

    lambdas: list[float] = Field(default_factory=list, max_length=20)
    variants: list[str] | None = Field(None, min_length=1, max_length=100)
    seeds: Seeds | None = Field(None, min_length=1, max_length=100)
    init: Literal["base", "scratch"] = "base"
    epochs: int = Field(5, ge=1, le=1000)
    lr: float | None = Field(None, gt=0, le=10)
    batch_size: int | None = Field(None, ge=1, le=65_536)
    n_train: int | None = Field(None, ge=1)
    n_examples: int | None = Field(None, ge=1)
    layer: int = Field(-1, ge=-64, le=63)

    @field_validator("lambdas")
    @classmethod
    def _lambdas(cls, v: list[float]) -> list[float]:
        if any(not math.isfinite(x) or x < 0 for x in v):
            raise ValueError(f"every λ must be a finite number ≥ 0, got {v}")
        if len(set(v)) != len(v):
            raise ValueError(f"λ values repeat in {v}: give each once")
        return v

    @property
    def enabled(self) -> bool:
        return bool(self.lambdas)


class ExperimentConfig(_Strict):
    """An experiment file: shared ``[data]``/``[model]``/``[training]`` sections, the battery
    (``[ablation]``), the report thresholds, the trained adversary, and the ``[[models]]`` variants
    whose sections are merged over the shared ones (:meth:`runs`). Unknown keys are refused."""

    experiment: ExperimentMeta = ExperimentMeta()
    data: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] = Field(default_factory=dict)
    training: dict[str, Any] = Field(default_factory=dict)
    ablation: AblationConfig = Field(default_factory=AblationConfig)
    report: ReportConfig = Field(default_factory=ReportConfig)
    trained_adversary: TrainedAdversaryConfig = Field(default_factory=TrainedAdversaryConfig)
    models: list[ModelVariant] = Field(default_factory=lambda: [ModelVariant()], min_length=1)
    _resolved: tuple[str, tuple[RunSpec, ...]] | None = PrivateAttr(default=None)

    def runs(self) -> list[RunSpec]:
        """Resolve every variant × seed into a validated :class:`RunSpec`.

        Built once per content: the specs are kept with the config's JSON, and a later call (the
        CLI, the checks, the executors all ask) returns them again while the content is the same
        (a :meth:`model_copy` with other values, or a section dict changed in place, builds them
        anew). A new list each call; the specs themselves are frozen.

        Raises:
            ConfigError: if a merged section is invalid (names the variant and the field), or
                the entries × their seeds are more than :data:`MAX_MODELS`.
        """
        try:
            key = self.model_dump_json()
        except PydanticSerializationError:  # a value JSON cannot hold (Python API): no reuse
            key = None
        if key is not None and self._resolved is not None and self._resolved[0] == key:
            return list(self._resolved[1])
        count = sum(len(v.seeds or self.experiment.seeds) for v in self.models)
        if count > MAX_MODELS:
            raise ConfigError(
                f"{len(self.models):,} [[models]] entries × their seeds are {count:,} models to "
                f"train; at most {MAX_MODELS:,} are allowed in one experiment: split it into "
                "several experiment files"
            )
        specs: list[RunSpec] = []
        seen: dict[str, int] = {}
        base_arch = _architecture(self.model)
        for i, variant in enumerate(self.models):
            seeds = variant.seeds or self.experiment.seeds
            own = "architecture" in variant.model or "source" in variant.model
            arch = _architecture(variant.model) if own else base_arch
            # a task with other data settings (another section class) starts from its own table
            other_task = "task" in variant.data and DATA_CONFIGS.get(
                _task(variant.data)
            ) is not DATA_CONFIGS.get(_task(self.data))
            merged = {
                "data": dict(variant.data) if other_task else _deep_merge(self.data, variant.data),
                "model": _deep_merge(self.model, variant.model)
                if arch == base_arch
                else dict(variant.model),
                "training": _deep_merge(self.training, variant.training),
            }
            family = MODEL_CONFIGS.get(arch)
            if family is not None and family.pretrained and len(seeds) > 1:
                raise ConfigError(
                    f"models[{i}]: a pretrained model (source = hf:…) is not trained here, so "
                    f"seeds {seeds} would all be the same model; give this [[models]] entry "
                    "seeds = [1]"
                )
            label = None
            for seed in seeds:
                try:
                    spec = RunSpec(
                        experiment=self.experiment.name, seed=seed, variant=variant.name, **merged
                    )
                except ValidationError as err:
                    raise ConfigError(f"models[{i}]: {_describe(err)}") from None
                specs.append(spec)
                label = f"{spec.data.task}/{spec.label}"
            _check_used(i, variant, specs[-1])
            if label in seen:
                raise ConfigError(
                    f"models[{i}] and models[{seen[label]}] are both {label}: give them different "
                    'names (name = "…" in [[models]])'
                )
            seen[label] = i
        if key is not None:
            self._resolved = (key, tuple(specs))
        return specs


def _check_used(i: int, variant: ModelVariant, spec: RunSpec) -> None:
    """A setting a ``[[models]]`` entry gives itself must be one its model uses: ``heads = 3`` on
    additive attention was dropped without a word (and the single-head model reused).

    Raises:
        ConfigError: naming the entry, the setting and the model.
    """
    used = spec.used_fields()
    for section in ("data", "model", "training"):
        for key, value in getattr(variant, section).items():
            if key not in used[section]:
                raise ConfigError(
                    f"models[{i}]: {section}.{key} = {value!r} is not used by {spec.label} "
                    f"(task {spec.data.task}); remove it, or change the setting that would use it"
                )


for _m in (
    ExperimentConfig,
    ExperimentMeta,
    ModelVariant,
    AblationConfig,
    ReportConfig,
    VerdictThresholds,
    TrainedAdversaryConfig,
):
    register_config_model(_m)


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> ExperimentConfig:
    """Read, override and validate an experiment TOML file.

    Args:
        path: the experiment file.
        overrides: ``key=value`` strings (``--set``), applied before validation.

    Returns:
        The validated config; ``.runs()`` resolves the variants.

    Raises:
        ConfigError: missing/unreadable file, malformed TOML, a value nested too deeply, unknown
            key, wrong type or value.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"experiment file not found: {p} ({examples_hint()})")
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text; save the experiment file as UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{p}: malformed TOML: {err}") from None
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise ConfigError(
            f"{p}: a value is nested too deeply (more than {MAX_NESTING} levels of arrays or "
            "tables; no setting needs more than a few): correct the file"
        ) from None
    except OSError as err:
        raise ConfigError(f"cannot read {p}: {err.strerror}") from None
    check_nesting(raw, str(p))  # before anything that recurses (copying, validation) walks it
    if not raw and not overrides:  # all defaults: a 10-epoch copy study nobody asked for
        raise ConfigError(
            f'{p}: the file holds no settings; give at least [data] task = "…" ({examples_hint()})'
        )
    raw = resolve_data_paths(raw, p.resolve().parent, source=str(p))
    # --set values are the user's own typing: their relative paths are relative to the working directory
    raw = resolve_data_paths(apply_overrides(raw, overrides or []), Path.cwd(), check=False)
    return parse_experiment(raw, [], source=str(p))


def _path_fields() -> list[str]:
    names = (n for c in DATA_CONFIGS.values() for n in c.model_fields if n.endswith("_path"))
    return list(dict.fromkeys(names))


def resolve_data_paths(
    raw: dict[str, Any], folder: Path, source: str = "config", check: bool = True
) -> dict[str, Any]:
    """Make the relative data paths of a raw experiment (``[data]`` and every ``[[models]]`` data
    table: ``train_path``, ``dev_path``, ``test_path``; ``[ablation.contrastive] contrast``) and
    pretrained model folders (``model.source = "hf:FOLDER"``) absolute against ``folder``.

    The rule: a relative path in an experiment file resolves against the file's folder, so an
    experiment runs the same from any working directory. With ``check``, a path that names a
    *different* existing file against the working directory is refused (one line naming both),
    and so is a path that exists only against the working directory (what older versions read).

    Args:
        raw: the parsed TOML (not modified).
        folder: the experiment file's folder (or the working directory for ``--set`` values).
        source: the file, for messages.
        check: compare with the working directory (off for ``--set`` values).

    Returns:
        A copy of ``raw`` with absolute paths.

    Raises:
        ConfigError: an ambiguous path, or one found only against the working directory.
    """
    import copy
    import os

    raw = copy.deepcopy(raw)
    tables = [("data", raw.get("data"))]
    for i, variant in enumerate(raw.get("models") or []):
        if isinstance(variant, dict):
            tables.append((f"models[{i}].data", variant.get("data")))
    cwd = Path.cwd()
    models = [("model", raw.get("model"))]
    for i, variant in enumerate(raw.get("models") or []):
        if isinstance(variant, dict):
            models.append((f"models[{i}].model", variant.get("model")))
    for _, table in models:
        value = table.get("source") if isinstance(table, dict) else None
        if isinstance(value, str) and value.startswith("hf:") and value[3:].strip():
            model_dir = Path(value[3:]).expanduser()
            if not model_dir.is_absolute():
                model_dir = (folder / model_dir).resolve()
            table["source"] = f"hf:{model_dir}"
    keyed = [(where, table, _path_fields()) for where, table in tables]
    # the contrastive ablation's contrast sequences (a file of example_id<TAB>sequence lines)
    ablation = raw.get("ablation")
    if isinstance(ablation, dict):
        keyed.append(("ablation.contrastive", ablation.get("contrastive"), ["contrast"]))
    for where, table, keys in keyed:
        if not isinstance(table, dict):
            continue
        for key in keys:
            value = table.get(key)
            if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute():
                if isinstance(value, str) and value:
                    table[key] = str(Path(value).expanduser())
                continue
            here, there = folder / value, cwd / value
            if check and here.resolve() != there.resolve() and there.exists():
                if here.exists() and not os.path.samefile(here, there):
                    raise ConfigError(
                        f"{source}: {where}.{key} = {value!r} names two different files: {here} "
                        f"(against the experiment file's folder, which is what counts) and {there} "
                        "(against the working directory); give an absolute path"
                    )
                if not here.exists():
                    raise ConfigError(
                        f"{source}: {where}.{key} = {value!r}: no file {here} (relative paths in an "
                        f"experiment file resolve against its folder); {there} exists against the "
                        "working directory: write the path relative to the experiment file, or absolute"
                    )
            table[key] = str(here)
    return raw


def parse_experiment(
    raw: dict[str, Any], overrides: list[str] | None = None, source: str = "config"
) -> ExperimentConfig:
    """Validate a raw experiment dict (see :func:`load_experiment`).

    Raises:
        ConfigError: as :func:`load_experiment`.
    """
    check_nesting(raw, source)
    raw = apply_overrides(raw, overrides or [])
    try:
        cfg = ExperimentConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(f"{source}: {_describe(err)}") from None
    # the base sections must be valid on their own, so an error names the base, not a variant
    for section, validate in (
        ("data", validate_data_config),
        ("model", validate_model_config),
        ("training", TrainingConfig.model_validate),
    ):
        try:
            validate(getattr(cfg, section))
        except ValidationError as err:
            raise ConfigError(f"{source}: {_describe(err, section + '.')}") from None
        except ValueError as err:
            raise ConfigError(f"{source}: {err}") from None
    try:
        cfg.runs()
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    return cfg
