"""The example browser: one static HTML page per ablation run listing every analysed example
(source, reference, prediction, correct?, its per-example scores), sortable and filterable, each
opening its heatmaps — attention (per layer and head), the adversarial alternative, gradient ×
input, leave-one-out, the attention over the reference with its gold links — and its per-step
numbers. Heatmaps are drawn in the page (SVG) from JSON embedded in it: no external asset, no
network, so it works from disk and inside MLflow's sandboxed artifact frame, and 200 examples
stay a few hundred kilobytes.

Examples of subword tokens (``nt-greek-english``, a pretrained model's tokenizer) open on
*words*: the list gives the texts as words, the attention maps are between source and output
words (:func:`attnstudy.analysis.heatmaps.word_view`; on the reference with the gold word links,
:func:`~attnstudy.analysis.heatmaps.reference_word_view`, what the alignment ablation scores), and
the alignment numbers are per target word; a switch shows the subword tokens the model reads and
writes (and the maps that exist per subword step only: adversarial attention, gradient, LOO).
"""

from __future__ import annotations

import math

import pandas as pd

from .analysis.heatmaps import word_text
from .analysis.per_example import LABELS, analysis_rows, per_example_summary
from .templating import render

STEP_COLUMNS = {
    "permutation_flip_rate": "perm. flip",
    "permutation_median_tvd": "perm. TVD",
    "uniform_flip": "uniform flip",
    "uniform_tvd": "uniform TVD",
    "erase_max_flip": "erase-max flip",
    "adversarial_max_jsd": "adv. JSD",
    "importance_tau_attn_grad": "τ attn–grad",
    "importance_tau_attn_loo": "τ attn–LOO",
    "importance_tau_grad_loo": "τ grad–LOO",
}
"""Per-step columns of the analysis prefix shown in an example's step table."""
REFERENCE_COLUMNS = {
    "alignment_gold_mass": "gold mass",
    "alignment_argmax_on_gold": "argmax on gold",
}
"""Per-step columns of the reference prefix (alignment)."""
UNDEFINED = {
    "perm_flip": "no step to permute: a source of one position, or only identity permutations",
    "perm_tvd": "no step to permute: a source of one position, or only identity permutations",
    "erase_max_flip": "no step to erase: a source of one position",
    "adv_jsd": "no adversarial distribution within ε of the output at any step (or one source "
    "position)",
    "adv_found": "not searched: a source of one position",
    "tau_attn_grad": "τ undefined at every step: fewer than 2 source positions or a constant vector",
    "tau_attn_loo": "τ undefined at every step: fewer than 2 source positions or a constant vector",
    "tau_grad_loo": "τ undefined at every step: fewer than 2 source positions or a constant vector",
    "gold_mass": "no gold link on any target token of this example",
    "aer": "no gold link on any target token of this example",
}
"""Why a per-example value can be missing (shown as "n/a" with this reason on hover): a value of
a column the run has is missing only where the statistic is undefined for that example."""
NOT_A_VALUE = "n/a"


def _num(v):
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return round(f, 4) if math.isfinite(f) else None


def _unit_rows(rows: pd.DataFrame, rec: dict) -> pd.DataFrame:
    """The rows of the unit (layer, head) a record was taken from."""
    if not len(rows):
        return rows
    if "layer" in rows.columns:
        rows = rows[rows["layer"] == rec.get("layer", 0)]
    if "head" in rows.columns:
        rows = rows[rows["head"] == rec.get("head", -1)]
    return rows


def _word_values(ref_rows: pd.DataFrame, n_words: int) -> dict[str, list]:
    """Per target word, the alignment numbers of the reference prefix: the ablation writes a
    word's values on the row of its first subword (``alignment_word``), the others NaN."""
    first = ref_rows[ref_rows["alignment_word"] >= 0].drop_duplicates("alignment_word")
    at = first.set_index("alignment_word")
    return {
        label: [_num(at[c].get(w)) for w in range(n_words)]
        for c, label in REFERENCE_COLUMNS.items()
        if c in at.columns
    }


