"""Per-example summaries of a suite's tidy tables, and the choice of examples to show.

Pure pandas (no torch): the example browser lists every analysed example with the per-example
columns the catalogue's entries declare (:func:`attnstudy.analysis.catalogue.example_columns`),
the report picks its heatmap examples with :func:`pick_shown`, and both say which criterion they
use.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import catalogue

SHOW_CRITERION = "tau_attn_loo"
"""What orders examples for the report's heatmaps: the example's mean Kendall τ between attention
and leave-one-out importance (its steps' mean), best = highest agreement."""


def analysis_rows(steps: pd.DataFrame, analysis_prefix: str | None = None) -> pd.DataFrame:
    """The rows of the analysis prefix (the suite also holds reference-prefix rows for alignment)."""
    if steps.empty or "prefix" not in steps.columns:
        return steps
    prefix = analysis_prefix or (
        "greedy" if (steps["prefix"] == "greedy").any() else steps["prefix"].iloc[0]
    )
    return steps[steps["prefix"] == prefix]


def per_example_summary(
    steps: pd.DataFrame,
    examples: pd.DataFrame | None = None,
    analysis_prefix: str | None = None,
) -> pd.DataFrame:
    """One row per analysed example (and unit): its decoder steps and the per-example columns the
    catalogue declares (:func:`attnstudy.analysis.catalogue.example_columns`) that the tables
    hold.

    Args:
        steps: a suite's per-step table (``example_id``, ``prefix``, ``step``, ``layer`` and the
            ablation columns); a step ablation's columns are read on the analysis prefix's rows,
            or on the reference's for an ablation with the reference prefix (alignment).
        examples: the suite's per-example table (the per-example ablations' columns), optional.
        analysis_prefix: ``greedy`` or ``reference`` (default: greedy if present).

    Returns:
        Columns ``example_id``, ``layer``, ``head`` (when the table has it), ``n_steps``
        (analysis-prefix steps, ``<eos>`` included), then each listed
        :class:`~attnstudy.analysis.example_spec.ExampleColumn` whose columns are there, under
        its ``key``, in the catalogue's order: a mean over the example's rows where defined, a
        ratio of its sums (NaN where the denominator sums to 0, e.g. AER without gold links), or
        a per-example ablation's value; NaN where the example has none.
    """
    if steps is None or steps.empty:
        return pd.DataFrame(columns=["example_id", "layer", "n_steps"])
    steps = steps if "layer" in steps.columns else steps.assign(layer=0)
    # one row per analysed unit: a layer (all heads jointly, head −1) or one head of it
    keys = ["example_id", "layer"] + (["head"] if "head" in steps.columns else [])
    rows = analysis_rows(steps, analysis_prefix)
    reference = (
        steps[steps["prefix"] == "reference"] if "prefix" in steps.columns else steps.iloc[:0]
    )
    out = rows.groupby(keys, sort=False).size().rename("n_steps").reset_index()
    for spec, col in catalogue.example_columns():
        if not col.listed:
            continue
        if spec.unit == "example":
            if examples is None or not len(examples) or col.column not in examples:
                continue
            on = ["example_id"] + [k for k in ("layer", "head") if k in examples and k in out]
            values = examples[on].assign(**{col.key: examples[col.column].astype(float)})
            out = out.merge(values, on=on, how="left", validate="many_to_one")
            continue
        source = reference if spec.prefix == "reference" else rows
        if not len(source) or not set(col.columns) <= set(source.columns):
            continue
        g = source.groupby(keys, sort=False)
        if col.column is not None:
            value = g[col.column].agg(lambda s: s.astype(float).mean())
        else:
            num = sum(g[c].sum() for c in col.num)
            den = sum(g[c].sum() for c in col.den)
            value = (num / den.where(den > 0)).astype(float)
            value = 1.0 - value if col.complement else value
        out = out.merge(value.rename(col.key).reset_index(), on=keys, how="left")
    return out


def pick_shown(summary: pd.DataFrame, n: int = 3, criterion: str = SHOW_CRITERION) -> list[dict]:
    """The examples a report shows: best, median and worst by ``criterion`` (higher = better).

    Falls back to the number of steps (longest, median, shortest) when no example defines the
    criterion (a model without attention or without the importance ablation).

    Returns:
        Up to ``n`` dicts ``{"example_id", "rank": "best"|"median"|"worst", "criterion",
        "value"}``, distinct examples, in that order.
    """
    if summary.empty:
        return []
    crit = criterion if criterion in summary and summary[criterion].notna().any() else "n_steps"
    # one row per example: the layer mean of the criterion
    per = summary.groupby("example_id", sort=False)[crit].mean().dropna()
    if per.empty:
        return []
    ordered = per.sort_values(ascending=False, kind="stable")
    picks = [("best", 0), ("median", len(ordered) // 2), ("worst", len(ordered) - 1)]
    out, seen = [], set()
    for rank, i in picks[:n]:
        ex = ordered.index[i]
        if ex in seen:
            continue
        seen.add(ex)
        out.append(
            {"example_id": ex, "rank": rank, "criterion": crit, "value": float(ordered.iloc[i])}
        )
    return out


def finite_or_none(value) -> float | None:
    """A JSON-ready number: None for NaN/inf/None."""
    if value is None:
        return None
    v = float(value)
    return v if np.isfinite(v) else None


def gold_mass_by_offset(
    records: list[dict], offsets: tuple[int, ...] = (-1, 0, 1)
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Attention mass on the gold links moved by ``k`` source positions, per example.

    For each target token t with possible gold links P_t (reference prefix, ``<eos>`` excluded),
    m_t(k) = Σ_{s ∈ P_t, 0 ≤ s+k < T_x} α_{t, s+k}; k = 0 is the gold mass of the alignment
    ablation. A model whose attention sits one position off (typical of a Bahdanau-flow decoder,
    whose query s_{t−1} precedes the emitted token) has m(+1) or m(−1) far above m(0).

    Args:
        records: from :func:`attnstudy.analysis.heatmaps.example_records` (those with ``gold``).
        offsets: the shifts k.

    Returns:
        k → (Σ_t m_t(k) per example, number of linked target tokens per example), arrays aligned
        on the records with gold links; empty without any.
    """
    sums = {k: [] for k in offsets}
    counts = []
    for rec in records:
        if not rec.get("gold") or "reference_attention" not in rec:
            continue
        att = np.array(
            [[np.nan if v is None else v for v in row] for row in rec["reference_attention"]],
            dtype=float,
        )
        n_src = att.shape[1]
        links: dict[int, set[int]] = {}
        for s, t, _ in rec["gold"]:
            links.setdefault(t, set()).add(s)
        rows = [t for t in links if t < att.shape[0] and rec["reference_rows"][t] != "<eos>"]
        counts.append(float(len(rows)))
        for k in offsets:
            sums[k].append(
                float(sum(att[t, s + k] for t in rows for s in links[t] if 0 <= s + k < n_src))
            )
    if not counts:
        return {}
    return {k: (np.array(v), np.array(counts)) for k, v in sums.items()}


# ----------------------------------------------------------------------------- from the file

CHUNK_EXAMPLES = 256
"""Examples whose per-step rows are read at once from a streamed step table (the memory of the
pages of an ablation run is that of this many examples' rows, whatever their number)."""
BATCH_ROWS = 4096
"""Rows of a step table's file decoded at a time when it is scanned."""


def _group_keys(columns) -> list[str]:
    return ["example_id", "layer"] + (["head"] if "head" in columns else [])


def _null_ints(parquet_file) -> set[str]:
    """The integer columns of a Parquet file that have a null somewhere (a whole-file read makes
    them float; a part without nulls would be int)."""
    import pyarrow as pa

    meta = parquet_file.metadata
    nulls: set[str] = set()
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            col = group.column(c)
            stats = col.statistics
            if stats is None or not stats.has_null_count or stats.null_count > 0:
                nulls.add(col.path_in_schema)
    schema = parquet_file.schema_arrow
    return {f.name for f in schema if pa.types.is_integer(f.type) and f.name in nulls}


def _to_pandas(table, parquet_file) -> pd.DataFrame:
    """``table.to_pandas()`` with the dtypes a read of the whole file gives (:func:`_null_ints`
    as float)."""
    import pyarrow as pa

    for name in _null_ints(parquet_file) & set(table.column_names):
        i = table.column_names.index(name)
        table = table.set_column(i, name, table.column(i).cast(pa.float64()))
    return table.to_pandas()


def steps_of_examples(path, example_ids, columns=None) -> pd.DataFrame:
    """The rows of a streamed per-step table (a Parquet file) whose ``example_id`` is one of
    ``example_ids``, in the file's order, with the dtypes a whole-file read gives. The file is
    decoded :data:`BATCH_ROWS` rows at a time and filtered as it is read: only those rows and one
    batch are ever held.

    Args:
        path: the suite's ``steps.parquet``.
        example_ids: the examples wanted.
        columns: the columns to read (default: all; ``example_id`` is always read).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    schema = source.schema_arrow.remove_metadata()
    if columns is not None:
        columns = list(dict.fromkeys(["example_id", *columns]))
        schema = pa.schema([schema.field(c) for c in columns])
    wanted = pa.array(list(dict.fromkeys(example_ids)), schema.field("example_id").type)
    kept = []
    for batch in source.iter_batches(batch_size=BATCH_ROWS, columns=columns):
        rows = batch.filter(pc.is_in(batch.column("example_id"), value_set=wanted))
        if rows.num_rows:
            kept.append(rows)
    return _to_pandas(pa.Table.from_batches(kept, schema=schema), source)


def per_example_summary_file(
    path,
    examples: pd.DataFrame | None = None,
    analysis_prefix: str | None = None,
    chunk_examples: int = CHUNK_EXAMPLES,
) -> pd.DataFrame:
    """:func:`per_example_summary` of a streamed per-step table (a Parquet file), read
    ``chunk_examples`` examples at a time (:func:`steps_of_examples`): the same frame — rows,
    order, columns, dtypes — as ``per_example_summary(pd.read_parquet(path), examples,
    analysis_prefix)``, with the memory of one chunk's rows instead of the whole table's.

    Raises:
        ValueError: ``chunk_examples`` < 1.
    """
    import pyarrow.parquet as pq

    if chunk_examples < 1:
        raise ValueError(f"chunk_examples must be at least 1, got {chunk_examples}")
    source = pq.ParquetFile(path)
    names = source.schema_arrow.names
    keys = [c for c in ("example_id", "prefix", "layer", "head") if c in names]
    group = _group_keys(names)
    # one pass over the key columns: the examples in order, and each prefix's groups in order of
    # first appearance (the order of per_example_summary's rows on the whole table)
    ids: dict = {}
    first: dict[str, dict[tuple, None]] = {}
    for batch in source.iter_batches(batch_size=BATCH_ROWS, columns=keys):
        frame = batch.to_pandas()
        frame = frame if "layer" in frame else frame.assign(layer=0)
        ids.update(dict.fromkeys(frame["example_id"]))
        prefixes = frame["prefix"] if "prefix" in frame else pd.Series("", index=frame.index)
        for prefix, rows in frame.groupby(prefixes, sort=False):
            seen = first.setdefault(prefix, {})
            seen.update(dict.fromkeys(rows[group].itertuples(index=False, name=None)))
    if not ids:
        return per_example_summary(pd.read_parquet(path), examples, analysis_prefix)
    if "prefix" in names:
        if analysis_prefix is None:  # as analysis_rows decides on the whole table
            analysis_prefix = "greedy" if "greedy" in first else next(iter(first))
        order = list(first.get(analysis_prefix, {}))
    else:
        order = list(first.get("", {}))
    ids = list(ids)
    parts = [
        per_example_summary(
            steps_of_examples(path, ids[i : i + chunk_examples]), examples, analysis_prefix
        )
        for i in range(0, len(ids), chunk_examples)
    ]
    out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    position = {g: k for k, g in enumerate(order)}
    rank = [position[g] for g in out[group].itertuples(index=False, name=None)]
    out = out.iloc[pd.Series(rank).argsort(kind="stable").to_numpy()]
    # and its columns: the keys and n_steps, then the listed columns in the catalogue's order
    listed = [c.key for _, c in catalogue.example_columns() if c.listed]
    cols = [*group, "n_steps", *[k for k in listed if k in out.columns]]
    return out[cols + [c for c in out.columns if c not in cols]].reset_index(drop=True)
