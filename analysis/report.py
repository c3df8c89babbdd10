"""The study report, built from the tracking store alone (DESIGN.md §5, STYLE.md).

Search the study's runs → load their tables (test predictions, per-step ablation tables, heatmap
data) → figures (:mod:`analysis.figures`) → ``report.html`` with the figures beside it and a
Markdown twin ``report.md`` in ``reports/<experiment>/``, also logged as the study run's
``report/`` artifact. Any machine that sees the store can rebuild it.
"""

from __future__ import annotations

import html
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import figures

SUMMARY_COLUMNS = {
    "test/exact_match": "exact match",
    "test_heldin/exact_match": "exact match (held-in)",
    "test_heldout/exact_match": "exact match (held-out)",
    "test/wer": "WER",
    "test/per": "PER",
    "ablation/permutation/flip_rate": "permutation flip rate",
    "ablation/permutation/median_tvd": "permutation median TVD",
    "ablation/uniform/flip_rate": "uniform flip rate",
    "ablation/erase_max/flip_rate": "erase-max flip rate",
    "ablation/adversarial/max_jsd": "adversarial max JSD",
    "ablation/importance/tau_attn_grad": "τ attn–grad",
    "ablation/importance/tau_attn_loo": "τ attn–LOO",
    "ablation/importance/tau_grad_loo": "τ grad–LOO",
    "ablation/alignment/aer": "AER",
    "ablation/alignment/gold_mass": "gold mass",
}


@dataclass
class StudyData:
    """Everything the report needs, read from the store."""

    experiment: str
    experiment_id: str
    study_id: str
    models: pd.DataFrame          # one row per model run: run_id, variant, task, metrics…
    predictions: pd.DataFrame     # test predictions of every model (+ variant, task)
    steps: pd.DataFrame           # per-step ablation tables of every model (+ variant, task)
    heatmaps: list[dict]
    seed_variance: pd.DataFrame
    config_text: str


def variant_name(tags: dict[str, str]) -> str:
    """Model label used in figures: ``task attention-flow`` (+ ``seedN`` when not seed 1)."""
    seed = tags.get("seed", "")
    return f"{tags.get('task', '?')} {tags.get('attention', '?')}-{tags.get('flow', '?')}" + \
        (f" seed{seed}" if seed and seed != "1" else "")


def latest_study(tracker, experiment: str) -> str:
    """Run id of the newest study run of ``experiment``.

    Raises:
        LookupError: no such experiment, or it has no study run.
    """
    exp_id = tracker.experiment_id(experiment, create=False)
    if exp_id is None:
        raise LookupError(f"no experiment named {experiment!r} in {tracker.uri}; run 'attnstudy run' first")
    runs = tracker.search_runs([exp_id], "tags.kind = 'study'", max_results=1)
    if not runs:
        raise LookupError(f"experiment {experiment!r} has no study run; run 'attnstudy run' first")
    return runs[0].info.run_id


def load_study(tracker, study_id: str) -> StudyData:
    """Read a study's runs and tables from the store.

    Raises:
        LookupError: ``study_id`` is not a study run.
    """
    study = tracker.get_run(study_id)
    if study.data.tags.get("kind") != "study":
        raise LookupError(f"run {study_id} is not a study run (kind={study.data.tags.get('kind')!r})")
    exp_id = study.info.experiment_id
    experiment = study.data.tags.get("experiment", "study")
    ids = [i for i in study.data.tags.get("model_run_ids", "").split(",") if i]
    if ids:
        model_runs = [tracker.get_run(i) for i in ids]
    else:
        model_runs = [r for r in tracker.search_runs([exp_id], "tags.kind = 'model'")
                      if study_id in r.data.tags.get("study_ids", "").split(",")]
    ablation_runs = {r.data.tags.get("source_run_id"): r for r in reversed(
        tracker.search_runs([exp_id], f"tags.kind = 'ablation' and tags.study_id = '{study_id}'"))}

    rows, preds, steps, heatmaps = [], [], [], []
    for run in model_runs:
        tags, variant = run.data.tags, variant_name(run.data.tags)
        row = {"variant": variant, "task": tags.get("task"), "attention": tags.get("attention"),
               "flow": tags.get("flow"), "seed": tags.get("seed"), "model_run_id": run.info.run_id}
        row.update({k: v for k, v in run.data.metrics.items() if k in SUMMARY_COLUMNS})
        p = _try_table(tracker, run.info.run_id, "predictions/test.parquet")
        if p is not None:
            preds.append(p.assign(variant=variant, task=tags.get("task")))
        abl = ablation_runs.get(run.info.run_id)
        if abl is not None:
            row["ablation_run_id"] = abl.info.run_id
            row.update({k: v for k, v in abl.data.metrics.items() if k in SUMMARY_COLUMNS})
            s = _try_table(tracker, abl.info.run_id, "ablations/steps.parquet")
            if s is not None:
                steps.append(s.assign(variant=variant, task=tags.get("task")))
            for ex in _try_json(tracker, abl.info.run_id, "ablations/heatmaps.json") or []:
                heatmaps.append(ex | {"title": f"{variant}: {ex.get('title', '')}", "run_id": abl.info.run_id})
        rows.append(row)
    seed_var = _try_table(tracker, study_id, "seed_variance/steps.parquet")
    config_text = _try_text(tracker, study_id, "experiment.toml") or ""
    return StudyData(experiment, exp_id, study_id, pd.DataFrame(rows),
                     pd.concat(preds, ignore_index=True) if preds else pd.DataFrame(),
                     pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(),
                     heatmaps, seed_var if seed_var is not None else pd.DataFrame(), config_text)


