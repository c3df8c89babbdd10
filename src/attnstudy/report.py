"""The study report, built from the tracking store alone (docs/design.md §5).

Search the study's runs → load their tables (test predictions, per-step ablation tables, example
records) → findings (:mod:`attnstudy.findings`), tables with intervals, figures
(:mod:`attnstudy.analysis.figures`) → one context → ``report.html`` (Jinja2 template, figures
embedded as data URIs, so it renders from disk and inside MLflow's sandboxed artifact frame) and its
Markdown twin ``report.md`` from the same context, the figures as PNG files, the example browser of
every model, in ``reports/<experiment>/``; also logged as the study run's ``report/`` artifact, with
the cross-model summary as the study run's ``summary.json`` (MLflow table) and ``summary.csv``.
Any machine that sees the store can rebuild it.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from .adversaries import STATS as ADVERSARY_STATS
from .analysis import catalogue, figures
from .analysis.catalogue import AblationConfig, list_ablations
from .analysis.per_example import (
    SHOW_CRITERION,
    gold_mass_by_offset,
    per_example_summary,
    pick_shown,
)
from .data.tasks import task_metrics
from .findings import (
    LITERATURE,
    REFERENCES,
    Estimate,
    ModelFacts,
    VerdictThresholds,
    facts_from_metrics,
    overall,
    verdict,
)
from .notices import notice
from .outputs import REPORT_KIND, check_files, replace_folder, store_folders_of, write_files
from .paths import project_root
from .run_pages import (  # noqa: F401 (variant_name re-exported)
    config_name,
    estimates_table,
    figure_png,
    variant_name,
)
from .templating import render
from .tracking import Artifact, Tag, Tracker, store

DEFAULT_UI_URL = "http://127.0.0.1:5000"
ML_VIEW = "workflowType=machine_learning"


@dataclass
class ModelEntry:
    """One model of the study, with its ablation run, as read from the store."""

    variant: str
    task: str
    attention: str
    flow: str
    seed: str
    model_run_id: str
    model_status: str
    config: str
    """The variant without its seed (:func:`config_name`): the seeds of one configuration share it."""
    model_error: str = ""
    model_metrics: dict = field(default_factory=dict)
    model_params: dict = field(default_factory=dict)
    registered: str = ""
    ablation_run_id: str | None = None
    ablation_status: str | None = None
    ablation_error: str = ""
    ablation_metrics: dict = field(default_factory=dict)
    ablation_params: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    predictions: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    examples: pd.DataFrame | None = None
    records: list = field(default_factory=list)
    legacy_heatmaps: list = field(default_factory=list)
    has_browser: bool = False
    has_alignments: bool = False

    @property
    def ablations_run(self) -> list[str]:
        return json.loads(self.ablation_params.get("ablation.ablations", "[]"))

    @property
    def analysis_prefix(self) -> str:
        return self.ablation_params.get("ablation.prefix", "greedy")


@dataclass
class StudyData:
    """Everything the report needs, read from the store."""

    experiment: str
    experiment_id: str
    study_id: str
    entries: list[ModelEntry]
    seed_variance: pd.DataFrame
    config_text: str
    status: str = "FINISHED"
    notes: list[str] = field(default_factory=list)
    experiment_json: dict = field(default_factory=dict)
    adversaries: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def predictions(self) -> pd.DataFrame:
        parts = [
            e.predictions.assign(variant=e.variant, task=e.task)
            for e in self.entries
            if e.predictions is not None
        ]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    @property
    def steps(self) -> pd.DataFrame:
        parts = [
            e.steps.assign(variant=e.variant, task=e.task, analysis_prefix=e.analysis_prefix)
            for e in self.entries
            if e.steps is not None
        ]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


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
    entries, notes = [], []
    for run in runs.models:
        t = run.tags
        e = ModelEntry(
            variant=variant_name(t),
            config=config_name(t),
            task=t.get(Tag.TASK, "?"),
            attention=t.get(Tag.ATTENTION, "?"),
            flow=t.get(Tag.FLOW, "?"),
            seed=t.get(Tag.SEED, ""),
            model_run_id=run.run_id,
            model_status=run.status,
            model_error=t.get(Tag.ERROR_MESSAGE, ""),
            model_metrics=dict(run.metrics),
            model_params=dict(run.params),
            registered=t.get(Tag.REGISTERED_MODEL, ""),
        )
        if run.status == "FINISHED":
            e.predictions = _try_table(tracker, run.run_id, Artifact.PREDICTIONS)
            if e.predictions is None:
                notes.append(
                    f"{e.variant}: its test predictions ({Artifact.PREDICTIONS} of run "
                    f"{run.run_id}) are missing from the store"
                )
            e.has_alignments = _has(tracker, run.run_id, f"{Artifact.ALIGNMENTS_DIR}/test.pharaoh")
        abl = runs.ablations.get(run.run_id)
        if abl is not None:
            e.ablation_run_id, e.ablation_status = abl.run_id, abl.status
            e.ablation_error = abl.tags.get(Tag.ERROR_MESSAGE, "")
            e.ablation_params = dict(abl.params)
            e.skipped = {
                k[len(Tag.SKIPPED_PREFIX) :]: v
                for k, v in abl.tags.items()
                if k.startswith(Tag.SKIPPED_PREFIX)
            }
            if abl.status == "FINISHED":
                e.ablation_metrics = dict(abl.metrics)
                e.steps = _try_table(tracker, abl.run_id, Artifact.STEPS)
                if e.steps is None:
                    notes.append(
                        f"{e.variant}: its per-step ablation table ({Artifact.STEPS} of run "
                        f"{abl.run_id}) is missing from the store; its figures are empty"
                    )
                e.examples = _try_table(tracker, abl.run_id, Artifact.EXAMPLES)
                for rec in _try_json(tracker, abl.run_id, Artifact.HEATMAPS) or []:
                    (e.records if "rows" in rec else e.legacy_heatmaps).append(rec)
                e.has_browser = _has(tracker, abl.run_id, Artifact.BROWSER)
        entries.append(e)
    seed_var = _try_table(tracker, study_id, Artifact.SEED_VARIANCE)
    adversaries = adversary_frame(
        [tracker.get_run(i) for i in study.ids(Tag.ADVERSARY_RUN_IDS)],
        {e.model_run_id: e.variant for e in entries},
    )
    config_text = _try_text(tracker, study_id, Artifact.EXPERIMENT_TOML) or ""
    exp_json = _try_json(tracker, study_id, Artifact.EXPERIMENT_JSON) or {}
    return StudyData(
        study.tags.get(Tag.EXPERIMENT, "study"),
        study.experiment_id,
        study_id,
        entries,
        seed_var if seed_var is not None else pd.DataFrame(),
        config_text,
        status=study.status,
        notes=notes,
        experiment_json=exp_json,
        adversaries=adversaries,
    )


def adversary_frame(runs: list, variants: dict[str, str]) -> pd.DataFrame:
    """One row per trained adversary run (:mod:`attnstudy.adversaries`): ``variant``,
    ``model_run_id``, ``run_id``, ``status``, ``lambda``, ``init``, ``epochs``, ``n_examples``,
    ``n_steps`` and, per statistic of :data:`ADVERSARY_STATS`, its value with ``_ci_low`` /
    ``_ci_high`` (NaN where the run has none)."""
    rows = []
    for r in runs:
        m = r.metrics
        row = {
            "variant": variants.get(r.tags.get(Tag.SOURCE_RUN_ID, ""), variant_name(r.tags)),
            "model_run_id": r.tags.get(Tag.SOURCE_RUN_ID, ""),
            "run_id": r.run_id,
            "status": r.status,
            "lambda": float(r.params.get("lambda", r.tags.get(Tag.LAMBDA, "nan"))),
            "init": r.params.get("init", ""),
            "epochs": int(r.params.get("epochs", 0) or 0),
            "n_examples": m.get("adversary/n_examples", math.nan),
            "n_steps": m.get("adversary/n_steps", math.nan),
        }
        for stat in ADVERSARY_STATS:
            for suffix in ("", "_ci_low", "_ci_high"):
                row[f"{stat}{suffix}"] = m.get(f"adversary/{stat}{suffix}", math.nan)
        rows.append(row)
    return pd.DataFrame(rows)


def per_instance_adversary(data: StudyData) -> pd.DataFrame:
    """Jain & Wallace's per-instance adversary per model, as a point beside the trained ones:
    ``variant``, ``attention_jsd`` (mean ``adversarial_max_jsd``) and ``output_tvd`` (mean
    ``adversarial_max_tvd``) over the analysis-prefix steps of the top analysed layer (all
    heads) where a candidate within ε was found."""
    rows = []
    for e in data.entries:
        st = e.steps
        if st is None or "adversarial_max_jsd" not in st or "adversarial_found" not in st:
            continue
        if "prefix" in st and "analysis_prefix" in st:
            st = st[st["prefix"] == st["analysis_prefix"]]
        if "head" in st:
            st = st[st["head"] == -1]
        if "layer" in st and (st["layer"] >= 0).any():
            st = st[st["layer"] == st["layer"].max()]
        found = st[st["adversarial_found"].fillna(False).astype(bool)]
        if len(found):
            rows.append(
                {
                    "variant": e.variant,
                    "attention_jsd": float(found["adversarial_max_jsd"].mean()),
                    "output_tvd": float(found["adversarial_max_tvd"].mean()),
                }
            )
    return pd.DataFrame(rows)


def _pct(metrics: dict, key: str) -> str:
    v = metrics.get(key)
    return f"{100 * v:.2f}" if v is not None and math.isfinite(v) else ""


def model_rows(data: StudyData) -> list[dict[str, str]]:
    """One row per model run of the study (the table of training attempts): see
    :func:`training_row`."""
    return [
        training_row(
            e.variant, e.seed, e.model_status, e.model_metrics, e.model_params, e.model_run_id
        )
        for e in data.entries
    ]


def training_row(
    variant: str, seed: str, status: str, metrics: dict, params: dict, run_id: str
) -> dict[str, str]:
    """One training as a row: ``model``, ``seed``, ``status``, ``epochs`` trained, ``best
    epoch``, training ``minutes``, best dev and test WER and PER in % (test with ``beam``), the
    ``config`` (every used model and training field but the device) and the ``run`` id; a metric
    the run did not log (an interrupted training has no test numbers) is empty."""
    m, p = metrics, params
    config = "; ".join(
        f"{k}={v}"
        for k, v in sorted(p.items())
        if k.startswith(("model.", "training.")) and k != "training.device"
    )
    best_dev = "best_dev/wer" if "best_dev/wer" in m else "dev/wer"
    seconds = m.get("train/seconds")
    return {
        "model": variant,
        "seed": seed,
        "status": status,
        "epochs": str(int(m["train/epochs"])) if "train/epochs" in m else "",
        "best epoch": str(int(m["train/best_epoch"])) if "train/best_epoch" in m else "",
        "minutes": f"{seconds / 60:.1f}" if seconds is not None else "",
        "dev WER %": _pct(m, best_dev),
        "dev PER %": _pct(m, best_dev.replace("wer", "per")),
        "test WER %": _pct(m, "test/wer"),
        "test PER %": _pct(m, "test/per"),
        "beam": p.get("training.beam_size", ""),
        "config": config,
        "run": run_id,
    }


def experiment_training_rows(tracker: Tracker, experiment: str) -> list[dict[str, str]]:
    """Every model run of ``experiment`` (trained by ``attnstudy train`` or a study), oldest
    first, as :func:`training_row` s; an unfinished run's dev numbers are those of its last
    epoch (it logged no best_dev), and its minutes the time between its start and that epoch.

    Raises:
        LookupError: no such experiment.
    """
    exp_id = tracker.experiment_id(experiment, create=False)
    if exp_id is None:
        raise LookupError(f"no experiment {experiment!r} in the store")
    rows = []
    for r in reversed(tracker.search_runs([exp_id], f"tags.{Tag.KIND} = 'model'")):
        metrics = dict(r.metrics)
        if "train/epochs" not in metrics:
            history = tracker.metric_history(r.run_id, "dev/wer")
            if history:
                metrics["train/epochs"] = float(history[-1][0])
        rows.append(
            training_row(
                variant_name(r.tags),
                r.tags.get(Tag.SEED, ""),
                r.status,
                metrics,
                r.params,
                r.run_id,
            )
        )
    return rows


def timing_rows(data: StudyData) -> list[dict[str, str]]:
    """Where each ablation run's time went, as rows of cell text: ``model``, ``seed``,
    ``steps`` (analysed decoder steps), ``seconds`` (the whole battery, wall clock),
    ``steps per second``, and the share in % of each ablation of the battery that ran (its
    ``timing/<ablation>_seconds`` over the battery's seconds). Wall-clock numbers of the machine
    and load the run had; a model without a finished ablation run has no row."""
    names = list(dict.fromkeys(n for e in data.entries for n in e.ablations_run))
    rows = []
    for e in data.entries:
        m = e.ablation_metrics
        seconds, rate = m.get("ablation/seconds"), m.get("timing/steps_per_second")
        if e.ablation_status != "FINISHED" or not seconds or rate is None:
            continue
        steps = m.get("timing/steps", round(rate * seconds))  # runs before timing/steps
        row = {
            "model": e.variant,
            "seed": e.seed,
            "steps": str(int(steps)),
            "seconds": f"{seconds:.1f}",
            "steps per second": f"{rate:.3g}",
        }
        for name in names:  # one set of columns for every row
            part = m.get(f"timing/{name}_seconds")
            row[f"{name} %"] = f"{100 * part / seconds:.1f}" if part is not None else ""
        rows.append(row)
    return rows


def seed_variance_rows(data: StudyData) -> list[dict[str, str]]:
    """The seed variance per configuration as rows of cell text: ``model``, ``seed pairs``,
    ``steps``, ``attention JSD``, ``output TVD``, ``argmax differs`` (micro-averages over the
    steps of every pair, ``value [low, high]`` with a 95 % bootstrap resampling examples, as the
    suite's statistics)."""
    from .analysis.suite import step_mean_ci

    df = data.seed_variance
    if df.empty:
        return []
    cfg = (
        _bootstrap_cfg(data.entries[0])
        if data.entries
        else SimpleNamespace(bootstrap_resamples=1000, seed=0)
    )
    rows = []
    for variant, part in df.groupby("variant", sort=False):
        row = {
            "model": variant,
            "seed pairs": str(len(part[["seed_a", "seed_b"]].drop_duplicates())),
            "steps": str(len(part)),
        }
        for column, label in (
            ("seed_variance_attention_jsd", "attention JSD"),
            ("seed_variance_output_tvd", "output TVD"),
            ("seed_variance_argmax_differs", "argmax differs"),
        ):
            row[label] = Estimate(*step_mean_ci(part, column, cfg)).fmt(3)
        rows.append(row)
    return rows


ADVERSARY_HEADER = ["model", "λ", "init", "epochs", *ADVERSARY_STATS.values()]


def adversary_rows(data: StudyData) -> list[dict[str, str]]:
    """The trained adversaries as rows of cell text (:data:`ADVERSARY_HEADER` plus ``run``, the
    adversary run id), by model and λ; every number ``value [low, high]`` (95 % bootstrap over
    examples)."""
    df = data.adversaries
    if df.empty:
        return []
    rows = []
    for _, r in df.sort_values(["variant", "lambda"], kind="stable").iterrows():
        if r["status"] != "FINISHED":
            cells = [f"not finished ({r['status']})"] * 3
        else:
            cells = [
                Estimate(r[s], r[f"{s}_ci_low"], r[f"{s}_ci_high"]).fmt(3)
                if math.isfinite(r[s])
                else "not logged"
                for s in ADVERSARY_STATS
            ]
        values = [r["variant"], f"{r['lambda']:g}", r["init"], str(r["epochs"]), *cells]
        rows.append(dict(zip(ADVERSARY_HEADER, values)) | {"run": r["run_id"]})
    return rows


def adversary_table(data: StudyData) -> dict | None:
    """The report's table of trained adversaries (:func:`adversary_rows`), or None without any."""
    rows = adversary_rows(data)
    if not rows:
        return None
    return _table(
        "Trained adversaries: can a model attend differently and predict the same?",
        "Wiegreffe & Pinter (2019), §4: per model and λ, a second model trained to keep the base "
        "model's output distributions (TVD) while moving its attention away (−λ·KL), compared "
        "with the base model at every decoder step of the test sample (reference prefix). A large "
        "attention JSD with a small output TVD means another model attends very differently "
        "and predicts the same.",
        ADVERSARY_HEADER,
        [[r[h] for h in ADVERSARY_HEADER] for r in rows],
    )


def _missing(tracker, run_id: str, path: str) -> bool:
    try:
        return not tracker.has_artifact(run_id, path)
    except Exception:  # noqa: BLE001 - a store error is reported by the load that follows
        return False


def _has(tracker, run_id: str, path: str) -> bool:
    try:
        return tracker.has_artifact(run_id, path)
    except Exception:  # noqa: BLE001 - then the report simply does not link it
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


# ----------------------------------------------------------------------------- numbers


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)[:60].strip("_")


def _bootstrap_cfg(e: ModelEntry) -> SimpleNamespace:
    def get(key, cast, default):
        try:
            return cast(e.ablation_params[key])
        except (KeyError, ValueError):
            return default

    return SimpleNamespace(
        bootstrap_resamples=get("ablation.bootstrap_resamples", int, 1000),
        seed=get("ablation.seed", int, 0),
    )


def task_estimates(e: ModelEntry) -> dict[str, Estimate]:
    """Test metrics with 95 % percentile bootstrap intervals over the test examples (the model
    run's predictions): exact match (mean of ``correct``) and PER (Σ edit distance / Σ reference
    length). A point value is shown with an interval only if it reproduces the logged metric."""
    from .analysis.suite import ratio_ci

    m = e.model_metrics
    out: dict[str, Estimate] = {}
    p = e.predictions
    cfg = _bootstrap_cfg(e)
    for key in ("test/exact_match", "test_heldin/exact_match", "test_heldout/exact_match"):
        if key not in m:
            continue
        out[key] = Estimate(float(m[key]), n=int(m.get("test/n", 0)) or None)
        if p is not None and "correct" in p and key == "test/exact_match":
            c = p["correct"].astype(float).to_numpy()
            r = ratio_ci(c, np.ones_like(c), cfg)
            if r and abs(r[0] - m[key]) < 1e-9:
                out[key] = Estimate(r[0], r[1], r[2], len(c))
    if "test/per" in m:
        out["test/per"] = Estimate(float(m["test/per"]))
        if p is not None and "edit_distance" in p:
            if "reference_length" in p:
                lengths = p["reference_length"].astype(float).to_numpy()
            else:  # stores of earlier versions: space-joined reference tokens
                lengths = (
                    p["reference"].astype(str).str.split(" ").map(len).astype(float).to_numpy()
                )
            r = ratio_ci(p["edit_distance"].astype(float).to_numpy(), lengths, cfg)
            if r and abs(r[0] - m["test/per"]) < 1e-9:
                out["test/per"] = Estimate(r[0], r[1], r[2], len(lengths))
    return out


def n_layers(e: ModelEntry) -> int:
    """Single layers analysed (all heads jointly) in the model's per-step table."""
    if e.steps is None or e.steps.empty or "layer" not in e.steps.columns:
        return 1
    from .analysis.layers import layers_of

    return len(layers_of(e.steps))


def layer_facts(e: ModelEntry, base: ModelFacts) -> list[ModelFacts]:
    """Per-layer facts and the layer mean for a model with several layers (else ``[]``)."""
    if n_layers(e) < 2:
        return []
    from .analysis.layers import layer_summaries

    names = [n for n in e.ablations_run if n not in e.skipped]
    cfg = AblationConfig(
        bootstrap_resamples=_bootstrap_cfg(e).bootstrap_resamples, seed=_bootstrap_cfg(e).seed
    )
    out = []
    per = layer_summaries(e.steps, names, cfg, e.analysis_prefix)
    for key, metrics in per.items():
        label = f"{e.variant} · layer {key}" if key != "mean" else f"{e.variant} · layer mean"
        if key != "mean":
            # per-example ablations (the global permutation) are not in the per-step table: the
            # suite logged each layer's as ablation/layer<k>/<name>/<stat>
            prefix = f"ablation/layer{key}/"
            metrics = {
                "ablation/" + k[len(prefix) :]: v
                for k, v in e.ablation_metrics.items()
                if k.startswith(prefix) and "/head" not in k
            } | dict(metrics)
        f = facts_from(label, e, metrics)
        f.n_examples = base.n_examples
        out.append(f)
    return out


def shifted_alignment(e: ModelEntry, t: VerdictThresholds):
    """(offset, gold mass at the offset, gold mass in place) when the attention sits a source
    position off the gold links (by at least ``t.shift_gain``), else None; from the example
    records (reference prefix), with bootstrap intervals over examples."""
    from .analysis.suite import ratio_ci

    offsets = gold_mass_by_offset(e.records)
    if not offsets or len(offsets[0][1]) < 2:
        return None
    cfg = _bootstrap_cfg(e)
    est = {}
    for k, (num, den) in offsets.items():
        r = ratio_ci(num, den, cfg)
        if r is not None:
            est[k] = Estimate(r[0], r[1], r[2], len(num))
    if 0 not in est:
        return None
    best = max((k for k in est if k != 0), key=lambda k: est[k].value, default=None)
    if best is None or est[best].value - est[0].value < t.shift_gain:
        return None
    return best, est[best], est[0]


def facts_from(name: str, e: ModelEntry, metrics: dict) -> ModelFacts:
    """:func:`attnstudy.findings.facts_from_metrics` of a model's entry: every statistic of the
    catalogue, and its task's metrics (the task registry's)."""
    return facts_from_metrics(
        name,
        e.attention,
        metrics,
        stat_keys=catalogue.stat_keys(),
        params=e.ablation_params,
        task_metrics=e.model_metrics,
        task_keys=[m.key for m in task_metrics([e.task])],
    )


def model_facts(e: ModelEntry, t: VerdictThresholds) -> ModelFacts:
    """What the verdicts are computed from for one model: its ablation summary metrics with
    their bootstrap intervals, its task metrics, its number of test examples, and the shifted
    alignment check (:func:`shifted_alignment`, thresholds ``t``)."""
    f = facts_from(e.variant, e, e.ablation_metrics)
    f.task_metrics = task_estimates(e)
    if e.steps is not None and len(e.steps) and not f.n_examples:
        f.n_examples = int(e.steps["example_id"].nunique())
    f.shift = shifted_alignment(e, t)
    return f


# ----------------------------------------------------------------------------- reasons


def _per_example(key: str) -> bool:
    """Whether ``ablation/<name>/…`` is a per-example ablation (the global permutation): the suite
    measures it per layer, and the layer mean (a mean over per-step tables) has none."""
    from .analysis.catalogue import get_ablation

    try:
        return get_ablation(key.split("/")[1]).unit == "example"
    except (KeyError, IndexError, ValueError):
        return False


def reason(e: ModelEntry, key: str) -> str:
    """Why a summary cell has no value: the model or ablation failed, was not run, does not apply."""
    if e.model_status != "FINISHED":
        return "training failed" if e.model_status == "FAILED" else e.model_status.lower()
    if not key.startswith("ablation/"):
        return "not measured"
    name = key.split("/")[1]
    if e.ablation_run_id is None:
        return "not run"
    if e.ablation_status != "FINISHED":
        return "failed" if e.ablation_status == "FAILED" else str(e.ablation_status).lower()
    if name not in e.ablations_run:
        return "not run"
    if e.attention == "none" and not key.endswith("tau_grad_loo"):
        return "no attention"
    if name in e.skipped:
        return "no attention" if "no attention" in e.skipped[name] else "skipped"
    m = e.ablation_metrics
    if name == "alignment":
        n, skipped = m.get("ablation/alignment/n_steps"), m.get("ablation/alignment/n_skipped")
        if n is not None and skipped == n:
            return "no gold links"
    undefined = m.get(f"{key}_n_undefined")
    n_steps = m.get(f"ablation/{name}/n_steps")
    if undefined is not None and n_steps:
        return f"undefined ({int(undefined)} of {int(n_steps)} steps)"
    return "undefined"


# ----------------------------------------------------------------------------- links


def ui_base_url(ui_url: str | None = None, tracking_uri: str | None = None) -> str:
    """The MLflow UI the report links to.

    In order: ``ui_url`` (``--ui-url``), ``$ATTNSTUDY_UI_URL``, the tracking URI when it is an
    http(s) tracking server (``attnstudy server`` / ``mlflow server`` serve the UI at the same
    address), else http://127.0.0.1:5000 (what ``attnstudy ui`` serves for a local SQLite store).

    Args:
        ui_url: an explicit UI address, or None.
        tracking_uri: the store the study was read from (e.g. ``Tracker.uri``), or None.

    Returns:
        The base URL without a trailing slash.
    """
    server = (
        tracking_uri if tracking_uri and tracking_uri.startswith(("http://", "https://")) else None
    )
    return (ui_url or os.environ.get("ATTNSTUDY_UI_URL") or server or DEFAULT_UI_URL).rstrip("/")


class Links:
    """URLs into the MLflow UI (the model-training views) of one study."""

    def __init__(self, base: str, experiment_id: str):
        self.base, self.exp = base, experiment_id

    def run(self, run_id: str) -> str:
        return f"{self.base}/#/experiments/{self.exp}/runs/{run_id}?{ML_VIEW}"

    def artifact(self, run_id: str, path: str) -> str:
        return f"{self.base}/#/experiments/{self.exp}/runs/{run_id}/artifacts/{path}?{ML_VIEW}"

    def runs(self) -> str:
        return f"{self.base}/#/experiments/{self.exp}/runs?{ML_VIEW}"

    def version(self, ref: str) -> str:
        name, _, version = ref.rpartition("/")
        return f"{self.base}/#/models/{name}/versions/{version}"


# ----------------------------------------------------------------------------- the context


def _cell(est: Estimate | None, fallback: str, pct: bool = False) -> str:
    if est is None:
        return fallback
    return est.fmt(3)


def _table(title: str, intro: str, header: list[str], rows: list[list[str]]) -> dict:
    return {"title": title, "intro": intro, "header": header, "rows": rows}


def summary_tables(
    data: StudyData, facts: dict[str, ModelFacts], layers: dict[str, list[ModelFacts]]
) -> list[dict]:
    """The report's tables: one per question of the catalogue (:func:`attnstudy.analysis.catalogue.
    questions`), a row per model (and per layer and the layer mean for a multi-layer model), a
    column per statistic the catalogue shows for it (the task registry's metrics for ``task``),
    every number ``value [low, high]``, a reason where there is none."""
    ran = [n for n in list_ablations() if any(n in e.ablations_run for e in data.entries)]
    columns: dict[str, list[tuple[str, str]]] = {}
    for m in task_metrics(dict.fromkeys(e.task for e in data.entries)):
        if any(m.key in e.model_metrics for e in data.entries):
            columns.setdefault("task", []).append((m.key, m.label))
    for st in catalogue.shown_stats(ran):
        columns.setdefault(st.stat.question, []).append((st.key, st.stat.label))
    tables = []
    for q, question in catalogue.questions(ran).items():
        stats = columns.get(q)
        if not stats:
            continue
        header = ["model", "examples", "steps"] if q != "task" else ["model", "test examples"]
        header += [label for _, label in stats]
        rows = []
        for e in data.entries:
            f = facts.get(e.model_run_id)
            for ff in [f] + (layers.get(e.model_run_id, []) if q != "task" else []):
                row = [ff.name if ff else e.variant]
                if q == "task":
                    n = e.model_metrics.get("test/n")
                    row.append(f"{int(n):,}" if n else reason(e, "test/n"))
                    row += [
                        _cell(ff.task_metrics.get(key) if ff else None, reason(e, key))
                        for key, _ in stats
                    ]
                else:
                    # a failed ablation analysed no examples, whatever it was asked for
                    measured = e.ablation_status == "FINISHED"
                    why = reason(e, stats[0][0])
                    row += [
                        str(ff.n_examples) if ff and ff.n_examples and measured else why,
                        str(ff.n_steps) if ff and ff.n_steps and measured else why,
                    ]
                    mean_row = ff is not None and ff is not f and ff.name.endswith("layer mean")
                    row += [
                        _cell(
                            ff.stats.get(key) if ff else None,
                            "per layer only" if mean_row and _per_example(key) else reason(e, key),
                        )
                        for key, _ in stats
                    ]
                rows.append(row)
        tables.append(_table(question.title, question.intro, header, rows) | {"key": q})
    return tables


STUDY_FIGURES = {
    "summary": (
        "All statistics with their 95 % intervals",
        "One point per model and statistic, grouped by question; the bar is the 95 % bootstrap "
        "interval over examples, the label gives value [low, high] and n examples. Read across a "
        "row to compare models on one test. With more than eight models each statistic is a "
        "panel of its own with the models named on its axis, and the values are in Numbers per "
        "model, above.",
    ),
    "accuracy_by_length": (
        "Task accuracy by source length",
        "What attention adds to the task: exact match per source-length bucket, one panel per "
        "task (with the no-attention baseline where the study has one). Bars are Wilson 95 % "
        "intervals, numbers the test examples per point; hollow points rest on fewer than 20 "
        "examples and should not be read as trends.",
    ),
    "heatmaps": (
        "Examples: attention, its adversary, gradient and leave-one-out",
        "Per model, the best, median and worst analysed example by the example's mean Kendall τ "
        "between attention and leave-one-out importance. Rows are the analysed prefix (the model's "
        "own greedy prediction, marked as such; 'X ≠ Y': the predicted X differs from the "
        "reference Y); ␣ is a space. Attention and adversarial share one 0–1 scale; gradient and "
        "leave-one-out are scaled per row. The last column is teacher-forced on the reference, "
        "with gold links boxed (solid: sure, dashed: possible). Every example: the example browser.",
    ),
    "trained_adversary": (
        "Trained adversaries against per-instance adversaries",
        "Wiegreffe & Pinter (2019) §4 / fig. 5: attention JSD from the base model against output "
        "TVD from it, per model: the model-consistent adversaries for each λ (mean over the test "
        "steps, 95 % intervals), beside Jain & Wallace's per-instance adversary (mean max JSD "
        "and its TVD over the steps where one was found) and the seed variance (mean over pairs "
        "of seeds) where the study has them. Points far right and low: attention that other "
        "models or rows can replace without changing the output.",
    ),
    "seed_variance": (
        "Seed variance",
        "Wiegreffe & Pinter (2019) fig. 3: per step and pair of seeds of one configuration, the JSD "
        "between their attention against the TVD between their outputs; attention that varies "
        "across seeds with the same output is one more sign that it is not the explanation.",
    ),
}
"""Title and caption of the figures of the whole study (the ablations' own figures, with theirs,
are in the catalogue: :func:`attnstudy.analysis.catalogue.figures`)."""


def _figures(data: StudyData, facts, layers, palette, eps) -> list[dict]:
    steps = data.steps
    analysis = (
        steps[steps["prefix"] == steps["analysis_prefix"]]
        if len(steps) and "prefix" in steps
        else steps
    )
    out = []
    all_facts = [f for e in data.entries if (f := facts.get(e.model_run_id))]
    # a model with several layers: its layers and their mean (its own row is one of its layers)
    all_facts = [x for f in all_facts for x in (layers.get(_run_of(data, f)) or [f])]
    est = estimates_table([f for f in all_facts if f.attention != "none"])
    layer_pal = dict(palette)
    for f in all_facts:
        if f.name not in layer_pal:
            base = f.name.split(" · ")[0]
            shades = [x.name for x in all_facts if x.name.split(" · ")[0] == base]
            layer_pal[f.name] = figures._shade(
                palette.get(base, (0.3, 0.3, 0.3)), shades.index(f.name), len(shades)
            )
    if len(est):
        out.append(("summary", figures.estimates_plot(est, layer_pal), STUDY_FIGURES["summary"]))
    out.append(
        (
            "accuracy_by_length",
            figures.accuracy_by_length(data.predictions, palette),
            STUDY_FIGURES["accuracy_by_length"],
        )
    )
    ran = [n for n in list_ablations() if any(n in e.ablations_run for e in data.entries)]
    for spec, fig in catalogue.figures(ran):  # each ablation's figure, as its spec declares it
        drawn = figures.FIGURE_KINDS[fig.kind](
            figures.FigureInput(
                steps,
                analysis,
                palette,
                eps,
                columns={
                    st.column: st.label for st in spec.stats.values() if st.column and st.label
                },
                reference=spec.prefix == "reference",
            ),
            fig.title,
        )
        key = fig.kind if fig.kind != "stat_distributions" else spec.name
        out.append((key, drawn, (fig.title, fig.caption)))
    for e in data.entries:
        if e.records:
            table = per_example_summary(e.steps, e.examples, e.analysis_prefix)
            shown = pick_shown(table)
            by_id = {r["id"]: r for r in e.records}
            shown = [s for s in shown if s["example_id"] in by_id]
            f = facts.get(e.model_run_id)
            fig = figures.example_heatmaps(
                [by_id[s["example_id"]] for s in shown], e.variant, f.eps if f else eps, shown
            )
            out.append((f"heatmaps_{_slug(e.variant)}", fig, _heatmaps_caption(e)))
        elif e.legacy_heatmaps:
            out.append(
                (
                    f"heatmaps_{_slug(e.variant)}",
                    figures.attention_heatmaps(
                        [
                            h | {"title": f"{e.variant}: {h.get('title', '')}"}
                            for h in e.legacy_heatmaps
                        ]
                    ),
                    _heatmaps_caption(e),
                )
            )
    if not data.seed_variance.empty:
        out.append(
            (
                "seed_variance",
                figures.seed_variance(data.seed_variance, palette),
                STUDY_FIGURES["seed_variance"],
            )
        )
    if not data.adversaries.empty:
        out.append(
            (
                "trained_adversary",
                figures.trained_adversaries(
                    data.adversaries,
                    per_instance_adversary(data),
                    data.seed_variance,
                    palette,
                ),
                STUDY_FIGURES["trained_adversary"],
            )
        )
    result = []
    for key, fig, (title, caption) in out:
        png = figure_png(fig)
        result.append(
            {
                "key": key,
                "file": f"figures/{key}.png",
                "title": title,
                "caption": caption,
                "png": png,
                "data_uri": "data:image/png;base64," + base64.b64encode(png).decode("ascii"),
            }
        )
    return result


def _heatmaps_caption(e: ModelEntry) -> tuple[str, str]:
    title, caption = STUDY_FIGURES["heatmaps"]
    return f"{title}: {_slug(e.variant).replace('_', ' ')}", caption


def _run_of(data: StudyData, f: ModelFacts) -> str:
    for e in data.entries:
        if e.variant == f.name:
            return e.model_run_id
    return ""


def thresholds_of(data: StudyData, override: dict | None = None) -> VerdictThresholds:
    """The verdict's thresholds: the study's ``[report.verdict]`` (its logged experiment.json),
    then ``override`` (``attnstudy report --verdict KEY=VALUE``)."""
    base = ((data.experiment_json or {}).get("report") or {}).get("verdict") or {}
    return VerdictThresholds.model_validate(base | dict(override or {}))


def report_context(
    data: StudyData,
    ui_url: str | None = None,
    thresholds: VerdictThresholds | None = None,
) -> dict:
    """Everything both templates render (the HTML and its Markdown twin show the same data)."""
    t = thresholds or thresholds_of(data)
    links = Links(ui_base_url(ui_url), data.experiment_id)
    palette = figures.variant_palette([e.variant for e in data.entries])
    facts = {e.model_run_id: model_facts(e, t) for e in data.entries}
    layers = {e.model_run_id: layer_facts(e, facts[e.model_run_id]) for e in data.entries}
    findings = []
    verdicts, vfacts, vconfigs = [], [], []
    for e in data.entries:
        f = facts[e.model_run_id]
        if e.model_status != "FINISHED":
            findings.append(
                {
                    "model": e.variant,
                    "text": f"Training {reason(e, 'test/x')}: "
                    f"{e.model_error or 'no reason recorded'}.",
                    "layers": [],
                }
            )
            continue
        if e.ablation_status not in (None, "FINISHED"):
            findings.append(
                {
                    "model": e.variant,
                    "text": f"Ablations {reason(e, 'ablation/x/y')}: "
                    f"{e.ablation_error or 'no reason recorded'}.",
                    "layers": [],
                }
            )
            continue
        if e.ablation_run_id is None:
            findings.append(
                {"model": e.variant, "text": "Not ablated in this study.", "layers": []}
            )
            continue
        v = verdict(f, t)
        verdicts.append(v)
        vfacts.append(f)
        vconfigs.append(e.config)
        findings.append(
            {
                "model": e.variant,
                "text": v.text,
                "layers": [
                    {"name": lf.name, "text": verdict(lf, t).text} for lf in layers[e.model_run_id]
                ],
                "categories": v.answers,
            }
        )
    eps_values = {f.eps for f in facts.values() if f.eps is not None}
    eps = next(iter(eps_values)) if len(eps_values) == 1 else None
    p_values = {f.n_permutations for f in facts.values() if f.n_permutations}
    prefixes = {e.analysis_prefix for e in data.entries if e.ablation_run_id}
    seeds = {e.seed for e in data.entries}
    by_config = {}
    for e in data.entries:
        by_config.setdefault(e.config, set()).add(e.seed)
    one_seed = all(len(s) == 1 for s in by_config.values())
    figs = _figures(data, facts, layers, palette, eps)
    runs = []
    for e in data.entries:
        f = facts[e.model_run_id]
        runs.append(
            {
                "model": e.variant,
                "model_run": e.model_run_id,
                "model_url": links.run(e.model_run_id),
                "ablation_run": e.ablation_run_id,
                "ablation_url": links.run(e.ablation_run_id) if e.ablation_run_id else None,
                "browser_file": f"examples/{_slug(e.variant)}.html"
                if e.records or e.steps is not None
                else None,
                "browser_url": links.artifact(e.ablation_run_id, Artifact.BROWSER)
                if e.has_browser
                else None,
                "registered": e.registered,
                "registered_url": links.version(e.registered) if e.registered else None,
                "alignments_url": links.artifact(e.model_run_id, Artifact.ALIGNMENTS_DIR)
                if e.has_alignments
                else None,
                "n_examples": f.n_examples,
                "n_steps": f.n_steps,
            }
        )
    return {
        "title": f"Is this model's attention an explanation? — {data.experiment}",
        "experiment": data.experiment,
        "experiment_id": data.experiment_id,
        "study_id": data.study_id,
        "study_url": links.run(data.study_id),
        "runs_url": links.runs(),
        "ui_url": links.base,
        "status_lines": status_lines(data),
        "overall": overall(verdicts, vfacts, vconfigs)
        if verdicts
        else "No model of this study was ablated.",
        "findings": findings,
        "tables": summary_tables(data, facts, layers),
        "extra_tables": [t for t in (adversary_table(data),) if t is not None],
        "figures": figs,
        "runs": runs,
        "settings": {
            "eps": ", ".join(f"{x:g}" for x in sorted(eps_values)) or None,
            "permutations": ", ".join(str(x) for x in sorted(p_values)) or None,
            "prefix": ", ".join(sorted(prefixes)) or None,
            "seeds": ", ".join(sorted(seeds)),
            "one_seed": one_seed,
            "bootstrap": _bootstrap_cfg(data.entries[0]).bootstrap_resamples
            if data.entries
            else 1000,
            "criterion": SHOW_CRITERION,
        },
        "thresholds": [
            {"key": k, "value": getattr(t, k), "description": fld.description}
            for k, fld in VerdictThresholds.model_fields.items()
        ],
        "definitions": catalogue.definitions(
            {n for e in data.entries for n in e.ablations_run} | set(list_ablations(True))
        ),
        "references": REFERENCES,
        "literature": LITERATURE,
        "config_text": data.config_text or "(not logged)",
    }


def status_lines(data: StudyData) -> list[dict]:
    """What the study's status and failures mean for the report: ``{"text", "item"}`` lines."""
    lines = [{"text": f"Note: {n}.", "item": False} for n in data.notes]
    ran = {n for e in data.entries for n in e.ablations_run}
    not_run = [a for a in list_ablations(default_only=True) if a not in ran]
    if not_run:
        lines.append(
            {"text": f"Ablations not run in this study: {', '.join(not_run)}.", "item": False}
        )
    if data.status != "FINISHED":
        lines.append(
            {
                "text": f"Study status: **{data.status}**: the report shows what the store holds for it.",
                "item": False,
            }
        )
    for e in data.entries:
        if e.model_status == "FAILED":
            lines.append(
                {
                    "text": f"{e.variant}: training failed ({e.model_error or 'no reason recorded'})",
                    "item": True,
                }
            )
        elif e.ablation_status == "FAILED":
            lines.append(
                {
                    "text": f"{e.variant}: ablations failed ({e.ablation_error or 'no reason recorded'})",
                    "item": True,
                }
            )
    return lines


def summary_frame(context: dict) -> pd.DataFrame:
    """The cross-model summary: one row per model (and layer), a column per statistic, each cell
    ``value [low, high]`` or the reason there is none (the study run's ``summary.csv``/``.json``).

    Rows keep the report's order (its longest table's: each model with its layer rows under it),
    not the join's lexicographic one, which put a seed-1 model's layer rows after seeds 2 and 3.
    """
    frames = []
    for table in context["tables"]:
        df = pd.DataFrame(table["rows"], columns=table["header"])
        frames.append(df.set_index("model"))
    if not frames:
        return pd.DataFrame()
    out = frames[0]
    for df in frames[1:]:
        out = out.join(df[[c for c in df.columns if c not in out.columns]], how="outer")
    order = dict.fromkeys(n for df in sorted(frames, key=len, reverse=True) for n in df.index)
    return out.reindex(list(order)).reset_index()


def render_html(context: dict) -> str:
    """``report.html`` from :func:`report_context`'s data (Jinja2, images embedded)."""
    return render("report.html.j2", **context)


def render_markdown(context: dict) -> str:
    """``report.md`` from the same data as :func:`render_html`."""
    return render("report.md.j2", **context)


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


def summary_cells(table: pd.DataFrame) -> list[dict[str, str]]:
    """The summary table's rows as cell text for ``<experiment>.csv``: a missing value (a layer
    row's model-level columns, say) is an empty cell, never the text ``nan``."""
    return [
        {k: "" if pd.isna(v) else str(v) for k, v in r.items()} for r in table.to_dict("records")
    ]


def build_report(
    tracker,
    study_id: str,
    out_dir: str | Path | None = None,
    ui_url: str | None = None,
    verdict_overrides: dict | None = None,
    results_dir: str | Path | None = None,
) -> Path:
    """Build the report of a study and log it to the study run.

    The folder is written whole or not at all: everything goes to a temporary folder beside it,
    which then replaces the old one, so an interrupted build never mixes two reports.

    Args:
        tracker: :class:`attnstudy.tracking.Tracker`.
        study_id: the study run.
        out_dir: output folder (default :func:`report_dir` of the study's experiment).
        ui_url: the MLflow UI the links point to (default :func:`ui_base_url` of the
            tracker's URI: the tracking server itself when the store is one).
        verdict_overrides: threshold values over the study's ``[report.verdict]``.
        results_dir: also write the summary tables there as ``<experiment>.csv`` (the
            statistics), ``<experiment>-models.csv`` (:func:`model_rows`: the trainings),
            ``<experiment>-seed-variance.csv`` (:func:`seed_variance_rows`) and
            ``<experiment>-adversaries.csv`` (:func:`attnstudy.results.write_results`), each row
            naming the study run.

    Returns:
        Path of ``report.html``.
    """
    from .browser import browser_data, browser_html

    data = load_study(tracker, study_id)
    ui = ui_base_url(ui_url, tracker.uri)
    context = report_context(data, ui, thresholds_of(data, verdict_overrides))
    table = summary_frame(context)

    def build(tmp: Path) -> None:
        (tmp / "figures").mkdir()
        for fig in context["figures"]:
            (tmp / fig["file"]).write_bytes(fig["png"])
        (tmp / "examples").mkdir()
        for e, run in zip(data.entries, context["runs"]):
            if run["browser_file"]:
                f = model_facts(e, thresholds_of(data, verdict_overrides))
                meta = {
                    "title": e.variant,
                    "run_id": e.ablation_run_id,
                    "model_run_id": e.model_run_id,
                    "prefix": e.analysis_prefix,
                    "eps": f.eps,
                    "n_permutations": f.n_permutations,
                    "n_examples": f.n_examples,
                }
                page = browser_html(
                    browser_data(e.records, e.steps, e.examples, e.predictions, meta)
                )
                (tmp / run["browser_file"]).write_text(page, encoding="utf-8")
        (tmp / "summary.csv").write_text(table.to_csv(index=False), encoding="utf-8")
        if not data.adversaries.empty:
            pd.DataFrame(adversary_rows(data)).to_csv(tmp / "adversaries.csv", index=False)
        (tmp / "report.html").write_text(render_html(context), encoding="utf-8")
        (tmp / "report.md").write_text(render_markdown(context), encoding="utf-8")

    stores = store_folders_of(tracker.uri)
    results = None
    if results_dir is not None:  # checked before the report is written, written after
        from .results import result_files

        study = {"study run": study_id}
        results = result_files(
            data.experiment,
            {
                "": [r | study for r in summary_cells(table)],
                "-adversaries": [r | study for r in adversary_rows(data)],
                "-models": [r | study for r in model_rows(data)],
                "-seed-variance": [r | study for r in seed_variance_rows(data)],
                "-timing": [r | study for r in timing_rows(data)],
            },
        )
        check_files(results_dir, results, option="--results", store_folders=stores)
    out = replace_folder(
        out_dir if out_dir else report_dir(data.experiment),
        build,
        kind=REPORT_KIND,
        option="--out" if out_dir else "the report folder",
        store_folders=stores,
    )
    for fig in context["figures"]:
        tracker.log_artifact(study_id, out / fig["file"], Artifact.FIGURES_DIR)
    tracker.log_artifacts(study_id, out, Artifact.REPORT_DIR)
    if results is not None:
        write_files(results_dir, results, option="--results", store_folders=stores)
    if len(table):
        tracker.log_table(study_id, table, Artifact.STUDY_SUMMARY)
        tracker.log_mlflow_table(study_id, table, Artifact.STUDY_SUMMARY_TABLE)
    return out / "report.html"


def _unused(*_):  # keep math imported for templates' helpers
    return math.nan
