"""The study report, built from the tracking store alone (docs/design.md §5).

Search the study's runs → load their tables (test predictions, per-step ablation tables, heatmap
data) → figures (:mod:`attnstudy.analysis.figures`) → ``report.html`` with the figures beside it and a
Markdown twin ``report.md`` in ``reports/<experiment>/``, also logged as the study run's
``report/`` artifact. Any machine that sees the store can rebuild it.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .analysis import figures
from .analysis.catalogue import list_ablations
from .notices import notice
from .paths import project_root
from .tracking import Artifact, Tag, Tracker, store

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
    models: pd.DataFrame  # one row per model run: run_id, variant, task, status, reasons, metrics…
    predictions: pd.DataFrame  # test predictions of every model (+ variant, task)
    steps: (
        pd.DataFrame
    )  # per-step ablation tables of every model (+ variant, task, analysis_prefix)
    heatmaps: list[dict]
    seed_variance: pd.DataFrame
    config_text: str
    status: str = "FINISHED"
    notes: list[str] = field(default_factory=list)


def variant_name(tags: dict[str, str]) -> str:
    """Model label used in figures: ``task variant`` (``g2p additive-bahdanau``,
    ``g2p transformer-L2H4``; runs from before the variant tag: attention-flow), + ``seedN`` when
    not seed 1."""
    seed = tags.get(Tag.SEED, "")
    label = tags.get(Tag.VARIANT) or f"{tags.get(Tag.ATTENTION, '?')}-{tags.get(Tag.FLOW, '?')}"
    return f"{tags.get(Tag.TASK, '?')} {label}" + (f" seed{seed}" if seed and seed != "1" else "")


def latest_study(tracker: Tracker, experiment: str) -> str:
    """Run id of the newest FINISHED study run of ``experiment`` (else the newest study, with a notice).

    Raises:
        LookupError: no such experiment, or it has no study run.
    """
    study_id, note = store.latest_study(tracker, experiment)
    if note:
        notice(note)
    return study_id


def load_study(tracker: Tracker, study_id: str) -> StudyData:
    """Read a study's runs and tables from the store: exactly the model and ablation runs the study
    recorded (:func:`attnstudy.tracking.store.study_runs`), so ad-hoc ablations run later never
    change a study's report.

    Raises:
        LookupError: ``study_id`` is not a study run (or no run).
    """
    runs = store.study_runs(tracker, study_id)
    study = runs.study
    rows, preds, steps, heatmaps, notes = [], [], [], [], []
    for run in runs.models:
        mtags, variant = run.tags, variant_name(run.tags)
        row = {
            "variant": variant,
            "task": mtags.get(Tag.TASK),
            "attention": mtags.get(Tag.ATTENTION),
            "flow": mtags.get(Tag.FLOW),
            "seed": mtags.get(Tag.SEED),
            "model_run_id": run.run_id,
            "model_status": run.status,
            "model_error": mtags.get(Tag.ERROR_MESSAGE, ""),
        }
        if run.status == "FINISHED":
            row.update({k: v for k, v in run.metrics.items() if k in SUMMARY_COLUMNS})
            p = _try_table(tracker, run.run_id, Artifact.PREDICTIONS)
            if p is not None:
                preds.append(p.assign(variant=variant, task=mtags.get(Tag.TASK)))
            else:
                notes.append(
                    f"{variant}: its test predictions ({Artifact.PREDICTIONS} of run "
                    f"{run.run_id}) are missing from the store"
                )
        abl = runs.ablations.get(run.run_id)
        if abl is not None:
            row.update(
                {
                    "ablation_run_id": abl.run_id,
                    "ablation_status": abl.status,
                    "ablation_error": abl.tags.get(Tag.ERROR_MESSAGE, ""),
                    "ablations_run": abl.params.get("ablation.ablations", "[]"),
                    "skipped": {
                        k[len(Tag.SKIPPED_PREFIX) :]: v
                        for k, v in abl.tags.items()
                        if k.startswith(Tag.SKIPPED_PREFIX)
                    },
                    "n_alignment_steps": abl.metrics.get("ablation/alignment/n_steps"),
                    "n_alignment_skipped": abl.metrics.get("ablation/alignment/n_skipped"),
                }
            )
            if abl.status == "FINISHED":
                row.update({k: v for k, v in abl.metrics.items() if k in SUMMARY_COLUMNS})
                s = _try_table(tracker, abl.run_id, Artifact.STEPS)
                if s is not None:
                    prefix = abl.params.get("ablation.prefix", "greedy")
                    steps.append(
                        s.assign(variant=variant, task=mtags.get(Tag.TASK), analysis_prefix=prefix)
                    )
                else:
                    notes.append(
                        f"{variant}: its per-step ablation table ({Artifact.STEPS} of run "
                        f"{abl.run_id}) is missing from the store; its figures are empty"
                    )
                for ex in _try_json(tracker, abl.run_id, Artifact.HEATMAPS) or []:
                    heatmaps.append(
                        ex | {"title": f"{variant}: {ex.get('title', '')}", "run_id": abl.run_id}
                    )
        rows.append(row)
    seed_var = _try_table(tracker, study_id, Artifact.SEED_VARIANCE)
    config_text = _try_text(tracker, study_id, Artifact.EXPERIMENT_TOML) or ""
    return StudyData(
        study.tags.get(Tag.EXPERIMENT, "study"),
        study.experiment_id,
        study_id,
        pd.DataFrame(rows),
        pd.concat(preds, ignore_index=True) if preds else pd.DataFrame(),
        pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(),
        heatmaps,
        seed_var if seed_var is not None else pd.DataFrame(),
        config_text,
        status=study.status,
        notes=notes,
    )


def _missing(tracker, run_id: str, path: str) -> bool:
    try:
        return not tracker.has_artifact(run_id, path)
    except Exception:  # noqa: BLE001 - a store error is reported by the load that follows
        return False


def _try_table(tracker, run_id: str, path: str):
    """The artifact table, or None when the run has no such artifact (not run); other errors propagate."""
    if _missing(tracker, run_id, path):
        return None
    return tracker.load_table(run_id, path)


def _try_text(tracker, run_id: str, path: str) -> str | None:
    if _missing(tracker, run_id, path):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return Path(tracker.download_artifact(run_id, path, tmp)).read_text(encoding="utf-8")


def _try_json(tracker, run_id: str, path: str):
    text = _try_text(tracker, run_id, path)
    return json.loads(text) if text else None


FIGURES = [
    (
        "accuracy_by_length",
        "Task accuracy by source length, against the no-attention baseline",
        lambda d: figures.accuracy_by_length(d.predictions),
    ),
    (
        "permutation",
        "Permutation: median output TVD by maximum attention",
        lambda d: figures.permutation_by_max_attention(_analysis_steps(d.steps)),
    ),
    (
        "adversarial",
        "Adversarial attention: max JSD within ε by maximum attention",
        lambda d: figures.adversarial_by_max_attention(_analysis_steps(d.steps)),
    ),
    (
        "kendall_tau",
        "Kendall τ between attention, gradient and leave-one-out importance",
        lambda d: figures.kendall_tau(_analysis_steps(d.steps)),
    ),
    (
        "erasure",
        "Erasure: how much is removed before the decision flips",
        lambda d: figures.erasure_fractions(_analysis_steps(d.steps)),
    ),
    (
        "alignment_vs_ablation",
        "Alignment against ablation",
        lambda d: figures.alignment_vs_ablation(d.steps),
    ),
    (
        "heatmaps",
        "Attention heatmaps: model attention beside an adversarial attention",
        lambda d: figures.attention_heatmaps(_one_per_model(d.heatmaps)),
    ),
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
    """Rows of each model's analysis prefix (the suite also holds reference-prefix rows for alignment)."""
    if steps.empty or "prefix" not in steps.columns or "analysis_prefix" not in steps.columns:
        return steps
    return steps[steps["prefix"] == steps["analysis_prefix"]]


