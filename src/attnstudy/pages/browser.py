"""The example browser: one static HTML page per ablation run listing every analysed example
(source, reference, prediction, the task's per-example outcome, its per-example scores), sortable
and filterable, each opening its heatmaps — attention (per layer; per head where the run analysed
heads), the adversarial alternative, gradient × input, leave-one-out, the attention over the
reference with its gold links — and its per-step numbers. Heatmaps are drawn in the page (SVG)
from data embedded in it: no external asset, no network, so it works from disk and inside
MLflow's sandboxed artifact frame.

**Size.** The maps are most of the bytes, so they travel compactly (:func:`encode_map`): each
map is one base64 string of its values in thousandths (the records' own rounding,
:data:`attnstudy.analysis.heatmaps.DIGITS` decimals) as variable-length integers, about 1.4
bytes a value against 6 as JSON numbers, decoded back to exactly the recorded values (a hover
shows the same number the record holds). A map equal to another one of the record (the
attention on the reference when the analysed prefix *is* the reference) travels once; the maps
of single heads travel only where the run analysed heads (``ablation.heads = "each"``; the run's
``ablations/heatmaps.json`` keeps them all). The per-step and per-word numbers of the tables stay
JSON numbers. The page reads its data as it loads and draws the list 100 rows at a time, more
as the list is scrolled (laying out 900 rows took seconds); an example's maps are decoded and
drawn only when it is opened. The Greek–English
per-layer run (300 verses × 3 Transformer layers of 4 heads, subword and word maps) makes a page
of 4.3 MB (41 MB before); 200 short copy examples about 220 KB.

**Outcome.** The list's outcome column is the task's first per-example metric in the task
registry (:data:`attnstudy.data.tasks.TASKS`): "correct?" (exact match) with an "only incorrect"
filter where the task reports exact match, else the example's token error rate (edit distance
over reference tokens) — for a translation task (``nt-greek-english``) exact match of a whole
verse is meaningless and not reported.

**Numbering.** Layers and heads are shown from 1, as the report numbers layers; the data (the
JSON, ``examples.csv``, the metric keys) keep the stored 0-based index (−1: all at once).

Examples of subword tokens (``nt-greek-english``, a pretrained model's tokenizer) open on
*words*: the list gives the texts as words, the attention maps are between source and output
words (:func:`attnstudy.analysis.heatmaps.word_view`; on the reference with the gold word links,
:func:`~attnstudy.analysis.heatmaps.reference_word_view`, what the alignment ablation scores), and
the alignment numbers are per target word; a switch shows the subword tokens the model reads and
writes (and the maps that exist per subword step only: adversarial attention, gradient, LOO).
"""

from __future__ import annotations

import base64
import math

import numpy as np
import pandas as pd

from attnstudy.analysis import catalogue
from attnstudy.analysis.heatmaps import DIGITS, word_text
from attnstudy.analysis.per_example import analysis_rows, per_example_summary
from attnstudy.data.tasks import EXACT_MATCH, METRICS, TASKS, TOKEN_ERROR_RATE
from attnstudy.pages.templating import render
from attnstudy.scoring.metrics import edit_distance


def step_columns(prefix: str = "analysis") -> dict[str, str]:
    """The per-step columns an example's step table shows (each entry's
    :attr:`~attnstudy.analysis.example_spec.ExampleColumn.step_label`): column → label, of the
    step ablations on the analysis prefix, or (``prefix = "reference"``) on the reference
    (alignment)."""
    return {
        c.column: c.step_label
        for spec, c in catalogue.example_columns()
        if c.step_label and spec.unit == "step" and spec.prefix == prefix
    }


NOT_A_VALUE = "n/a"

BASE_MAPS = ("attention", "heads", "reference_attention")
"""The maps every record has (:func:`attnstudy.analysis.heatmaps.example_records`); the
ablations' own come from their catalogue entries (:func:`map_keys`)."""