def _try_table(tracker, run_id: str, path: str):
    try:
        return tracker.load_table(run_id, path)
    except Exception:  # a missing artifact means "not run", not a broken report
        return None


def _try_text(tracker, run_id: str, path: str) -> str | None:
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return Path(tracker.client.download_artifacts(run_id, path, tmp)).read_text(encoding="utf-8")
    except Exception:
        return None


def _try_json(tracker, run_id: str, path: str):
    text = _try_text(tracker, run_id, path)
    return json.loads(text) if text else None


FIGURES = [
    ("accuracy_by_length", "Task accuracy by source length, against the no-attention baseline",
     lambda d: figures.accuracy_by_length(d.predictions)),
    ("permutation", "Permutation: median output TVD by maximum attention",
     lambda d: figures.permutation_by_max_attention(_analysis_steps(d.steps))),
    ("adversarial", "Adversarial attention: max JSD within ε by maximum attention",
     lambda d: figures.adversarial_by_max_attention(_analysis_steps(d.steps))),
    ("kendall_tau", "Kendall τ between attention, gradient and leave-one-out importance",
     lambda d: figures.kendall_tau(_analysis_steps(d.steps))),
    ("erasure", "Erasure: how much is removed before the decision flips",
     lambda d: figures.erasure_fractions(_analysis_steps(d.steps))),
    ("alignment_vs_ablation", "Alignment against ablation",
     lambda d: figures.alignment_vs_ablation(d.steps)),
    ("heatmaps", "Attention heatmaps: model attention beside an adversarial attention",
     lambda d: figures.attention_heatmaps(_one_per_model(d.heatmaps))),
    ("seed_variance", "Seed variance", lambda d: figures.seed_variance(d.seed_variance)),
]


def _one_per_model(heatmaps: list[dict], limit: int = 8) -> list[dict]:
    """The first heatmap of every model (ablation run), at most ``limit``."""
    seen, out = set(), []
    for ex in heatmaps:
        if ex["run_id"] not in seen:
            seen.add(ex["run_id"])
            out.append(ex)
    return out[:limit]


def _analysis_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """Rows of the analysis prefix (the suite also holds reference-prefix rows for alignment)."""
    if "prefix" not in steps.columns or steps.empty:
        return steps
    analysis_prefix = steps.loc[steps.get("permutation_median_tvd", pd.Series(dtype=float)).notna(), "prefix"]
    keep = analysis_prefix.iloc[0] if len(analysis_prefix) else steps["prefix"].iloc[0]
    return steps[steps["prefix"] == keep]


def ui_base_url() -> str:
    return os.environ.get("ATTNSTUDY_UI_URL", "http://127.0.0.1:5000")


def build_report(tracker, study_id: str, out_dir: str | Path | None = None) -> Path:
    """Build the report of a study and log it to the study run.

    Args:
        tracker: :class:`attnstudy.tracking.Tracker`.
        study_id: the study run.
        out_dir: output folder (default ``<project root>/reports/<experiment>/``).

    Returns:
        Path of ``report.html``.
    """
    from attnstudy.tracking import project_root

    data = load_study(tracker, study_id)
    out = Path(out_dir) if out_dir else project_root() / "reports" / data.experiment
    (out / "figures").mkdir(parents=True, exist_ok=True)
    made = []
    for key, title, make in FIGURES:
        if key == "seed_variance" and data.seed_variance.empty:
            continue
        fig = make(data)
        fig.savefig(out / "figures" / f"{key}.png", dpi=110)
        tracker.log_figure(study_id, fig, f"figures/{key}.png")
        made.append((key, title))
    for ex in data.heatmaps[:6]:  # each heatmap also goes to the ablation run it describes
        fig = figures.attention_heatmaps([ex])
        tracker.log_figure(ex["run_id"], fig, f"figures/heatmap_{_slug(ex.get('title', 'example'))}.png")
    table = _summary_table(data)
    (out / "summary.csv").write_text(table.to_csv(index=False), encoding="utf-8")
    (out / "report.html").write_text(_html(data, made, table), encoding="utf-8")
    (out / "report.md").write_text(_markdown(data, made, table), encoding="utf-8")
    tracker.log_artifacts(study_id, out, "report")
    return out / "report.html"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)[:60].strip("_")


