"""The training section and :class:`RunSpec`, everything that determines one trained model: the
fields a model uses, its key, its MLflow params, and the migration of stored configs."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    model_validator,
)

from .base import SCHEMA_VERSION, Device, Seed, _Strict
from .data import DATA_CONFIGS, DataConfig, _task
from .models import AnyModelConfig, ModelConfig


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
    # per and token_error_rate: the token error rate, under the task's name for it (PER for G2P)
    early_stopping: Literal[
        "auto", "loss", "exact_match", "per", "token_error_rate", "wer", "token_accuracy"
    ] = "auto"
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
    # GPUs one Ray task of this model asks for (Ray's num_gpus; a fraction shares a GPU between
    # tasks, more than one must be whole); None: 1 for an explicit "cuda"/"cuda:N", else 0. With
    # device "auto", a task the scheduler gave a GPU trains on it, a task given none on the CPU, so
    # CPU-only and GPU nodes mix (a task asking 0 runs on any node). Ignored outside Ray; logged as
    # a param, not part of the model key (like threads)
    num_gpus: float | None = Field(None, ge=0, le=64)
    # memory one Ray task of this model reserves, in GiB (Ray's logical "memory" resource: a node
    # runs no more such tasks at once than its memory holds; nothing limits what a task uses); None:
    # none reserved. Workers measured up to 0.8 GiB on the shipped experiments. Ignored outside
    # Ray; logged as a param, not part of the model key (like threads)
    memory_gib: float | None = Field(None, gt=0, le=4096)
    # mixed precision for training only (float16 with loss scaling on CUDA, bfloat16 on the CPU);
    # evaluation, the stored weights and every ablation stay float32
    amp: bool = Field(False, json_schema_extra={"key_neutral": False})

    @model_validator(mode="after")
    def _gpus_fit_device(self) -> TrainingConfig:
        n = self.num_gpus
        if n is None:
            return self
        if n > 1 and n != int(n):
            raise ValueError(
                f"training.num_gpus = {n:g}: more than one GPU must be a whole number (Ray "
                "shares a GPU only in fractions below 1)"
            )
        if self.device == "cpu" and n > 0:
            raise ValueError(
                f"training.num_gpus = {n:g} with training.device = 'cpu' would hold GPUs it never "
                "uses; use device 'auto' or 'cuda', or num_gpus = 0"
            )
        if self.device.startswith("cuda") and n == 0:
            raise ValueError(
                f"training.device = {self.device!r} with training.num_gpus = 0: a Ray task given "
                "no GPU sees none; use device 'auto' or num_gpus > 0"
            )
        return self

    def gpus_per_task(self) -> float:
        """The GPUs a Ray task of this model asks for: ``num_gpus``, else 1 for an explicit
        ``cuda``/``cuda:N`` and 0 otherwise."""
        if self.num_gpus is not None:
            return float(self.num_gpus)
        return 1.0 if self.device.startswith("cuda") else 0.0


NOT_IN_MODEL_KEY = {
    "data.train_path",
    "data.dev_path",
    "data.test_path",
    "model.source",
    "training.threads",
    "training.device",
    "training.num_gpus",
    "training.memory_gib",
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
                (:func:`attnstudy.data.hf_folder.folder_digests`), which replace its folder's path.

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