def browser_data(
    records: list[dict],
    steps: pd.DataFrame | None,
    *,
    examples: pd.DataFrame | None = None,
    predictions: pd.DataFrame | None = None,
    meta: dict | None = None,
) -> dict:
    """Everything the page shows, JSON-ready.

    Args:
        records: :func:`attnstudy.analysis.heatmaps.example_records` of the analysed examples.
        steps: the suite's per-step table (``ablations/steps.parquet``).
        examples: the suite's per-example table (global permutation), optional.
        predictions: the model's test predictions (``example_id``, ``hypothesis``, ``correct``),
            optional: the prediction column falls back to the records' greedy prefix.
        meta: shown in the header: ``title``, ``run_id``, ``prefix``, ``eps``, ``n_permutations``…

    Returns:
        ``{"meta", "columns", "examples", "records"}``: the list (one row per example and
        layer), its column labels, and per example id its matrices and per-step numbers
        (``step_values``; ``reference_values`` per reference token and, for subword tokens,
        ``reference_word_values`` per target word). For subword tokens the list's source,
        reference and prediction are words (:func:`attnstudy.analysis.heatmaps.word_text`).
    """
    meta = {
        "title": "",
        "run_id": None,
        "model_run_id": None,
        "prefix": "greedy",
        "eps": None,
        "n_permutations": None,
        "n_examples": len(records),
    } | dict(meta or {})
    steps = steps if steps is not None else pd.DataFrame()
    summary = per_example_summary(steps, examples, meta.get("prefix"))
    by_id = {r["id"]: r for r in records}
    preds = {}
    if predictions is not None and len(predictions):
        key = "example_id" if "example_id" in predictions else "id"
        for _, p in predictions.iterrows():
            preds[p[key]] = (p.get("hypothesis"), bool(p.get("correct")))
    cols = [c for c in LABELS if c in summary.columns]
    rows = []
    ids = list(dict.fromkeys(summary["example_id"])) if len(summary) else list(by_id)
    for eid in ids:
        rec = by_id.get(eid, {})
        hyp, ok = preds.get(eid, (None, None))
        if hyp is None and rec:
            toks = [t for t in rec.get("rows", []) if t != "<eos>"]
            hyp = " ".join(toks) if rec.get("prefix") == "greedy" else None
            ok = toks == rec.get("reference") if hyp is not None else None
        # subword tokens: the texts as words (the subword view shows the tokens)
        text = word_text if "words" in rec else " ".join
        if "words" in rec and isinstance(hyp, str):
            hyp = word_text(hyp.split(" ")) if hyp else hyp
        sub = summary[summary["example_id"] == eid] if len(summary) else pd.DataFrame()
        for _, s in sub.iterrows() if len(sub) else [(None, pd.Series(dtype=float))]:
            rows.append(
                {
                    "id": eid,
                    "layer": int(s["layer"]) if "layer" in s and pd.notna(s.get("layer")) else 0,
                    "head": int(s["head"]) if "head" in s and pd.notna(s.get("head")) else -1,
                    "source": text(rec.get("source", [])),
                    "reference": text(rec.get("reference", [])),
                    "prediction": hyp,
                    "correct": ok,
                    **{c: _num(s.get(c)) for c in cols},
                    "has_matrices": bool(rec),
                }
            )
    detail = {}
    greedy = analysis_rows(steps, meta.get("prefix")) if len(steps) else steps
    ref = steps[steps["prefix"] == "reference"] if "prefix" in steps.columns else steps.iloc[:0]
    for eid, rec in by_id.items():
        d = dict(rec)
        layer_rows = greedy[greedy["example_id"] == eid] if len(greedy) else greedy
        layer_rows = _unit_rows(layer_rows, rec)
        at = layer_rows.set_index("step") if len(layer_rows) else None
        d["step_values"] = {
            label: [
                _num(at[c].get(t)) if at is not None and c in at.columns else None
                for t in rec.get("steps", [])
            ]
            for c, label in STEP_COLUMNS.items()
            if c in steps.columns
        }
        ref_rows = ref[ref["example_id"] == eid] if len(ref) else ref
        ref_rows = _unit_rows(ref_rows, rec)
        if len(ref_rows) and "reference_rows" in rec:
            r = ref_rows.sort_values("step")
            d["reference_values"] = {
                label: [_num(v) for v in r[c]] for c, label in REFERENCE_COLUMNS.items() if c in r
            }
            if "reference_words" in rec and "alignment_word" in r:
                d["reference_word_values"] = _word_values(r, len(rec["reference_words"]["rows"]))
        detail[eid] = d
    return {
        "meta": meta,
        "columns": [
            {"key": c, "label": LABELS[c], "undefined": UNDEFINED.get(c, "undefined here")}
            for c in cols
        ],
        "examples": rows,
        "records": detail,
    }


def browser_html(data: dict) -> str:
    """The page (``templates/examples.html.j2``) for :func:`browser_data`'s output."""
    return render("examples.html.j2", data=data, meta=data["meta"])
