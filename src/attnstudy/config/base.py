"""What every config shares: the strict base model (finite numbers, no coercion of a boolean or a
string into a number), the error type, and the bounds and annotated types several sections use."""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
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


DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d{1,3})$")


def _check_device(value: str) -> str:
    if not DEVICE_PATTERN.match(value):
        raise ValueError("use 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return value


Device = Annotated[str, AfterValidator(_check_device)]
"""``training.device`` / ``ablation.device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (resolved
where the work runs: :mod:`attnstudy.models.devices`)."""


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