def ui_base_url() -> str:
    return os.environ.get("ATTNSTUDY_UI_URL", "http://127.0.0.1:5000")


def report_dir(experiment: str) -> Path:
    """The default report folder ``<project root>/reports/<slug of the experiment name>``.

    The name comes from the store (a tag), so it is reduced to a safe slug and the result is checked
    to stay inside ``reports/``.

    Raises:
        ValueError: if the folder would leave ``reports/`` (cannot happen for a slug; checked anyway).
    """
    root = (project_root() / "reports").resolve()
    slug = (
        re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]", "_", experiment)).lstrip(".") or "study"
    )
    out = (root / slug).resolve()
    if out.parent != root:
        raise ValueError(f"report folder {out} is not inside {root}")
    return out


def build_report(tracker, study_id: str, out_dir: str | Path | None = None) -> Path:
    """Build the report of a study and log it to the study run.

    The folder is written whole or not at all: everything goes to a temporary folder beside it,
    which then replaces the old one, so an interrupted build never mixes two reports.

    Args:
        tracker: :class:`attnstudy.tracking.Tracker`.
        study_id: the study run.
        out_dir: output folder (default :func:`report_dir` of the study's experiment).

    Returns:
        Path of ``report.html``.
    """
    data = load_study(tracker, study_id)
    out = Path(out_dir).resolve() if out_dir else report_dir(data.experiment)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would otherwise become the report folder's mode
    try:
        (tmp / "figures").mkdir()
        made = []
        for key, title, make in FIGURES:
            if key == "seed_variance" and data.seed_variance.empty:
                continue
            fig = make(data)
            fig.savefig(tmp / "figures" / f"{key}.png", dpi=110)
            made.append((key, title))
        table = _summary_table(data)
        (tmp / "summary.csv").write_text(table.to_csv(index=False), encoding="utf-8")
        (tmp / "report.html").write_text(_html(data, made, table), encoding="utf-8")
        (tmp / "report.md").write_text(_markdown(data, made, table), encoding="utf-8")
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for key, _ in made:
        tracker.log_artifact(study_id, out / "figures" / f"{key}.png", Artifact.FIGURES_DIR)
    for ex in _one_per_model(
        data.heatmaps, limit=len(data.heatmaps)
    ):  # each model's heatmap to its ablation run
        fig = figures.attention_heatmaps([ex])
        tracker.log_figure(
            ex["run_id"], fig, f"figures/heatmap_{_slug(ex.get('title', 'example'))}.png"
        )
    tracker.log_artifacts(study_id, out, Artifact.REPORT_DIR)
    return out / "report.html"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)[:60].strip("_")


