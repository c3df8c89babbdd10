"""Typed, validated configuration of one trained model (core layer): data, model, training, the
stored run config (:class:`RunSpec`, its schema version and migration, its model key) and the
helpers every config uses (one-line errors, ``--set`` overrides).

The experiment file that combines them with the ablation settings is
:mod:`attnstudy.experiment`.

This module imports only the standard library and pydantic, so a usage error is reported
before torch or mlflow are imported.

The package is split by section: :mod:`.base` (shared), :mod:`.data` (a class per task),
:mod:`.models` (a class per model family), :mod:`.run` (training and :class:`RunSpec`),
:mod:`.uris` and :mod:`.errors`; every name is importable from here.
"""

from __future__ import annotations

from .base import DEVICE_PATTERN as DEVICE_PATTERN
from .base import MAX_EXAMPLES as MAX_EXAMPLES
from .base import MAX_LEN_BOUND as MAX_LEN_BOUND
from .base import MAX_LEN_DEFAULT as MAX_LEN_DEFAULT
from .base import SCHEMA_VERSION as SCHEMA_VERSION
from .base import SYNTHETIC_TOKEN_BUDGET as SYNTHETIC_TOKEN_BUDGET
from .base import ConfigError as ConfigError
from .base import Device as Device
from .base import Seed as Seed
from .base import _check_device as _check_device
from .base import _plain_types as _plain_types
from .base import _Strict as _Strict
from .base import refuse_coercion as refuse_coercion
from .data import _DATA_ADAPTER as _DATA_ADAPTER
from .data import DATA_CONFIGS as DATA_CONFIGS
from .data import DEFAULT_TASK as DEFAULT_TASK
from .data import DataConfig as DataConfig
from .data import DatesData as DatesData
from .data import G2PData as G2PData
from .data import NTData as NTData
from .data import SyntheticData as SyntheticData
from .data import TSVData as TSVData
from .data import _DefaultLengths as _DefaultLengths
from .data import _task as _task
from .data import _TaskData as _TaskData
from .data import data_config as data_config
from .data import data_config_json as data_config_json
from .data import validate_data_config as validate_data_config
from .errors import _MODELS as _MODELS
from .errors import MAX_NESTING as MAX_NESTING
from .errors import _deep_merge as _deep_merge
from .errors import _describe as _describe
from .errors import _fields_at as _fields_at
from .errors import apply_overrides as apply_overrides
from .errors import check_nesting as check_nesting
from .errors import describe_error as describe_error
from .errors import examples_hint as examples_hint
from .errors import parse_override as parse_override
from .errors import register_config_model as register_config_model
from .models import ARCHITECTURES as ARCHITECTURES
from .models import ATTENTIONS as ATTENTIONS
from .models import DEFAULT_ARCHITECTURE as DEFAULT_ARCHITECTURE
from .models import FLOWS as FLOWS
from .models import MODEL_CONFIGS as MODEL_CONFIGS
from .models import PRETRAINED_ARCHITECTURE as PRETRAINED_ARCHITECTURE
from .models import RNN_ONLY_KEYS as RNN_ONLY_KEYS
from .models import TRANSFORMER_ONLY_KEYS as TRANSFORMER_ONLY_KEYS
from .models import AnyModelConfig as AnyModelConfig
from .models import ModelConfig as ModelConfig
from .models import PretrainedConfig as PretrainedConfig
from .models import TransformerConfig as TransformerConfig
from .models import _architecture as _architecture
from .models import decoder_shape as decoder_shape
from .models import validate_model_config as validate_model_config
from .run import MAX_PARAM_CHARS as MAX_PARAM_CHARS
from .run import NOT_IN_MODEL_KEY as NOT_IN_MODEL_KEY
from .run import RunSpec as RunSpec
from .run import TrainingConfig as TrainingConfig
from .run import _section_fields as _section_fields
from .run import flatten as flatten
from .run import load_run_spec as load_run_spec
from .run import migrate_run_config as migrate_run_config
from .run import shorten_params as shorten_params
from .uris import RUN_ID_PATTERN as RUN_ID_PATTERN
from .uris import RUN_PATH_PART as RUN_PATH_PART
from .uris import URI_DECODE_ROUNDS as URI_DECODE_ROUNDS
from .uris import check_model_uri as check_model_uri
from .uris import check_tracking_uri as check_tracking_uri
from .uris import looks_like_path as looks_like_path
from .uris import split_runs_uri as split_runs_uri
from .uris import sqlite_database as sqlite_database
