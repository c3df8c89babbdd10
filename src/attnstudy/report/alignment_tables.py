"""The report's tables of attention's alignment beside a statistical aligner's, and beside the
output change (the reference aligner's runs themselves: :mod:`attnstudy.study.reference_alignment`).

* :func:`side_by_side_rows`: the reference aligner's AER, precision and recall and, per model
  (and per layer of a multi-layer model), attention's ``aer``, ``aer_linked``, ``aer_shift``,
  precision and recall, and each attribution method's argmax (``attribution_alignment``).
* :func:`flip_split_rows`: does intervening on attention change the output where attention
  aligns (its argmax on a gold link) and where it does not — the flip rates of ``permutation``,
  ``uniform`` and ``erase_max`` on the same decoder steps, split by ``alignment_argmax_on_gold``,
  from the per-step tables; defined only where the battery ran on the reference prefix (the one
  alignment uses), so both sit on the same steps.

Every number is ``value [low, high]``: a 95 % percentile bootstrap over examples.
"""

from __future__ import annotations

from attnstudy.verdict.findings import Estimate

from ..analysis.attribution_params import METHOD_LABELS
from ..data.tasks import get_task
from .tables import reason  # why a cell has no number: failed, not run, skipped …

ATTENTION_KEYS = {
    "AER": "ablation/alignment/aer",
    "AER, linked targets": "ablation/alignment/aer_linked",
    "AER, next step": "ablation/alignment/aer_shift",
    "precision": "ablation/alignment/precision",
    "recall": "ablation/alignment/recall",
}
"""The side-by-side table's columns and attention's metrics behind them."""
FLIPS = {
    "permutation flip rate": "permutation_flip_rate",
    "uniform flip rate": "uniform_flip",
    "erase-max flip rate": "erase_max_flip",
}
"""The split table's output-change columns and their per-step columns."""


def _text(value: float, low: float, high: float) -> str:
    return Estimate(value, low, high).fmt(3)


def _cell(facts, key: str, why: str) -> str:
    est = facts.stats.get(key) if facts is not None else None
    return est.fmt(3) if est is not None else why


def side_by_side_rows(data, facts: dict, layers: dict) -> list[dict[str, str]]:
    """Attention's alignment beside the reference aligner's and each attribution method's argmax,
    as rows of cell text: ``model``, ``layer``, ``aligner``, ``examples`` and the columns of
    :data:`ATTENTION_KEYS` (a column an aligner has no number for says why).

    Args:
        data: the study (:class:`attnstudy.report.store.StudyData`).
        facts, layers: model run id → :class:`attnstudy.verdict.findings.ModelFacts` (the model's
        primary
            unit) and → its per-layer facts with the layer mean (the report's).
    """
    rows = []
    for ref in data.references:
        s = ref["scores"]
        cells = {"AER": _text(*s["aer"]), "precision": _text(*s["precision"])}
        cells["recall"] = _text(*s["recall"])
        rows.append(
            {
                "model": "–",
                "layer": "–",
                "aligner": ref["aligner"],
                "examples": f"{ref['counts']['test_verses']:,}",
                **{label: cells.get(label, "not an argmax aligner") for label in ATTENTION_KEYS},
            }
        )
    for e in data.entries:
        aligned = "alignment" in e.ablations_run
        if e.model_run_id not in facts or not (
            aligned or "attribution_alignment" in e.ablations_run
        ):
            continue
        f = facts[e.model_run_id]
        units = [(f, "")] + [
            (lf, lf.name.split(" · ", 1)[1]) for lf in layers.get(e.model_run_id, [])
        ]
        for ff, layer in units:
            base = {"model": e.variant, "layer": layer or "analysed"}
            n = str(ff.n_examples) if ff.n_examples else reason(e, ATTENTION_KEYS["AER"])
            if aligned:
                rows.append(
                    base
                    | {"aligner": "attention argmax", "examples": n}
                    | {label: _cell(ff, k, reason(e, k)) for label, k in ATTENTION_KEYS.items()}
                )
            if "attribution_alignment" not in e.ablations_run or layer:
                continue  # attribution does not depend on the analysed layer: its rows once
            # without the alignment ablation, attention's argmax comes from attribution_alignment,
            # which scores it by the same code (its AER only: no linked-target or next-step AER)
            labels = METHOD_LABELS if aligned else {"attention": "attention", **METHOD_LABELS}
            for m, method in labels.items():  # the methods read as alignments
                keys = {
                    "AER": f"ablation/attribution_alignment/aer_{m}",
                    "precision": f"ablation/attribution_alignment/precision_{m}",
                    "recall": f"ablation/attribution_alignment/recall_{m}",
                }
                if not any(k in (ff.stats or {}) for k in keys.values()):
                    continue
                rows.append(
                    base
                    | {"aligner": f"{method} argmax", "examples": n}
                    | {
                        label: _cell(ff, keys[label], "n/a")
                        if label in keys
                        else (
                            reason(e, ATTENTION_KEYS[label])
                            if m == "attention"
                            else "attention only"
                        )
                        for label in ATTENTION_KEYS
                    }
                )
    return rows


