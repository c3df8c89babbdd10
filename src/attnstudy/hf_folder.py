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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnstudy.config import decoder_shape
from attnstudy.data.types import DataError
from attnstudy.paths import InputFileError, check_input_file, open_input_file, read_input_text

__all__ = [
    "HF_PREFIX",
    "SUPPORTED_FAMILIES",
    "TOKENIZER_FILES",
    "HFError",
    "check_folder",
    "decoder_shape",
    "folder_config",
    "folder_digests",
    "folder_files",
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
each must be a regular file within its bound (:func:`attnstudy.paths.check_input_file`) before
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
            larger than its bound (:func:`attnstudy.paths.check_input_file`).
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
    (:func:`folder_files`), an encoder-decoder (``is_encoder_decoder``) of a supported family.

    Raises:
        HFError: one line naming the problem and what to do.
    """
    folder_files(path)
    config = folder_config(path)
    model_type = config.get("model_type")
    if not config.get("is_encoder_decoder", False):
        raise HFError(
            f"{path}: {model_type!r} is not an encoder-decoder; attnstudy analyses "
            "cross-attention, which decoder-only models do not have"
        )
    if model_type not in SUPPORTED_FAMILIES:
        raise HFError(
            f"{path}: model_type {model_type!r} is not supported; attnstudy analyses "
            f"{', '.join(SUPPORTED_FAMILIES)} encoder-decoders"
        )
