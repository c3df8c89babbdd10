"""One ablation on one prepared batch, Captum-style: ``ablate(model, batch, "permutation", n=100)``
returns an :class:`AblationResult` whose table carries its own provenance (inseq's ``info``): the
ablation, its parameters, the seed, the prefix, the attnstudy version and the git commit — also
inside the Parquet file it is saved to, so a table read back later still says how it was made.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from attnstudy import __version__
from attnstudy.runtime.paths import git_commit

from .batch import AblationContext, PreparedBatch
from .catalogue import get_ablation

METADATA_KEY = b"attnstudy"
"""The Parquet schema-metadata key holding :attr:`AblationResult.info` as JSON."""


@dataclass
class AblationResult:
    """A per-step (or per-example) table and how it was made.

    Attributes:
        table: one row per real decoder step (``example_id``, ``step``, ``layer`` …), or per
            example for an ablation whose unit is the example.
        info: ``ablation``, ``params``, ``seed``, ``rng``, ``chunk_rows``, ``prefix``, ``layer``,
            ``version`` and ``commit``.
    """

    table: pd.DataFrame
    info: dict[str, Any] = field(default_factory=dict)

    def to_parquet(self, path: str | Path) -> Path:
        """Write the table with :attr:`info` in the file's schema metadata."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        t = pa.Table.from_pandas(self.table, preserve_index=False)
        meta = dict(t.schema.metadata or {}) | {METADATA_KEY: json.dumps(self.info).encode()}
        pq.write_table(t.replace_schema_metadata(meta), path)
        return Path(path)

    @classmethod
    def read_parquet(cls, path: str | Path) -> AblationResult:
        """Read a table written by :meth:`to_parquet` (or by the suite), with its provenance."""
        import pyarrow.parquet as pq

        t = pq.read_table(path)
        raw = (t.schema.metadata or {}).get(METADATA_KEY)
        return cls(t.to_pandas(), json.loads(raw) if raw else {})


def provenance(
    name: str, params: Any, ctx: AblationContext, prefix: str, layer: int = 0
) -> dict[str, Any]:
    """The ``info`` of a result: what made it."""
    return {
        "ablation": name,
        "params": params.model_dump(mode="json"),
        "seed": ctx.seed,
        "rng": ctx.rng,
        "chunk_rows": ctx.chunk_rows,
        "prefix": prefix,
        "layer": layer,
        "version": __version__,
        "commit": git_commit(),
    }


def ablate(
    model,
    batch: PreparedBatch,
    name: str,
    seed: int = 0,
    chunk_rows: int = 4096,
    *,
    rng: str = "counter-1",
    **params: Any,
) -> AblationResult:
    """Run one catalogue ablation on one prepared batch.

    Args:
        model: a model satisfying the capabilities the ablation requires
            (:mod:`attnstudy.analysis.contract`).
        batch: from :func:`attnstudy.analysis.batch.prepare_batches` (its prefix and layer are
            recorded).
        name: the ablation (:func:`attnstudy.analysis.catalogue.list_ablations`).
        seed, chunk_rows: the run context.
        rng: the random streams' scheme, ``"counter-1"`` (the default) or ``"legacy"`` (the
            runs stored before ``ablation.rng`` existed; docs/design.md §4).
        **params: the ablation's own parameters (e.g. ``n=100`` for permutation).

    Returns:
        :class:`AblationResult`.

    Raises:
        UnknownAblationError: an unknown name. pydantic.ValidationError: invalid parameters.
        ValueError: the model lacks a capability the ablation requires.
    """
    from .contract import capabilities

    spec = get_ablation(name)
    missing = [c for c in spec.requires if c not in capabilities(model)]
    if missing:
        raise ValueError(f"ablation {name!r} needs {', '.join(missing)}, which the model lacks")
    p = spec.params(**params)
    ctx = AblationContext(seed=seed, chunk_rows=chunk_rows, rng=rng)
    table = spec.function()(model, batch, p, ctx)
    return AblationResult(
        table, provenance(name, p, ctx, batch.prefix, getattr(batch.trace, "layer", 0))
    )