def _reason(row: pd.Series, metric: str) -> str:
    """Why a summary cell has no value: the model or ablation failed, was not run, does not apply."""
    if row.get("model_status") != "FINISHED":
        return (
            "training failed"
            if row.get("model_status") == "FAILED"
            else str(row.get("model_status")).lower()
        )
    if not metric.startswith("ablation/"):
        return "n/a"
    name = metric.split("/")[1]
    if not isinstance(row.get("ablation_run_id"), str):
        return "not run"
    if row.get("ablation_status") != "FINISHED":
        return (
            "failed"
            if row.get("ablation_status") == "FAILED"
            else str(row.get("ablation_status")).lower()
        )
    if name not in json.loads(row.get("ablations_run") or "[]"):
        return "not run"
    if row.get("attention") == "none" and not metric.endswith("tau_grad_loo"):
        return "no attention"
    skipped = row.get("skipped") or {}
    if name in skipped:
        return "no attention" if "no attention" in skipped[name] else "skipped"
    if (
        name == "alignment"
        and row.get("n_alignment_steps") is not None
        and row.get("n_alignment_skipped") == row.get("n_alignment_steps")
    ):
        return "no gold links"
    return "undefined"


def _summary_table(data: StudyData) -> pd.DataFrame:
    """One row per model; a value, or the reason there is none (never a bare dash)."""
    if data.models.empty:
        return pd.DataFrame()
    ran = _ablations_run(data)
    cols = [
        c
        for c in SUMMARY_COLUMNS
        if (c in data.models.columns and data.models[c].notna().any())
        or (c.startswith("ablation/") and c.split("/")[1] in ran)
    ]
    out = {"variant": list(data.models["variant"])}
    for c in cols:
        out[SUMMARY_COLUMNS[c]] = [
            round(float(r[c]), 4) if pd.notna(r.get(c)) else _reason(r, c)
            for _, r in data.models.iterrows()
        ]
    return pd.DataFrame(out)