def _summary_table(data: StudyData) -> pd.DataFrame:
    if data.models.empty:
        return pd.DataFrame()
    cols = ["variant"] + [c for c in SUMMARY_COLUMNS if c in data.models.columns]
    t = data.models[cols].rename(columns=SUMMARY_COLUMNS)
    return t.round(4)


def _run_link(data: StudyData, run_id: str) -> str:
    return f"{ui_base_url()}/#/experiments/{data.experiment_id}/runs/{run_id}"


def _html(data: StudyData, made: list[tuple[str, str]], table: pd.DataFrame) -> str:
    esc = html.escape
    links = "".join(
        f"<li>{esc(r['variant'])}: <a href=\"{_run_link(data, r['model_run_id'])}\">model run "
        f"<code>{r['model_run_id']}</code></a>"
        + (f", <a href=\"{_run_link(data, r['ablation_run_id'])}\">ablation run <code>{r['ablation_run_id']}</code></a>"
           if isinstance(r.get("ablation_run_id"), str) else "") + "</li>"
        for _, r in data.models.iterrows())
    figs = "".join(f"<section><h2>{esc(t)}</h2><img src=\"figures/{k}.png\" alt=\"{esc(t)}\"></section>"
                   for k, t in made)
    table_html = table.to_html(index=False, na_rep="–", classes="summary") if not table.empty else "<p>no models</p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>attnstudy report: {esc(data.experiment)}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}}
img{{max-width:100%;border:1px solid #ddd}} table.summary{{border-collapse:collapse;font-size:0.85em}}
table.summary td,table.summary th{{border:1px solid #ccc;padding:4px 6px;text-align:right}}
pre{{background:#f6f6f6;padding:1em;overflow:auto;font-size:0.8em}}</style></head><body>
<h1>Is this model's attention an explanation? — {esc(data.experiment)}</h1>
<p>Study run <a href="{_run_link(data, data.study_id)}"><code>{data.study_id}</code></a>
(experiment id {esc(data.experiment_id)}). Built from the tracking store alone; rebuild with
<code>attnstudy report --study {data.study_id}</code>.</p>
<h2>Summary per model</h2>
<p>Task metrics on the test split (greedy decoding); ablation statistics are micro-averages over
decoder steps of the analysed test sample (see the ablation runs for bootstrap 95 % intervals).</p>
{table_html}
<h2>Runs</h2><ul>{links}</ul>
{figs}
<h2>Experiment config</h2><pre>{esc(data.config_text or "(not logged)")}</pre>
</body></html>
"""


def _markdown(data: StudyData, made: list[tuple[str, str]], table: pd.DataFrame) -> str:
    lines = [f"# Is this model's attention an explanation? — {data.experiment}", "",
             f"Study run `{data.study_id}` (experiment id {data.experiment_id}); rebuild with "
             f"`attnstudy report --study {data.study_id}`.", "", "## Summary per model", ""]
    if not table.empty:
        lines.append("| " + " | ".join(table.columns) + " |")
        lines.append("|" + "---|" * len(table.columns))
        for _, r in table.iterrows():
            lines.append("| " + " | ".join("–" if pd.isna(v) else str(v) for v in r) + " |")
    lines += ["", "## Runs", ""]
    for _, r in data.models.iterrows():
        abl = f", ablation run [{r['ablation_run_id']}]({_run_link(data, r['ablation_run_id'])})" \
            if isinstance(r.get("ablation_run_id"), str) else ""
        lines.append(f"- {r['variant']}: model run [{r['model_run_id']}]({_run_link(data, r['model_run_id'])}){abl}")
    for k, t in made:
        lines += ["", f"## {t}", "", f"![{t}](figures/{k}.png)"]
    lines += ["", "## Experiment config", "", "```toml", data.config_text or "(not logged)", "```", ""]
    return "\n".join(lines)
