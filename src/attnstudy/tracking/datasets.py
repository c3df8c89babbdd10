"""The train/dev/test splits as MLflow datasets (``mlflow.data``): each model run lists the three
splits it was trained and evaluated on in the runs table's Datasets column, and each ablation run
the test examples it analysed; test metrics are linked to the test dataset and the logged model.

A split is logged by what it *is* (its digest: SHA-256 over ids, source, target, references and
links, the first 16 hex digits, as the data digest of the model key is made) and where it comes
from (source tags: the task, the package or file, the split salt); MLflow stores the schema and the
size, not the examples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pandas as pd
from mlflow.data import from_pandas
from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.entities import DatasetInput, InputTag

from ..data.types import Example
from .client import Tracker

CONTEXT_TAG = "mlflow.data.context"  # the runs table shows it beside the dataset (train/dev/test)
DIGEST_CHARS = 16  # MLflow keeps at most 36 characters of a digest


def split_digest(examples: Sequence[Example]) -> str:
    """SHA-256 over one split's examples (id, source, target, references, sure|possible links), the
    first :data:`DIGEST_CHARS` hex digits."""
    h = hashlib.sha256()
    unit, record = "\x1f", "\x1e"
    for ex in examples:
        links = "-"
        if ex.alignment is not None:
            links = (
                " ".join(f"{i}-{j}" for i, j in sorted(ex.alignment.sure))
                + "|"
                + " ".join(f"{i}-{j}" for i, j in sorted(ex.alignment.possible))
            )
        refs = "\x1d".join(unit.join(r) for r in ex.refs)
        h.update(
            unit.join((ex.id, unit.join(ex.src), unit.join(ex.tgt), refs, links)).encode()
            + record.encode()
        )
    return h.hexdigest()[:DIGEST_CHARS]


def split_frame(examples: Sequence[Example]) -> pd.DataFrame:
    """One row per example: ``id``, ``source``, ``target`` (space-joined tokens), ``links``
    (Pharaoh, possible links with ``p``; empty without gold)."""
    from ..data.alignment import format_pharaoh

    return pd.DataFrame(
        {
            "id": [ex.id for ex in examples],
            "source": [" ".join(ex.src) for ex in examples],
            "target": [" ".join(ex.tgt) for ex in examples],
            "links": [
                format_pharaoh(ex.alignment) if ex.alignment is not None else "" for ex in examples
            ],
        }
    )


def log_splits(
    tracker: Tracker,
    run_id: str,
    splits: dict[str, Sequence[Example]],
    name: str,
    source: dict[str, str],
) -> dict[str, tuple[str, str]]:
    """Log splits as datasets of a run (the Datasets column and the run page list them).

    Args:
        run_id: the run.
        splits: context (``train``, ``dev``, ``test``, ``test analysed``…) → its examples.
        name: the dataset name stem, e.g. ``g2p``: datasets are named ``g2p/train`` …
        source: where the data comes from (task, package or file, split salt…), shown as the
            dataset's source.

    Returns:
        context → (dataset name, digest), to link metrics to a dataset
        (:meth:`attnstudy.tracking.Tracker.log_metrics`).
    """
    inputs, out = [], {}
    for context, examples in splits.items():
        digest = split_digest(examples)
        ds_name = f"{name}/{context.split()[0]}"
        ds = from_pandas(
            split_frame(examples),
            source=CodeDatasetSource(dict(source) | {"split": context, "n": str(len(examples))}),
            name=ds_name,
            digest=digest,
        )
        inputs.append(DatasetInput(ds._to_mlflow_entity(), [InputTag(CONTEXT_TAG, context)]))
        out[context] = (ds_name, digest)
    # two runs logging the same split at once (parallel workers) race in MLflow's
    # look-up-then-insert of the dataset; the retry finds the winner's and only links it
    tracker._call_racing(tracker.client.log_inputs, run_id, inputs)
    return out
