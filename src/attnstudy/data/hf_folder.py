"""A ``save_pretrained`` folder as a file system object, without torch or transformers.

What "the same pretrained model" means (:func:`folder_digests`: SHA-256 of config, tokenizer
and weights), whether attnstudy can study it (:func:`check_folder`: an encoder-decoder of a
supported family with safetensors weights and a tokenizer) and its decoder's shape
(:func:`decoder_shape`) are all read from the folder's files, so an experiment naming a folder
(``[model] source = "hf:FOLDER"``) is checked and keyed before torch or transformers are imported.
The loading itself is :func:`attnstudy.models.hf.load_pretrained`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnstudy.config import decoder_shape
from attnstudy.data.types import DataError
from attnstudy.runtime.paths import (
    InputFileError,
    check_input_file,
    open_input_file,
    read_input_text,
)

__all__ = [
    "HF_PREFIX",
    "SUPPORTED_FAMILIES",
    "TOKENIZER_FILES",
    "HFError",
    "check_folder",
    "check_model_files",
    "decoder_shape",
    "folder_config",
    "folder_digests",
    "folder_files",
    "safetensors_shapes",
]

HF_PREFIX = "hf:"
"""The URI scheme of a ``save_pretrained`` folder (command line and ``model.source``)."""

SUPPORTED_FAMILIES = ("bart", "marian", "t5")
"""The ``model_type`` values (``config.json``) attnstudy analyses."""

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "source.spm",
    "target.spm",
    "spiece.model",
)
"""The tokenizer files whose bytes :func:`folder_digests` covers (those the folder has)."""

READ_SUFFIXES = (".json", ".txt", ".model", ".spm", ".safetensors")
"""The files of a folder that attnstudy or transformers read (configs, tokenizers, weights):
each must be a regular file within its bound (:func:`attnstudy.runtime.paths.check_input_file`)
before
anything is read. Other files (``*.bin`` pickles, a README) are never opened."""


class HFError(DataError):
    """A Hugging Face model folder attnstudy cannot use, as one line saying what to do (what the
    user named is missing or malformed: exit code 2 at the command line)."""


def _digest(paths: Sequence[Path], weights: bool = False) -> str:
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode())
        try:
            with open_input_file(path, weights) as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
        except InputFileError as e:  # replaced since folder_files checked it
            raise HFError(str(e)) from None
    return h.hexdigest()


def _check_files(folder: Path) -> None:
    """Every file of ``folder`` that is read (:data:`READ_SUFFIXES`, links followed) is a
    regular file within its bound, checked without opening it."""
    for entry in sorted(folder.iterdir()):
        if entry.suffix in READ_SUFFIXES or entry.name in TOKENIZER_FILES:
            try:
                check_input_file(entry, weights=entry.suffix == ".safetensors")
            except InputFileError as e:
                raise HFError(str(e)) from None
            except OSError as e:
                raise HFError(f"{entry}: cannot read it ({e.strerror})") from None


def folder_files(path: str | Path) -> tuple[Path, list[Path], list[Path]]:
    """A model folder's files, checked without reading them: (config.json, the tokenizer files,
    the safetensors weights).

    Raises:
        HFError: the folder or its config is missing, it holds no safetensors weights (pickle
            ``*.bin`` weights are refused, never read), or no tokenizer files; a file that would
            be read is not a regular file (a FIFO, ``/dev/zero``, a link to nothing) or is
            larger than its bound (:func:`attnstudy.runtime.paths.check_input_file`).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise HFError(f"{folder}: no such folder; pass a folder written by save_pretrained")
    config = folder / "config.json"
    if not os.path.lexists(config):
        raise HFError(f"{folder}: no config.json; pass a folder written by save_pretrained")
    _check_files(folder)
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in folder.glob("*.bin"))
        if pickles:
            raise HFError(
                f"{folder}: holds pickle weights ({', '.join(pickles)}), which attnstudy never "
                "loads; save the model again with save_pretrained (safetensors is the default)"
            )
        raise HFError(f"{folder}: no *.safetensors weights; save the model with save_pretrained")
    tokenizer = [folder / n for n in TOKENIZER_FILES if (folder / n).is_file()]
    if not tokenizer:
        raise HFError(f"{folder}: no tokenizer files; save the tokenizer to the same folder")
    return config, tokenizer, weights


def folder_digests(path: str | Path) -> dict[str, str]:
    """SHA-256 (hex) of a model folder's config, tokenizer files and weights — what "the same
    model" means for reuse: ``{"config": …, "tokenizer": …, "weights": …}``. Reads every byte of
    the weights: call it where the digests are needed, :func:`folder_files` where only the
    files' presence is.

    Raises:
        HFError: as :func:`folder_files`.
    """
    config, tokenizer, weights = folder_files(path)
    return {
        "config": _digest([config]),
        "tokenizer": _digest(tokenizer),
        "weights": _digest(weights, weights=True),
    }