def map_keys() -> tuple[str, ...]:
    """A record's maps: nested lists of numbers, one row per decoder step (an adversarial row is
    None where none was found): :data:`BASE_MAPS` and those the catalogue's captures record."""
    return (*BASE_MAPS, *(m.key for c in catalogue.captures().values() for m in c.maps))


WORD_MAPS = {"words": ("attention", "heads"), "reference_words": ("attention",)}
"""The maps of a record's word views (:func:`~attnstudy.analysis.heatmaps.word_view`,
:func:`~attnstudy.analysis.heatmaps.reference_word_view`)."""
HEAD_MAPS = ("heads",)
"""Maps of single heads: in the page only where the run analysed heads."""
SCALE = 10**DIGITS
"""Map values travel as integers in units of 1/SCALE (thousandths): the records' own rounding."""
OUTCOMES = {EXACT_MATCH.key: "correct", TOKEN_ERROR_RATE.key: "token_error_rate"}
"""Task metric (:data:`attnstudy.data.tasks.TASKS`) → the list's per-example column computing it
from the model's test predictions: exact match as "correct?", the token error rate as the
example's edit distance over its reference tokens."""


SPACE = "\u2423"
"""A space token as the list and the maps show it (the figures' ``␣``)."""


def is_special(token: str) -> bool:
    """A vocabulary's special token (``<unk>``, ``<bos>``, ``<eos>``, ``<pad>``)."""
    return len(token) > 2 and token[0] == "<" and token[-1] == ">"


def text_kinds(records: list[dict]) -> dict[str, str]:
    """How the list shows each side's texts: ``"chars"`` where every token of that side in the
    records (special tokens aside, :func:`is_special`) is one character — a character task's
    text is shown as one string, a space token as ``␣``, on one line — else ``"words"``: tokens
    separated by spaces, wrapped between tokens and never inside one. Subword tokens
    (records with ``words``) are shown as words.

    Returns:
        ``{"source": kind, "target": kind}`` (the target side: the reference and the
        prediction).
    """
    sides = {"source": ("source",), "target": ("reference", "rows")}
    out = {}
    for side, keys in sides.items():
        tokens = [
            t
            for r in records
            for k in keys
            for t in r.get(k, [])
            if not is_special(t)  # a greedy prefix's <eos>, an untrained model's <bos> or <unk>
        ]
        chars = bool(tokens) and all(len(t) == 1 for t in tokens)
        out[side] = "chars" if chars and not any("words" in r for r in records) else "words"
    return out


