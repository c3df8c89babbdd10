"""A task's data as the app uses it: loaded once per process (cached on the used data fields and
the files' bytes), its vocabularies, its digest, and the checks that refuse bad data or data that
changed since a model was trained.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from attnstudy.config import RunSpec
from attnstudy.data.tasks import load_task, source_key
from attnstudy.data.types import DataError, Splits, splits_digest
from attnstudy.data.vocab import Vocab
from attnstudy.experiment import ExperimentConfig
from attnstudy.models.families import get_family
from attnstudy.models.io import LoadedModel
from attnstudy.runtime.notices import notice


@dataclass(frozen=True)
class TaskData:
    """A task's materialised data and what is derived from it.

    Attributes:
        splits: train/dev/test examples.
        src_vocab, tgt_vocab: vocabularies of the training split.
        digest: :func:`attnstudy.data.types.splits_digest` of the splits (part of the model key).
        unknown: per ``<split>/<source|target>`` of dev and test, the number of tokens outside the
            training vocabulary (they become ``<unk>``) and ``…_tokens`` the number of tokens.
    """

    splits: Splits
    src_vocab: Vocab
    tgt_vocab: Vocab
    digest: str
    unknown: dict[str, int]


UNKNOWN_WARN_RATE = 0.01
"""Share of a dev/test field's tokens outside the training vocabulary above which a notice is printed."""


@functools.lru_cache(maxsize=8)
def _task_data(source_key: str) -> TaskData:
    from attnstudy.config import data_config_json

    cfg = data_config_json(json.loads(source_key)["config"])
    splits = load_task(cfg)
    try:
        src_vocab = Vocab.build(ex.src for ex in splits.train)
        tgt_vocab = Vocab.build(ex.tgt for ex in splits.train)
    except ValueError as err:
        raise DataError(f"task {cfg.task!r}: {err}") from None
    unknown: dict[str, int] = {}
    for split in ("dev", "test"):
        for side, vocab in (("source", src_vocab), ("target", tgt_vocab)):
            tokens = [
                t for ex in getattr(splits, split) for t in (ex.src if side == "source" else ex.tgt)
            ]
            n_unk = vocab.count_unknown(tokens)
            unknown[f"{split}/{side}"], unknown[f"{split}/{side}_tokens"] = n_unk, len(tokens)
            if tokens and n_unk / len(tokens) > UNKNOWN_WARN_RATE:
                notice(
                    f"{split} split: {n_unk:,} of {len(tokens):,} {side} tokens "
                    f"({100 * n_unk / len(tokens):.1f} %) are not in the training vocabulary and become <unk>"
                )
    return TaskData(splits, src_vocab, tgt_vocab, splits_digest(splits), unknown)


def task_data(spec: RunSpec) -> TaskData:
    """The task's data for ``spec``, cached in-process on the used data fields and (for TSV) the
    SHA-256 of the files' bytes, so a file replaced in place is read again.

    Raises:
        DataError: a data problem (file, line and what to do).
    """
    return _task_data(source_key(spec.data))


def load_data(spec: RunSpec) -> tuple[Splits, Vocab, Vocab]:
    """The task's splits and the vocabularies built from its training split (see :func:`task_data`)."""
    d = task_data(spec)
    return d.splits, d.src_vocab, d.tgt_vocab


def check_data(cfg: ExperimentConfig) -> None:
    """Load every model's data before anything touches the store, so bad data changes nothing.

    Raises:
        DataError: a missing or malformed data file, an empty split, …
    """
    for spec in cfg.runs():
        family = get_family(spec.model.architecture)
        if family.check is not None:  # a pretrained folder, and its optional extra
            family.check(spec)
        splits, _, _ = load_data(spec)
        for name in ("train", "dev", "test"):
            if not getattr(splits, name):
                raise DataError(
                    f"{spec.name}: the {name} split is empty; check the data sizes and files"
                )


def checked_task_data(loaded: LoadedModel, trained_digest: str | None, where: str) -> TaskData:
    """The data of a stored model's task, refused if it is not the data the model was trained on.

    Args:
        loaded: the model (its stored config names the data).
        trained_digest: the data digest recorded when it was trained (None for older runs, which
            are checked through their vocabularies only).
        where: the model's URI, for the message.

    Raises:
        DataError: the data changed since training (another digest, or other vocabularies).
    """
    data = task_data(loaded.spec)
    pretrained = loaded.spec.model.pretrained  # its vocabulary is its tokenizer's
    changed = (trained_digest is not None and trained_digest != data.digest) or (
        not pretrained
        and (data.src_vocab != loaded.src_vocab or data.tgt_vocab != loaded.tgt_vocab)
    )
    if changed:
        raise DataError(
            f"{where}: the data of task {loaded.spec.data.task!r} changed since this model was trained "
            f"(data digest {data.digest[:12]}, trained on {str(trained_digest)[:12]}); its test examples would "
            "not be the ones it was evaluated on: restore the data or train again"
        )
    return data
