"""Save and load a trained model as plain files: weights (state_dict), JSON config, vocabularies.

Loading never unpickles code: weights are read with ``torch.load(weights_only=True)`` and the
config is validated JSON (docs/design.md §5).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from attnstudy.runtime.paths import (
    InputFileError,
    check_input_file,
    open_input_file,
    read_input_text,
)

from ..config import RunSpec, load_run_spec
from ..data.vocab import Vocab
from .families import build_model
from .seq2seq import Seq2Seq

WEIGHTS, CONFIG, SRC_VOCAB, TGT_VOCAB = (
    "weights.pt",
    "config.json",
    "src_vocab.json",
    "tgt_vocab.json",
)
MODEL_FILES = (WEIGHTS, CONFIG, SRC_VOCAB, TGT_VOCAB)


class ModelLoadError(RuntimeError):
    """A model directory is missing files or holds something that is not a plain model."""


@dataclass
class LoadedModel:
    """A model with everything needed to use it."""

    model: Seq2Seq
    spec: RunSpec
    src_vocab: Vocab
    tgt_vocab: Vocab


def save_model_dir(
    directory: str | Path, model: Seq2Seq, spec: RunSpec, src_vocab: Vocab, tgt_vocab: Vocab
) -> Path:
    """Write the four model files into ``directory`` (created). Returns the directory."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    # host copies: the stored weights load on any machine, whatever device trained them
    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, d / WEIGHTS)
    (d / CONFIG).write_text(spec.model_dump_json(indent=2), encoding="utf-8")
    (d / SRC_VOCAB).write_text(json.dumps(src_vocab.to_json()), encoding="utf-8")
    (d / TGT_VOCAB).write_text(json.dumps(tgt_vocab.to_json()), encoding="utf-8")
    return d


def load_model_dir(directory: str | Path) -> LoadedModel:
    """Load a model saved by :func:`save_model_dir`, in eval mode.

    Raises:
        ModelLoadError: a file is missing, not a regular file (a FIFO, ``/dev/zero``) or larger
            than its bound (:func:`attnstudy.runtime.paths.check_input_file`; checked before any
            file is
            read), the config or vocabulary is invalid, the weights are not a plain state_dict
            (e.g. a pickle that would run code is refused), or they hold NaN/inf.
    """
    d = Path(directory)
    missing = [f for f in MODEL_FILES if not os.path.lexists(d / f)]
    if missing:
        raise ModelLoadError(f"model directory {d} lacks {', '.join(missing)}")
    try:
        for f in MODEL_FILES:
            check_input_file(d / f, weights=f == WEIGHTS)
    except InputFileError as err:
        raise ModelLoadError(str(err)) from None
    try:
        spec = load_run_spec(read_input_text(d / CONFIG))
        src_vocab = Vocab.from_json(json.loads(read_input_text(d / SRC_VOCAB)))
        tgt_vocab = Vocab.from_json(json.loads(read_input_text(d / TGT_VOCAB)))
    except (ValueError, UnicodeDecodeError) as err:
        raise ModelLoadError(
            f"invalid model config or vocabulary in {d}: {str(err).splitlines()[0]}"
        ) from None
    try:
        with open_input_file(d / WEIGHTS, weights=True) as f:
            state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as err:  # weights_only refuses anything but tensors and plain containers
        raise ModelLoadError(
            f"refusing to load {d / WEIGHTS}: not a plain state_dict "
            f"({type(err).__name__}: {str(err).splitlines()[0][:200]})"
        ) from None
    model = build_model(spec.model, len(src_vocab), len(tgt_vocab))
    try:
        model.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as err:
        raise ModelLoadError(
            f"weights in {d} do not match the config: {str(err).splitlines()[0][:200]}"
        ) from None
    bad = [
        name
        for name, t in model.state_dict().items()
        if t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if bad:
        raise ModelLoadError(
            f"weights in {d} hold NaN or inf values ({len(bad)} tensor(s), e.g. {bad[0]}): "
            "every output and attention row would be meaningless; retrain the model"
        )
    model.eval()
    return LoadedModel(model, spec, src_vocab, tgt_vocab)