def sure_only(data) -> bool:
    """Whether every task of the study has gold with sure links only (AER = 1 − F1)."""
    tasks = {e.task for e in data.entries}
    return bool(tasks) and all(get_task(t).gold_sure_only for t in tasks)


SURE_ONLY_NOTE = (
    "The gold has sure links only (no possible links): AER = 1 − F1 of precision and recall "
    "(Och & Ney 2003, eq. 7 with S = P)."
)


def with_sure_only_note(data, tables: list[dict]) -> list[dict]:
    """The report's tables, the alignment table (``aligns``) noting :data:`SURE_ONLY_NOTE` where
    every task's gold has sure links only (:func:`sure_only`)."""
    if sure_only(data):
        for t in tables:
            if t.get("key") == "aligns" and SURE_ONLY_NOTE not in t["notes"]:
                t["notes"] = [*t["notes"], SURE_ONLY_NOTE]
    return tables


def side_by_side_table(data, facts: dict, layers: dict) -> dict | None:
    """:func:`side_by_side_rows` as a report table: None when no reference aligner ran (its
    attention rows would repeat the alignment table, and the attribution rows the attribution
    alignment table) or no model ran ``alignment``."""
    if not data.references:
        return None
    rows = side_by_side_rows(data, facts, layers)
    if not any(r["aligner"] == "attention argmax" for r in rows):
        return None
    intro = (
        "One hard link per reference target word (teacher forcing on the reference): attention's "
        "argmax and each attribution method's argmax, against the gold links of the same test "
        "examples; 95 % intervals over examples. Layer 'analysed': the model's summary unit "
        "(its top analysed layer); a multi-layer model adds a row per layer and the layer mean."
    )
    for ref in data.references:
        intro += f" {ref['aligner']}: {ref['how']}"
    if sure_only(data):
        intro += " " + SURE_ONLY_NOTE
    header = list(rows[0])
    return {
        "title": "Attention's alignment beside a statistical aligner's",
        "intro": intro,
        "header": header,
        "rows": [[r[h] for h in header] for r in rows],
        "key": "alignment_side_by_side",
    }


def _split_rows(steps, layer_label: str, variant: str, cfg) -> list[dict[str, str]]:
    from ..analysis.suite import ratio_ci

    rows = []
    for aligned, label in ((1.0, "on a gold link"), (0.0, "off the gold links")):
        part = steps[steps["alignment_argmax_on_gold"] == aligned]
        row = {
            "model": variant,
            "layer": layer_label,
            "attention argmax": label,
            "steps": f"{len(part):,}",
            "examples": f"{part['example_id'].nunique():,}",
        }
        for name, col in FLIPS.items():
            if col not in part.columns:
                row[name] = "not run"
                continue
            ok = part[part[col].notna()]
            by = ok.groupby("example_id")[col]
            r = ratio_ci(by.sum().to_numpy(), by.count().to_numpy(), cfg)
            row[name] = "no steps" if r is None else _text(*r)
        rows.append(row)
    return rows


def flip_split_rows(data) -> list[dict[str, str]]:
    """Does intervening on attention flip the output where attention aligns? Per model (and
    layer), the flip rates of :data:`FLIPS` on the steps whose attention argmax is on a gold link
    and on those where it is not (target words with a gold link only; a subword target's word
    is counted on its first subword's step), from the per-step table; a model whose battery ran
    on another prefix than the reference has no rows (the table's intro says so)."""
    from ..analysis.catalogue import AblationConfig

    rows = []
    for e in data.entries:
        st = e.steps
        if "alignment" not in e.ablations_run or st is None or st.empty:
            continue
        if "alignment_argmax_on_gold" not in st.columns:
            continue
        if e.analysis_prefix != "reference":
            continue  # the split needs alignment's steps: the reference prefix (the intro says so)
        p = e.ablation_params
        cfg = AblationConfig(
            bootstrap_resamples=int(p.get("ablation.bootstrap_resamples", 1000)),
            seed=int(p.get("ablation.seed", 0)),
        )
        st = st[st["prefix"] == "reference"] if "prefix" in st.columns else st
        if "head" in st.columns:
            st = st[st["head"] == -1]
        layered = "layer" in st.columns and st["layer"].nunique() > 1
        layers = sorted(st["layer"].unique()) if "layer" in st.columns else [None]
        for layer in layers:
            part = st if layer is None else st[st["layer"] == layer]
            label = f"layer {int(layer) + 1}" if layered and layer >= 0 else "analysed"
            rows += _split_rows(part, label, e.variant, cfg)
    return rows