def joined_tokens(text: str) -> list[str]:
    """The tokens of a text that joined them with single spaces (the predictions table's
    ``hypothesis``, :func:`attnstudy.scoring.metrics.per_example`), space tokens included: a space
    token
    makes two empty fields of ``text.split(" ")``, so a run of 2m empty fields is m spaces."""
    if not text:
        return []
    out: list[str] = []
    empty = 0
    for field in text.split(" "):
        if field:
            out.extend([" "] * (empty // 2))
            out.append(field)
            empty = 0
        else:
            empty += 1
    out.extend([" "] * (empty // 2))
    return out


def list_text(tokens: list[str], kind: str) -> str:
    """A token sequence as the list shows it (:func:`text_kinds`): ``"chars"`` one string, a
    space token as ``␣``; ``"words"`` tokens joined by spaces."""
    if kind == "chars":
        return "".join(SPACE if t == " " else t for t in tokens)
    return " ".join(tokens)


def _num(v):
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return round(f, 4) if math.isfinite(f) else None


def encode_map(values: list) -> dict:
    """A map as the page carries it: its shape and its values as one base64 string.

    Each value becomes the integer k = round(value · :data:`SCALE`) (exact for the records,
    which hold :data:`~attnstudy.analysis.heatmaps.DIGITS` decimals), zigzag-mapped to
    z = 2k (k ≥ 0) or −2k − 1 (k < 0), stored as z + 1 (0: no value, None or not finite) in
    LEB128 (7 bits a byte, high bit: more bytes follow): a weight below 0.127 takes one byte.
    The page's ``decodeMap`` and :func:`decode_map` invert it.

    Args:
        values: a rectangular nested list of numbers (any depth ≥ 1); a None where a row is
            expected is a row of missing values.

    Returns:
        ``{"shape": [n_0, n_1, …], "q": base64 text}``.

    Raises:
        ValueError: the rows differ in length, ``values`` is no list, or a value is beyond
            ±2**52 / SCALE (the page's integers are exact up to 2**53).
    """
    shape = _shape(values)
    if not shape:
        raise ValueError(f"a map is a nested list of numbers, not {type(values).__name__}")
    flat_list: list = []
    _flatten(values, shape, flat_list)
    try:
        flat = np.array([np.nan if v is None else v for v in flat_list], dtype=float)
    except (TypeError, ValueError):
        raise ValueError("a map's rows differ in shape: a number where a row is") from None
    missing = ~np.isfinite(flat)
    if np.abs(np.where(missing, 0.0, flat)).max(initial=0.0) * SCALE > 2**52:
        raise ValueError(f"a map value beyond ±{2**52 / SCALE:.3g} cannot travel in the page")
    k = np.rint(np.where(missing, 0.0, flat) * SCALE).astype(np.int64)
    u = np.where(k >= 0, 2 * k, -2 * k - 1) + 1
    u[missing] = 0
    u = u.astype(np.uint64)
    n_bytes = np.ones(len(u), dtype=np.int64)
    for i in range(1, 10):
        n_bytes += (u >> np.uint64(7 * i)) > 0
    start = np.concatenate([[0], np.cumsum(n_bytes)[:-1]]).astype(np.int64)
    out = np.zeros(int(n_bytes.sum()), dtype=np.uint8)
    for i in range(int(n_bytes.max(initial=0))):
        at = n_bytes > i
        low = (u[at] >> np.uint64(7 * i)) & np.uint64(127)
        more = (n_bytes[at] > i + 1).astype(np.uint64) << np.uint64(7)
        out[start[at] + i] = (low | more).astype(np.uint8)
    return {"shape": shape, "q": base64.b64encode(out.tobytes()).decode("ascii")}


def decode_map(encoded: dict) -> list:
    """The plain reference of the page's ``decodeMap``: :func:`encode_map`'s values back as
    nested lists (value k / :data:`SCALE`, None where there was none), a byte at a time."""
    raw = base64.b64decode(encoded["q"])
    flat: list = []
    pos = 0
    for _ in range(math.prod(encoded["shape"])):
        u, mult = 0, 1
        while True:
            b = raw[pos]
            pos += 1
            u += (b & 127) * mult
            mult *= 128
            if not b & 128:
                break
        z = u - 1
        flat.append(None if u == 0 else (z // 2 if z % 2 == 0 else -(z + 1) // 2) / SCALE)
    return _nest(flat, encoded["shape"])


def _shape(values) -> list[int]:
    """A nested list's shape read along its first entries that are not None (:func:`_flatten`
    checks every row against it)."""
    shape = []
    while isinstance(values, list):
        shape.append(len(values))
        values = next((v for v in values if v is not None), None)
    return shape


def _flatten(values, shape: list[int], out: list) -> None:
    """Append ``values``' numbers to ``out`` row by row (a None row: ``shape[-1]`` Nones)."""
    if values is None:
        values = [None] * shape[0]
    if len(values) != shape[0]:
        raise ValueError(f"a map's rows differ in shape: {len(values)} entries, not {shape[0]}")
    if len(shape) == 1:
        out.extend(values)
        return
    for v in values:
        _flatten(v, shape[1:], out)


def _nest(flat: list, shape: list[int]) -> list:
    if len(shape) <= 1:
        return list(flat)
    step = math.prod(shape[1:])
    return [_nest(flat[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def page_record(rec: dict, *, heads: bool) -> dict:
    """A record as the page carries it: its maps encoded (:func:`encode_map`), a map equal to an
    earlier one of the same record replaced by ``{"same": [key, index…]}`` (the reference
    attention is the analysed unit's map when the analysed prefix is the reference), and the
    maps of single heads (:data:`HEAD_MAPS`) left out unless ``heads``. The page's
    ``decodeRecord`` and :func:`decode_record` give the record back."""
    out = dict(rec)
    seen: list[tuple[list, list]] = []  # (path, map) of the maps kept, to find duplicates

    def put(where: dict, key: str, path: list) -> None:
        if key not in where or where[key] is None:
            return
        if key in HEAD_MAPS and not heads:
            del where[key]
            return
        value = where[key]
        for p, m in seen:
            for index, part in _parts(m, len(_shape(m)) - len(_shape(value))):
                if part == value:
                    where[key] = {"same": [*p, *index]}
                    return
        seen.append((path, value))
        where[key] = encode_map(value)

    for key in map_keys():
        put(out, key, [key])
    for view, keys in WORD_MAPS.items():
        if isinstance(out.get(view), dict):
            out[view] = dict(out[view])
            for key in keys:
                put(out[view], key, [view, key])
    return out


def _parts(m: list, depth: int):
    """(index path, sub-list) of ``m`` at ``depth`` levels down (``depth`` 0: ``m`` itself)."""
    if depth < 0:
        return
    if depth == 0:
        yield [], m
        return
    for i, sub in enumerate(m):
        if isinstance(sub, list):
            for index, part in _parts(sub, depth - 1):
                yield [i, *index], part


def decode_record(rec: dict) -> dict:
    """The plain reference of the page's ``decodeRecord``: :func:`page_record`'s output with its
    maps decoded and its duplicates resolved (single-head maps left out stay out)."""
    out = dict(rec)
    for view in WORD_MAPS:
        if isinstance(out.get(view), dict):
            out[view] = dict(out[view])

    def get(path):
        node = out
        for p in path:
            node = node[p]
        return node

    def resolve(where: dict, key: str) -> None:
        value = where.get(key)
        if isinstance(value, dict) and "q" in value:
            where[key] = decode_map(value)
        elif isinstance(value, dict) and "same" in value:
            where[key] = get(value["same"])

    for key in map_keys():
        resolve(out, key)
    for view, keys in WORD_MAPS.items():
        if isinstance(out.get(view), dict):
            for key in keys:
                resolve(out[view], key)
    return out


def outcome_of(task: str | None) -> dict | None:
    """The list's per-example outcome column for ``task``: its first metric in the task registry
    that :data:`OUTCOMES` computes per example (a name that is not a task: :data:`METRICS`, as
    the report reads it).

    Returns:
        ``{"key", "label", "kind"}`` (``kind`` ``"match"``: a yes/no the "only incorrect"
        filter reads; ``"rate"``: a number, lower is better), or None where the task has
        neither metric.
    """
    metrics = TASKS[task].metrics if task in TASKS else METRICS
    for m in metrics:
        if m.key == EXACT_MATCH.key:
            return {"key": OUTCOMES[m.key], "label": "correct?", "kind": "match"}
        if m.key == TOKEN_ERROR_RATE.key:
            return {"key": OUTCOMES[m.key], "label": m.label, "kind": "rate", "unit": m.unit}
    return None


def _error_rate(p) -> float | None:
    dist, length = p.get("edit_distance"), p.get("reference_length")
    if dist is None or length is None or not length or pd.isna(dist) or pd.isna(length):
        return None
    return _num(float(dist) / float(length))


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
    at = first.set_index("alignment_word").reindex(range(n_words))
    return {
        label: [_num(v) for v in at[c].tolist()]
        for c, label in step_columns("reference").items()
        if c in at.columns
    }


def browser_data(
    records: list[dict],
    steps: pd.DataFrame | None,
    *,
    examples: pd.DataFrame | None = None,
    predictions: pd.DataFrame | None = None,
    meta: dict | None = None,
    task: str | None = None,
    summary: pd.DataFrame | None = None,
) -> dict:
    """Everything the page shows, JSON-ready.

    Args:
        records: :func:`attnstudy.analysis.heatmaps.example_records` of the analysed examples.
        steps: the suite's per-step table (``ablations/steps.parquet``).
        examples: the suite's per-example table (global permutation), optional.
        predictions: the model's test predictions (``example_id``, ``hypothesis``, ``correct``,
            ``edit_distance``, ``reference_length``: :func:`attnstudy.scoring.metrics.per_example`),
            optional: the prediction column (and the outcome) falls back to the records' greedy
            prefix against the recorded reference.
        meta: shown in the header: ``title``, ``run_id``, ``prefix``, ``eps``, ``n_permutations``…
        task: the ``data.task`` (:data:`attnstudy.data.tasks.TASKS`), which decides the
            outcome column (:func:`outcome_of`); None: an unnamed task's (exact match).
        summary: the list's rows, :func:`~attnstudy.analysis.per_example.per_example_summary`
            of the whole table, when the caller has them (an ablation run reads them from its
            file a chunk at a time); ``steps`` then need only hold the records' examples' rows.

    Returns:
        ``{"meta", "columns", "outcome", "text", "examples", "records"}``: the list (one row
        per example and unit, ``layer`` and ``head`` 0-based, −1: all at once), its score
        columns, its outcome column (:func:`outcome_of`, each row's value under its ``key``;
        None: no column), how each side's texts are shown (:func:`text_kinds`: a character
        task's as one string), and per example id its maps (:func:`page_record`: encoded,
        single heads only where the run analysed heads) and per-step numbers (``step_values``;
        ``reference_values`` per reference token and, for subword tokens,
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
    if summary is None:
        summary = per_example_summary(steps, examples, meta.get("prefix"))
    by_id = {r["id"]: r for r in records}
    kinds = text_kinds(records)
    outcome = outcome_of(task)
    preds = {}
    if predictions is not None and len(predictions):
        key = "example_id" if "example_id" in predictions else "id"
        for _, p in predictions.iterrows():
            preds[p[key]] = (p.get("hypothesis"), bool(p.get("correct")), _error_rate(p))
    # the columns the run has, as the catalogue's entries declare them
    listed = {c.key: c for _, c in catalogue.example_columns() if c.listed}
    cols = [k for k in ("n_steps", *listed) if k in summary.columns]
    rows = _list_rows(summary, by_id, preds, outcome=outcome, cols=cols, kinds=kinds)
    # single heads where the run analysed them (a unit of one head), else the heads' mean only
    heads = any(row["head"] >= 0 for row in rows) or any(r.get("head", -1) >= 0 for r in records)
    meta["heads_left_out"] = not heads and any("heads" in r for r in records)
    detail = _pages(steps, by_id, prefix=meta.get("prefix"), heads=heads)
    eps = f" = {meta['eps']}" if meta.get("eps") is not None else ""
    return {
        "meta": meta | {"scale": SCALE},
        "columns": [
            {"key": "n_steps", "label": "steps", "unit": "decoder steps", "undefined": "none"}
            if c == "n_steps"
            else {
                "key": c,
                "label": listed[c].label,
                "unit": listed[c].unit,
                "undefined": listed[c].undefined,
            }
            for c in cols
        ],
        # the maps the catalogue's captures record and the run has, in its order, as drawn
        "maps": [
            {
                "key": m.key,
                "title": m.title,
                "caption": m.caption.replace("{eps}", eps),
                "scale": m.scale,
            }
            for c in catalogue.captures().values()
            for m in c.maps
            if any(m.key in r for r in records)  # the maps the run recorded
        ],
        "map_keys": list(map_keys()),
        "outcome": outcome,
        "text": kinds,
        "examples": rows,
        "records": detail,
    }


def _list_rows(
    summary: pd.DataFrame, by_id: dict, preds: dict, *, outcome, cols, kinds: dict[str, str]
) -> list[dict]:
    """The list's rows: one per example and unit of ``summary`` (an example without summary
    rows gets one), with its texts (as ``kinds`` says, :func:`text_kinds`), prediction,
    outcome and score columns ``cols``."""
    target = kinds["target"]
    rows = []
    ids = list(dict.fromkeys(summary["example_id"])) if len(summary) else list(by_id)
    # each example's rows of the list (one per unit), found once: a filter per example was
    # quadratic in the number of examples
    rows_of = summary.groupby("example_id", sort=False).indices if len(summary) else {}
    for eid in ids:
        rec = by_id.get(eid, {})
        hyp, ok, rate = preds.get(eid, (None, None, None))
        if hyp is None and rec:
            toks = [t for t in rec.get("rows", []) if t != "<eos>"]
            hyp = " ".join(toks) if rec.get("prefix") == "greedy" else None
            ok = toks == rec.get("reference") if hyp is not None else None
            ref = rec.get("reference") or []
            rate = _num(edit_distance(toks, ref) / len(ref)) if hyp is not None and ref else None
        # subword tokens: the texts as words (the subword view shows the tokens); a character
        # task's texts as one string each (text_kinds)
        words = "words" in rec
        if isinstance(hyp, str) and hyp:
            hyp = word_text(hyp.split(" ")) if words else list_text(joined_tokens(hyp), target)
        if words:
            source, reference = word_text(rec["source"]), word_text(rec["reference"])
        else:
            source = list_text(rec.get("source", []), kinds["source"])
            reference = list_text(rec.get("reference", []), target)
        shown = {}
        if outcome is not None:
            shown[outcome["key"]] = ok if outcome["kind"] == "match" else rate
        sub = summary.iloc[rows_of[eid]] if len(summary) else pd.DataFrame()
        for _, s in sub.iterrows() if len(sub) else [(None, pd.Series(dtype=float))]:
            rows.append(
                {
                    "id": eid,
                    "layer": int(s["layer"]) if "layer" in s and pd.notna(s.get("layer")) else 0,
                    "head": int(s["head"]) if "head" in s and pd.notna(s.get("head")) else -1,
                    "source": source,
                    "reference": reference,
                    "prediction": hyp,
                    **shown,
                    **{c: _num(s.get(c)) for c in cols},
                    "has_matrices": bool(rec),
                }
            )
    return rows


def _pages(steps: pd.DataFrame, by_id: dict, *, prefix, heads: bool) -> dict:
    """Per recorded example its page: its maps (:func:`page_record`) and per-step numbers
    (``step_values``, ``reference_values``, ``reference_word_values``)."""
    detail = {}
    if len(steps):  # only the recorded examples' rows are read for their pages
        steps = steps[steps["example_id"].isin(by_id)]
    greedy = analysis_rows(steps, prefix) if len(steps) else steps
    ref = steps[steps["prefix"] == "reference"] if "prefix" in steps.columns else steps.iloc[:0]
    greedy_of = dict(tuple(greedy.groupby("example_id", sort=False))) if len(greedy) else {}
    ref_of = dict(tuple(ref.groupby("example_id", sort=False))) if len(ref) else {}
    for eid, rec in by_id.items():
        d = page_record(rec, heads=heads)
        layer_rows = _unit_rows(greedy_of.get(eid, greedy.iloc[:0]), rec)
        at = layer_rows.drop_duplicates("step").set_index("step") if len(layer_rows) else None
        at = at.reindex(rec.get("steps", [])) if at is not None else None
        d["step_values"] = {
            label: [_num(v) for v in at[c].tolist()]
            if at is not None and c in at.columns
            else [None] * len(rec.get("steps", []))
            for c, label in step_columns().items()
            if c in steps.columns
        }
        ref_rows = _unit_rows(ref_of.get(eid, ref.iloc[:0]), rec)
        if len(ref_rows) and "reference_rows" in rec:
            r = ref_rows.sort_values("step")
            d["reference_values"] = {
                label: [_num(v) for v in r[c]]
                for c, label in step_columns("reference").items()
                if c in r
            }
            if "reference_words" in rec and "alignment_word" in r:
                d["reference_word_values"] = _word_values(r, len(rec["reference_words"]["rows"]))
        detail[eid] = d
    return detail


def browser_html(data: dict) -> str:
    """The page (``templates/examples.html.j2``) for :func:`browser_data`'s output."""
    return render("examples.html.j2", data=data, meta=data["meta"])
