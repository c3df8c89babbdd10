"""One line for a configuration error (the location, the problem, the valid keys), and ``--set``
overrides."""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from .base import ConfigError
from .data import DATA_CONFIGS, DEFAULT_TASK, SyntheticData, _task
from .models import ARCHITECTURES, DEFAULT_ARCHITECTURE, MODEL_CONFIGS, ModelConfig, _architecture
from .run import RunSpec, TrainingConfig


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
    quoted = isinstance(given, str) and repr(given) in msg  # the message names it already
    return f"{loc}: {msg}" + (
        f" (got {_as_typed(given)})"
        if not isinstance(given, dict) and given is not None and not quoted
        else ""
    )


def examples_hint() -> str:
    """Where the example experiment files are, as a path that works from the working directory:
    ``experiments/`` where it is there, else the source checkout's folder, else the README."""
    if Path("experiments").is_dir():
        return "see experiments/ for examples"
    shipped = Path(__file__).resolve().parents[3] / "experiments"  # src/attnstudy/config/…
    if shipped.is_dir():
        return f"see {shipped} for examples"
    return "see the experiments/ folder of the attnstudy repository and its README.md for examples"


def _as_typed(value: Any) -> str:
    """A value as the user typed it in TOML or ``--set`` (``true``, not Python's ``True``)."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


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


MAX_NESTING = 32
"""The most levels of arrays and tables an experiment holds (the shipped experiments need at most
five): deeper input is refused before anything that recurses (copying, validation) walks it."""


def nesting_depth(value: Any) -> int:
    """Levels of lists and dicts in ``value``: 0 for a scalar, 1 for ``[1, 2]`` or ``{"a": 1}``.

    Iterative, so any depth is measured (a recursive walk stops at Python's recursion limit).
    """
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in children)
    return deepest


def check_nesting(raw: dict[str, Any], source: str) -> None:
    """Refuse a raw experiment nested more than :data:`MAX_NESTING` levels deep.

    Raises:
        ConfigError: one line naming ``source`` and the top-level key that holds the deep value.
    """
    for key, value in raw.items():
        if 1 + nesting_depth(value) > MAX_NESTING:
            raise ConfigError(
                f"{source}: {key!r} is nested too deeply (more than {MAX_NESTING} levels of arrays "
                "or tables; no setting needs more than a few): correct the value"
            )


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse ``key.path=value`` (value as a TOML literal, else a bare string).

    Raises:
        ConfigError: if there is no ``=``, the key is empty, or key and value together are nested
            more than :data:`MAX_NESTING` levels deep.
    """
    if "=" not in item:
        raise ConfigError(f"--set expects key=value, got {item!r} (e.g. --set training.epochs=3)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set has an empty key in {item!r}")
    too_deep = ConfigError(
        f"--set {key[:60]}{'…' if len(key) > 60 else ''}=…: nested too deeply (more than "
        f"{MAX_NESTING} levels of keys, arrays or tables; no setting needs more than a few)"
    )
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:  # tomllib parses nested arrays and inline tables recursively
        raise too_deep from None
    path = key.split(".")
    if len(path) + nesting_depth(value) > MAX_NESTING:
        raise too_deep
    return path, value


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


for _m in (RunSpec, *DATA_CONFIGS.values(), *MODEL_CONFIGS.values(), TrainingConfig):
    register_config_model(_m)