def stored_examples(tracker):
    """``examples_of`` of :func:`breakdown_rows` from the store: a model entry's run config
    (``Artifact.CONFIG``), its data section and its task's test examples (loaded once per data
    section, :func:`attnstudy.study.task_data.task_data`); None for a run without a stored
    config."""
    import tempfile
    from pathlib import Path

    from attnstudy.study.task_data import task_data

    from ..config.run import load_run_spec
    from ..tracking import Artifact

    def examples_of(entry):
        if not tracker.has_artifact(entry.model_run_id, Artifact.CONFIG):
            return None
        with tempfile.TemporaryDirectory() as tmp:
            path = tracker.download_artifact(entry.model_run_id, Artifact.CONFIG, tmp)
            spec = load_run_spec(Path(path).read_text("utf-8"))
        return spec.data, task_data(spec).splits.test

    return examples_of


def breakdown_rows(data, examples_of) -> dict[str, list[dict[str, str]]]:
    """Attention's alignment by the source word's tag and by link shape
    (:func:`attnstudy.data.breakdowns.attention_breakdowns`), per model and layer (head mean), for
    every model of a task with word tags (:attr:`attnstudy.data.tasks.TaskSpec.word_tags`) whose
    battery ran ``alignment``: AER, precision, recall and gold mass per tag group, recall and
    gold mass per link shape; 95 % intervals over examples (the battery's resamples and seed).

    Args:
        data: the study (:class:`attnstudy.report.store.StudyData`).
        examples_of: model entry → ``(data config, test examples)`` of its model run, or None
            where they cannot be had (the entry is left out).

    Returns:
        ``{"-alignment-tags": rows, "-alignment-shape": rows}`` (cell text; empty lists where no
        model qualifies): the result tables ``report --results`` writes.
    """
    from ..analysis.catalogue import AblationConfig
    from ..data.breakdowns import attention_breakdowns
    from ..data.tasks import TASKS

    out: dict[str, list[dict[str, str]]] = {"-alignment-tags": [], "-alignment-shape": []}
    for e in data.entries:
        task = TASKS.get(e.task)
        st = e.steps
        if task is None or task.word_tags is None or "alignment" not in e.ablations_run:
            continue
        if st is None or st.empty or "alignment_n_hyp" not in st.columns:
            continue
        loaded = examples_of(e)
        if loaded is None:
            continue
        cfg, examples = loaded
        p = e.ablation_params
        boot = AblationConfig(
            bootstrap_resamples=int(p.get("ablation.bootstrap_resamples", 1000)),
            seed=int(p.get("ablation.seed", 0)),
        )
        st = st[st["prefix"] == "reference"] if "prefix" in st.columns else st
        if "head" in st.columns:
            st = st[st["head"] == -1]
        st = st[st["alignment_n_hyp"].notna()]
        layered = "layer" in st.columns and st["layer"].nunique() > 1
        layers = sorted(st["layer"].unique()) if "layer" in st.columns else [None]
        for layer in layers:
            part = st if layer is None else st[st["layer"] == layer]
            label = f"layer {int(layer) + 1}" if layered and layer >= 0 else "analysed"
            by_tag, by_shape = attention_breakdowns(
                part,
                examples,
                e.task,
                cfg,
                label="attention argmax",
                resamples=boot.bootstrap_resamples,
                seed=boot.seed,
            )
            lead = {"model": e.variant, "layer": label}
            out["-alignment-tags"] += [lead | r for r in by_tag]
            out["-alignment-shape"] += [lead | r for r in by_shape]
    return out


def flip_split_table(data) -> dict | None:
    """:func:`flip_split_rows` as a report table (None without rows)."""
    rows = flip_split_rows(data)
    if not rows:
        return None
    header = list(rows[0])
    return {
        "title": "Does intervening on attention change the output where it aligns?",
        "intro": "The decoder steps of reference target words with a gold link, split by whether "
        "attention's argmax is on a gold link; on each part the share of steps whose predicted "
        "token flips under a random permutation of the attention row (mean over permutations), "
        "uniform attention and the erasure of its maximum; 95 % intervals over examples. Only "
        "models whose battery ran on the reference prefix (teacher forcing) have rows: the split "
        "needs the steps of the reference target words.",
        "header": header,
        "rows": [[r[h] for h in header] for r in rows],
        "key": "alignment_flips",
    }