def _run_link(data: StudyData, run_id: str) -> str:
    return f"{ui_base_url()}/#/experiments/{data.experiment_id}/runs/{run_id}"


def _ablations_run(data: StudyData) -> set[str]:
    """Every ablation some model of the study was asked to run."""
    ran: set[str] = set()
    if "ablations_run" in data.models.columns:
        for v in data.models["ablations_run"].dropna():
            ran |= set(json.loads(v))
    return ran


def _status_lines(data: StudyData) -> list[str]:
    """What the study's status and failures mean for the report (empty for a finished study)."""
    lines = [f"Note: {n}." for n in data.notes]
    not_run = [a for a in list_ablations(default_only=True) if a not in _ablations_run(data)]
    if not_run:
        lines.append(f"Ablations not run in this study: {', '.join(not_run)}.")
    if data.status != "FINISHED":
        lines.append(
            f"Study status: **{data.status}**: the report shows what the store holds for it."
        )
    if not data.models.empty:
        for _, r in data.models.iterrows():
            if r.get("model_status") == "FAILED":
                lines.append(
                    f"- {r['variant']}: training failed ({r.get('model_error') or 'no reason recorded'})"
                )
            elif r.get("ablation_status") == "FAILED":
                lines.append(
                    f"- {r['variant']}: ablations failed ({r.get('ablation_error') or 'no reason recorded'})"
                )
    return [*lines, ""] if lines else []


def _status_html(data: StudyData) -> str:
    lines = _status_lines(data)
    if not lines:
        return ""
    items = [html.escape(x[2:]) for x in lines if x.startswith("- ")]
    head = [html.escape(x).replace("**", "") for x in lines if x and not x.startswith("- ")]
    return "".join(f'<p class="status">{h}</p>' for h in head) + (
        '<ul class="failures">' + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""
    )


def _html(data: StudyData, made: list[tuple[str, str]], table: pd.DataFrame) -> str:
    esc = html.escape
    links = "".join(
        f'<li>{esc(r["variant"])}: <a href="{_run_link(data, r["model_run_id"])}">model run '
        f"<code>{r['model_run_id']}</code></a>"
        + (
            f', <a href="{_run_link(data, r["ablation_run_id"])}">ablation run <code>{r["ablation_run_id"]}</code></a>'
            if isinstance(r.get("ablation_run_id"), str)
            else ""
        )
        + "</li>"
        for _, r in data.models.iterrows()
    )
    figs = "".join(
        f'<section><h2>{esc(t)}</h2><img src="figures/{k}.png" alt="{esc(t)}"></section>'
        for k, t in made
    )
    table_html = (
        table.to_html(index=False, na_rep="–", classes="summary")
        if not table.empty
        else "<p>no models</p>"
    )
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
{_status_html(data)}
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
    lines = [
        f"# Is this model's attention an explanation? — {data.experiment}",
        "",
        f"Study run `{data.study_id}` (experiment id {data.experiment_id}); rebuild with "
        f"`attnstudy report --study {data.study_id}`.",
        "",
        *_status_lines(data),
        "## Summary per model",
        "",
    ]
    if not table.empty:
        lines.append("| " + " | ".join(table.columns) + " |")
        lines.append("|" + "---|" * len(table.columns))
        for _, r in table.iterrows():
            lines.append("| " + " | ".join("–" if pd.isna(v) else str(v) for v in r) + " |")
    lines += ["", "## Runs", ""]
    for _, r in data.models.iterrows():
        abl = (
            f", ablation run [{r['ablation_run_id']}]({_run_link(data, r['ablation_run_id'])})"
            if isinstance(r.get("ablation_run_id"), str)
            else ""
        )
        lines.append(
            f"- {r['variant']}: model run [{r['model_run_id']}]({_run_link(data, r['model_run_id'])}){abl}"
        )
    for k, t in made:
        lines += ["", f"## {t}", "", f"![{t}](figures/{k}.png)"]
    lines += [
        "",
        "## Experiment config",
        "",
        "```toml",
        data.config_text or "(not logged)",
        "```",
        "",
    ]
    return "\n".join(lines)