def folder_config(path: str | Path) -> dict[str, Any]:
    """The folder's ``config.json`` as a dict.

    Raises:
        HFError: no such file, not a regular file within its bound, or not a JSON object.
    """
    config = Path(path) / "config.json"
    try:
        raw = json.loads(read_input_text(config))
    except FileNotFoundError:
        raise HFError(f"{config}: no such file; pass a folder written by save_pretrained") from None
    except InputFileError as e:
        raise HFError(str(e)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFError(f"{config}: not a JSON config ({e}); save the model again") from None
    if not isinstance(raw, dict):
        raise HFError(f"{config}: not a JSON object; save the model again")
    return raw


def check_folder(path: str | Path) -> None:
    """Everything about a folder that can be checked without loading or hashing it: the files
    (:func:`folder_files`), an encoder-decoder (``is_encoder_decoder``), and
    :func:`check_model_files` (a supported family, no custom code, a config that describes the
    weights, read from the safetensors headers).

    Raises:
        HFError: one line naming the problem and what to do.
    """
    check_model_files(path)


MAX_SAFETENSORS_HEADER = 100 << 20
"""Largest safetensors header read (bytes): the JSON index of a file's tensors. A model of a
hundred thousand tensors needs a few MB; a header claiming more is not a file save_pretrained
wrote."""


def safetensors_shapes(path: str | Path) -> dict[str, list[int]]:
    """The tensor shapes a safetensors file declares in its header (name → shape), read without
    reading the tensors.

    Raises:
        HFError: the file is not a safetensors file (too short, a header longer than
            :data:`MAX_SAFETENSORS_HEADER`, or not JSON), named with what to do.
    """
    path = Path(path)
    try:
        with open_input_file(path, True) as f:
            head = f.read(8)
            if len(head) < 8:
                raise HFError(f"{path}: too short for a safetensors file; save the model again")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_SAFETENSORS_HEADER:
                raise HFError(
                    f"{path}: its header claims {n:,} bytes (at most {MAX_SAFETENSORS_HEADER:,} "
                    "are read): not a file save_pretrained wrote; save the model again"
                )
            raw = f.read(n)
    except InputFileError as e:
        raise HFError(str(e)) from None
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError):  # HFError is a ValueError too: only the parse here
        raise HFError(
            f"{path}: its header is not JSON: not a safetensors file; save it again"
        ) from None
    if not isinstance(header, dict):
        raise HFError(f"{path}: its header is not a JSON object: not a safetensors file")
    return {
        k: list(v.get("shape", []))
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    }


def check_model_files(path: str | Path) -> dict[str, Any]:
    """What transformers would trip over, checked from the files themselves before it is
    imported: the config names an encoder-decoder of a supported family and no custom code
    (``auto_map``), and it
    describes the weights (an embedding of vocab_size × d_model, as many decoder layers as the
    weights hold), so a doctored config never makes transformers build a huge model first.

    Returns:
        The config dict.

    Raises:
        HFError: one line naming the folder (or file) and what is wrong.
    """
    folder = Path(path)
    _, _, weights = folder_files(folder)
    cfg = folder_config(folder)
    if "auto_map" in cfg:
        raise HFError(
            f"{folder / 'config.json'}: auto_map names code of the folder's own to run; attnstudy "
            "never runs code from a model folder: use a model transformers defines "
            f"({', '.join(SUPPORTED_FAMILIES)})"
        )
    model_type = cfg.get("model_type")
    if not cfg.get("is_encoder_decoder", False):
        raise HFError(
            f"{folder}: {model_type!r} is not an encoder-decoder; attnstudy analyses "
            "cross-attention, which decoder-only models do not have"
        )
    if model_type not in SUPPORTED_FAMILIES:
        raise HFError(
            f"{folder}: model_type {model_type!r} is not supported; attnstudy analyses "
            f"{', '.join(SUPPORTED_FAMILIES)} encoder-decoders"
        )
    shapes: dict[str, list[int]] = {}
    for w in weights:
        shapes.update(safetensors_shapes(w))
    vocab, dim = cfg.get("vocab_size"), cfg.get("d_model")
    if isinstance(vocab, int) and isinstance(dim, int) and [vocab, dim] not in shapes.values():
        raise HFError(
            f"{folder}: config.json says vocab_size {vocab:,} × d_model {dim:,}, but no weight in "
            "its safetensors files has that shape: the config does not describe these weights"
        )
    layers = {
        int(m.group(1))
        for name in shapes
        if (m := re.search(r"decoder\.(?:layers|block)\.(\d+)\.", name))
    }
    try:
        want = decoder_shape(cfg)[0]
    except ValueError:
        want = None
    if layers and want is not None and want != len(layers):
        raise HFError(
            f"{folder}: config.json says {want:,} decoder layers, but its weights hold "
            f"{len(layers):,}: the config does not describe these weights"
        )
    return cfg
