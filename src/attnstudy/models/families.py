"""The model-family registry, beside the task registry: every family of models is one
:class:`ModelFamily` entry that says how it is configured, built, saved and loaded, and what the
analysis battery can do with it — so nothing elsewhere asks ``if architecture == "hf"``.

Adding a family = its config class in :data:`attnstudy.config.MODEL_CONFIGS` (an ``architecture``
literal, ``pretrained``, ``architecture_tag``, ``used_fields``, ``key_files``, ``label``,
``n_layers``, ``n_heads``), a model satisfying the protocols of :mod:`attnstudy.analysis.contract`,
and its entry here (or :func:`register_family` from your own code, for a model used through the
Python API: docs/own-model.md).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import MODEL_CONFIGS
from .build import build_rnn, build_transformer


@dataclass(frozen=True)
class ModelFamily:
    """One family of models.

    Attributes:
        name: its ``model.architecture`` value.
        config: its config class (:data:`attnstudy.config.MODEL_CONFIGS`).
        build: ``(config, source vocabulary size, target vocabulary size) -> model``, untrained,
            in training mode; None for a family that is not trained here (a pretrained folder).
        saved_as: how a model of the family is stored: ``"model files"`` (weights.pt, config.json
            and the two vocabularies: :func:`attnstudy.models.io.save_model_dir`) or
            ``"its folder"`` (a ``save_pretrained`` folder, recorded by its digests).
        load: ``"module:function"`` loading a stored model of the family (imported when used).
        capabilities: what the battery can do with a model of the family that has attention
            (:data:`attnstudy.analysis.catalogue.CAPABILITIES`; a test holds them equal to
            :func:`attnstudy.analysis.contract.capabilities` of a built model).
        check: optional ``RunSpec -> None`` run before anything is written (a pretrained
            folder is checked, and its optional extra); raises with one line.
    """

    name: str
    config: type
    build: Callable[[Any, int, int], Any] | None
    saved_as: str
    load: str
    capabilities: tuple[str, ...]
    check: Callable[[Any], None] | None = None

    @property
    def pretrained(self) -> bool:
        """Whether its models are folders evaluated as they are, never trained here."""
        return self.build is None


def _check_pretrained(spec) -> None:
    from attnstudy.data.hf_folder import HFError, check_folder

    check_folder(spec.model.folder)
    if importlib.util.find_spec("transformers") is None:
        raise HFError(
            f"{spec.name}: a pretrained model needs the optional extra: pip install 'attnstudy[hf]'"
        )


_CORE = ("attention", "local", "global", "gradients", "prefix_gradients", "values")
FAMILIES: dict[str, ModelFamily] = {
    "rnn": ModelFamily(
        "rnn",
        MODEL_CONFIGS["rnn"],
        build_rnn,
        "model files",
        "attnstudy.models.io:load_model_dir",
        _CORE,
    ),
    "transformer": ModelFamily(
        "transformer",
        MODEL_CONFIGS["transformer"],
        build_transformer,
        "model files",
        "attnstudy.models.io:load_model_dir",
        (*_CORE, "self_attention"),
    ),
    "hf": ModelFamily(
        "hf",
        MODEL_CONFIGS["hf"],
        None,
        "its folder",
        "attnstudy.models.hf:load_pretrained",
        (*_CORE, "self_attention"),
        check=_check_pretrained,
    ),
}
"""Registry: ``model.architecture`` → :class:`ModelFamily`."""


def get_family(name: str) -> ModelFamily:
    """The registry entry of a family.

    Raises:
        ValueError: an unknown family (the message lists the known ones).
    """
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


def register_family(family: ModelFamily, overwrite: bool = False) -> ModelFamily:
    """Add a family (a user's own, used through the Python API; docs/own-model.md).

    Raises:
        ValueError: the name is taken (unless ``overwrite``).
    """
    if family.name in FAMILIES and not overwrite:
        raise ValueError(f"a model family named {family.name!r} is already registered")
    FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    """Remove a family added with :func:`register_family` (tests, notebooks)."""
    if name not in MODEL_CONFIGS:
        FAMILIES.pop(name, None)


def build_model(cfg, src_vocab_size: int, tgt_vocab_size: int):
    """Instantiate the untrained model ``cfg`` describes, through its family's ``build``.

    Args:
        cfg: a validated model config (``cfg.architecture`` names the family).
        src_vocab_size, tgt_vocab_size: vocabulary sizes (specials included).

    Raises:
        ValueError: an unknown family, or one whose models are not built here (pretrained).
    """
    family = get_family(cfg.architecture)
    if family.build is None:
        raise ValueError(f"a {family.name} model is not built here: it is loaded from its folder")
    return family.build(cfg, src_vocab_size, tgt_vocab_size)
