"""The report's tables as rows of cell text: the summary tables, one per question of the catalogue
(:func:`summary_tables`), and the reason a cell is empty (:func:`reason`); the trainings
(:func:`model_rows`, :func:`training_row`, :func:`experiment_training_rows`), where the ablation
time went (:func:`timing_rows`), the seed variance (:func:`seed_variance_rows`), the trained
adversaries (:func:`adversary_rows`, :func:`adversary_table`, :func:`per_instance_adversary`); the
status lines, and the cross-model summary (:func:`summary_frame`, :func:`summary_cells`)."""

from __future__ import annotations

import ast
import math
from types import SimpleNamespace

import pandas as pd

from attnstudy.pages.run_pages import variant_name
from attnstudy.study.adversaries import STATS as ADVERSARY_STATS
from attnstudy.verdict.findings import Estimate, ModelFacts, estimate, layer_name

from ..analysis import catalogue
from ..analysis.attribution_params import METHODS as ATTRIBUTION_METHODS
from ..analysis.catalogue import list_ablations
from ..data import tasks
from ..data.tasks import METRICS, TASKS, TRANSLATION_METRICS, report_metrics, task_metrics
from ..tracking import Tag, Tracker
from .facts import _bootstrap_cfg
from .prose import ADVERSARY_TABLE
from .store import ModelEntry, StudyData


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
            e.variant,
            e.seed,
            e.model_status,
            metrics=e.model_metrics,
            params=e.model_params,
            run_id=e.model_run_id,
            task=e.task,
        )
        for e in data.entries
    ]


def training_row(
    variant: str,
    seed: str,
    status: str,
    *,
    metrics: dict,
    params: dict,
    run_id: str,
    task: str | None = None,
) -> dict[str, str]:
    """One training as a row: ``model``, ``seed``, ``status``, ``epochs`` trained, ``best
    epoch``, training ``minutes``, the best dev and the test error rates in % of the task's
    metrics (``TaskMetric.error_rate``: ``dev WER %``, ``dev PER %``, ``test WER %``, ``test PER
    %`` for a task of :data:`~attnstudy.data.tasks.METRICS` or an unknown ``task``; the PER
    alone for a translation task), ``beam``, the ``config`` (every used model and training field
    but the device) and the ``run`` id; a metric the run did not log (an interrupted training has
    no test numbers) is empty. For a translation ``task`` (its registry entry lists
    :data:`~attnstudy.data.tasks.TRANSLATION_METRICS`) also ``CPU minutes``, ``best dev loss``
    and BLEU and chrF, greedy and beam, each ``value [low, high]`` (95 % bootstrap interval)."""
    m, p = metrics, params
    config = "; ".join(
        f"{k}={v}"
        for k, v in sorted(p.items())
        if k.startswith(("model.", "training.")) and k != "training.device"
    )
    best = "best_dev" if "best_dev/wer" in m else "dev"
    spec = TASKS.get(task or "")
    rates = [t.error_rate for t in (spec.metrics if spec else METRICS) if t.error_rate]
    seconds = m.get("train/seconds")
    return {
        "model": variant,
        "seed": seed,
        "status": status,
        "epochs": str(int(m["train/epochs"])) if "train/epochs" in m else "",
        "best epoch": str(int(m["train/best_epoch"])) if "train/best_epoch" in m else "",
        "minutes": f"{seconds / 60:.1f}" if seconds is not None else "",
        **{f"dev {r.upper()} %": _pct(m, f"{best}/{r}") for r in rates},
        **{f"test {r.upper()} %": _pct(m, f"test/{r}") for r in rates},
        "beam": p.get("training.beam_size", ""),
        **_translation_cells(m, task),
        "config": config,
        "run": run_id,
    }


def _translation_cells(m: dict, task: str | None) -> dict[str, str]:
    spec = TASKS.get(task or "")
    shown = [t for t in spec.metrics if t in TRANSLATION_METRICS] if spec else []
    if not shown:
        return {}
    cpu, loss = m.get("train/cpu_seconds"), m.get("best_dev/loss")
    cells = {
        "CPU minutes": f"{cpu / 60:.1f}" if cpu is not None else "",
        "best dev loss": f"{loss:.3f}" if loss is not None else "",
    }
    for t in shown:
        est = estimate(m, t.key)
        cells[t.label] = "" if est is None else f"{est.value:.1f} [{est.low:.1f}, {est.high:.1f}]"
    return cells


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
        metrics = report_metrics(r.tags.get(Tag.TASK, "?"), r.metrics)  # its error rate as per
        if "train/epochs" not in metrics:
            history = tracker.metric_history(r.run_id, "dev/wer")
            if history:
                metrics["train/epochs"] = float(history[-1][0])
        rows.append(
            training_row(
                variant_name(r.tags),
                r.tags.get(Tag.SEED, ""),
                r.status,
                metrics=metrics,
                params=r.params,
                run_id=r.run_id,
                task=r.tags.get(Tag.TASK),
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
    from ..analysis.suite import step_mean_ci

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
    title, intro = ADVERSARY_TABLE
    return _table(
        title,
        intro,
        ADVERSARY_HEADER,
        [[r[h] for h in ADVERSARY_HEADER] for r in rows],
    )


def _per_example(key: str) -> bool:
    """Whether ``ablation/<name>/…`` is a per-example ablation (the global permutation): the suite
    measures it per layer, and the layer mean (a mean over per-step tables) has none."""
    from ..analysis.catalogue import get_ablation

    try:
        return get_ablation(key.split("/")[1]).unit == "example"
    except (KeyError, IndexError, ValueError):
        return False


def _method_not_chosen(e: ModelEntry, name: str, stat: str) -> bool:
    """Whether ``stat`` belongs to an attribution method the ablation was not asked for (its
    ``methods`` setting, e.g. ``attribution_alignment``'s ``aer_saliency`` when only integrated
    gradients ran)."""
    chosen = e.ablation_params.get(f"ablation.{name}.methods")
    if not chosen:
        return False
    try:
        chosen = set(ast.literal_eval(chosen))
    except (ValueError, SyntaxError):
        return False
    own = [m for m in ATTRIBUTION_METHODS if stat.endswith(f"_{m}")]
    return bool(own) and not (set(own) & chosen)


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
    if _method_not_chosen(e, name, key.split("/")[2]):
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
        whys = undefined_reasons(e, key)
        if whys and sum(whys.values()) == int(undefined):  # only counts that add up are shown
            if len(whys) == 1:
                return f"undefined: {next(iter(whys))} ({int(undefined)} of {int(n_steps)} steps)"
            parts = ", ".join(f"{why} ({k} of {int(n_steps)} steps)" for why, k in whys.items())
            return f"undefined: {parts}"
        return f"undefined ({int(undefined)} of {int(n_steps)} steps)"
    return "undefined"


def undefined_reasons(e: ModelEntry, key: str) -> dict[str, int]:
    """Why a statistic is undefined at the steps its summary counted, as recorded by its ablation.

    The ablation's per-step table names the reason in a ``<name>_<part>_reason`` column (the
    importance ablation's ``importance_attn_reason``: "constant attention row", …); the column
    whose ``<part>`` the statistic's own column names (longest first) is read over the rows the
    summary metrics were computed on: the analysis prefix, the top analysed layer with all heads
    jointly (:func:`attnstudy.analysis.suite.run_suite`'s primary unit), rows the ablation did not
    skip, where the statistic is missing.

    Args:
        e: the model's entry (its per-step table ``e.steps``).
        key: ``ablation/<name>/<stat>``.

    Returns:
        reason → steps, most frequent first; empty when the table or a reason column is missing.
    """
    from ..analysis.catalogue import get_ablation

    st = e.steps
    try:
        _, name, stat = key.split("/")
        column = get_ablation(name).stats[stat].column
        spec = get_ablation(name)
    except (KeyError, ValueError):
        return {}
    if st is None or st.empty or column is None or column not in st.columns:
        return {}
    suffix = column.removeprefix(f"{name}_")
    reasons = sorted(
        (
            c
            for c in st.columns
            if c.startswith(f"{name}_")
            and c.endswith("_reason")
            and c[len(name) + 1 : -len("_reason")] in suffix
        ),
        key=len,
        reverse=True,
    )
    if not reasons:
        return {}
    rows = _summary_rows(st, e.analysis_prefix)
    missing = rows[column].isna()
    if spec.skipped in rows.columns:
        missing &= ~rows[spec.skipped].astype("boolean").fillna(False).astype(bool)
    counts = rows.loc[missing, reasons[0]].fillna("reason not recorded").value_counts()
    return {str(k): int(v) for k, v in counts.items()}


def _summary_rows(st: pd.DataFrame, prefix: str) -> pd.DataFrame:
    """The per-step rows the plain ``ablation/<name>/<stat>`` metrics were computed on: the
    analysis prefix, all heads jointly, the top analysed single layer (else all layers at once)."""
    if "prefix" in st.columns:
        st = st[st["prefix"] == prefix]
    if "head" in st.columns:
        st = st[st["head"] == -1]
    if "layer" in st.columns and (st["layer"] >= 0).any():
        st = st[st["layer"] == st["layer"].max()]
    return st


def data_label(params: dict[str, str]) -> str:
    """The data set a model was trained on, from its run's ``data.*`` params, for headings and
    the runs table: the task registry's label (:func:`attnstudy.data.tasks.data_label`:
    ``CMUdict`` (G2P), ``CLDR dates, locales …``, the TSV training file as recorded, the
    Greek–English New Testament, or the synthetic task with its vocabulary size and lengths)."""
    return tasks.data_label(params)


def model_label(e: ModelEntry, experiment: str) -> str:
    """A model named by its experiment and data set beside its variant, for the report's section
    headings and its runs table: ``g2p additive-bahdanau (experiment quickstart; data:
    CMUdict)``."""
    return f"{e.variant} (experiment {experiment}; data: {data_label(e.model_params)})"


def _cell(est: Estimate | None, fallback: str, pct: bool = False) -> str:
    if est is None:
        return fallback
    return est.fmt(3)


def _table(title: str, intro: str, header: list[str], rows: list[list[str]]) -> dict:
    return {"title": title, "intro": intro, "header": header, "rows": rows}


def measured_somewhere(data: StudyData, st: catalogue.ShownStat) -> bool:
    """Whether a statistic is a column of the study's tables: always, unless it is
    :attr:`~attnstudy.analysis.catalogue.Stat.optional`; an optional one where some model
    logged it (its value, or its count of undefined steps: its per-step column existed) or where
    no model's run of the ablation finished (the cells then say why: failed, not run). An optional
    statistic is left out only where every finished run lacks it: one the study's settings did
    not select (a faithfulness ranking left out of ``rankings``), not one that is undefined."""
    if not st.stat.optional:
        return True
    finished = [
        e
        for e in data.entries
        if e.ablation_status == "FINISHED"
        and st.ablation in e.ablations_run
        and st.ablation not in e.skipped
    ]
    return not finished or any(
        st.key in e.ablation_metrics or f"{st.key}_n_undefined" in e.ablation_metrics
        for e in finished
    )


def summary_tables(
    data: StudyData, facts: dict[str, ModelFacts], layers: dict[str, list[ModelFacts]]
) -> list[dict]:
    """The report's tables: one per question of the catalogue (:func:`attnstudy.analysis.catalogue.
    questions`), a row per model (and per layer and the layer mean for a multi-layer model), a
    column per statistic the catalogue shows for it (the task registry's metrics for ``task``;
    an optional statistic only where the study measured it, :func:`measured_somewhere`),
    every number ``value [low, high]``, a reason where there is none."""
    ran = [n for n in list_ablations() if any(n in e.ablations_run for e in data.entries)]
    columns: dict[str, list[tuple[str, str]]] = {}
    for m in task_metrics(dict.fromkeys(e.task for e in data.entries)):
        if any(m.key in e.model_metrics for e in data.entries):
            columns.setdefault("task", []).append((m.key, m.label))
    for st in catalogue.shown_stats(ran):
        if measured_somewhere(data, st):
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
                    steps = _steps(ff, [key for key, _ in stats]) if ff else None
                    per_example = measured and all(_per_example(key) for key, _ in stats)
                    row += [
                        str(ff.n_examples) if ff and ff.n_examples and measured else why,
                        str(steps)
                        if steps and measured
                        # a question only per-example ablations answer counts no steps
                        else "per example"
                        if per_example and ff and ff.n_examples
                        else why,
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
        notes = [] if q == "task" else [n for n in (heads_note(data),) if n]
        if q != "task" and any(" to " in row[2] for row in rows):
            notes.append(STEPS_RANGE_NOTE)
        tables.append(
            _table(question.title, question.intro, header, rows) | {"key": q, "notes": notes}
        )
    return tables


def analysed_heads(e: ModelEntry) -> tuple[int, int, int | None] | None:
    """(heads per layer, layers, analysed layer or None for all layers at once) of a model whose
    rows pool several attention heads, else None (one head, no attention, nothing analysed).

    The model's row in a table is its primary unit (:func:`_summary_rows`): one layer with all its
    heads jointly, or every layer's heads side by side; the layer is read from the per-step table,
    the head and layer counts from the model run's ``model.heads`` and ``model.layers`` params."""
    if e.attention == "none":
        return None
    try:
        heads = int(e.model_params.get("model.heads", 1))
        layers = int(e.model_params.get("model.layers", 1))
    except ValueError:
        return None
    layer = None
    if e.steps is not None and "layer" in e.steps.columns and len(e.steps):
        rows = _summary_rows(e.steps, e.analysis_prefix)
        if len(rows):
            value = int(rows["layer"].iloc[0])
            layer = value if value >= 0 else None
    if heads * (layers if layer is None else 1) < 2:
        return None
    return heads, layers, layer


def headline_unit(e: ModelEntry) -> str | None:
    """The unit of cross-attention a model's row of the tables and its findings read (its plain
    ``ablation/<name>/<stat>`` metrics): the ablation run's ``ablation.primary_unit`` tag
    (``"layer 2 of 2, all heads"``); for a run stored without it, read from its per-step table —
    the rows of :func:`_summary_rows` (``"layer 2, all heads"``), or, for a run that analysed
    heads one at a time before the plain keys held all heads, its first unit (``"layer 1, head
    1"``). None for a model without attention, not ablated, or whose table is missing."""
    if e.attention == "none" or not e.ablation_run_id:
        return None
    if e.primary_unit:
        return e.primary_unit
    st = e.steps
    if st is None or st.empty or "layer" not in st.columns:
        return None
    rows = _summary_rows(st, e.analysis_prefix)
    if len(rows):
        layer = int(rows["layer"].iloc[0])
        return "all layers at once, all heads" if layer < 0 else f"layer {layer + 1}, all heads"
    if "prefix" in st.columns:
        st = st[st["prefix"] == e.analysis_prefix]
    if st.empty or "head" not in st.columns:
        return None
    first = st.iloc[0]  # rows are written unit by unit: the first is the first unit
    return f"layer {int(first['layer']) + 1}, head {int(first['head']) + 1}"


def units_line(data: StudyData) -> str | None:
    """Which unit of cross-attention each model's numbers are (:func:`headline_unit`), models
    grouped by unit, for the report's "Layers and heads" line: ``"layer 1 of 1, all heads for
    every model with attention"``; None where no model has one."""
    groups: dict[str, list[str]] = {}
    for e in data.entries:
        unit = headline_unit(e)
        if unit is not None and e.config not in groups.get(unit, []):  # a model's seeds once
            groups.setdefault(unit, []).append(e.config)
    if not groups:
        return None
    if len(groups) == 1:
        where = f"{next(iter(groups))} for every model with attention"
    else:
        where = "; ".join(
            f"{' and '.join(names) if len(names) < 3 else ', '.join(names)}: {unit}"
            for unit, names in groups.items()
        )
    return where


def heads_note(data: StudyData) -> str | None:
    """A table's footnote naming the models whose rows pool several attention heads, and which
    layer they are read at, or None where every model's row has one head."""
    groups: dict[str, list[str]] = {}
    for e in data.entries:
        shape = analysed_heads(e)
        if shape is None:
            continue
        heads, layers, layer = shape
        where = (
            f"layer {layer_name(layer, layers)} with its {heads} heads"
            if layer is not None
            else f"all {layers} layers at once, {heads * layers} heads"
        )
        groups.setdefault(where, []).append(e.variant)
    if not groups:
        return None
    parts = [
        f"{' and '.join(names) if len(names) < 3 else ', '.join(names)} at {where}"
        for where, names in groups.items()
    ]
    return (
        "Heads averaged: these rows pool several attention heads: "
        + "; ".join(parts)
        + ". Interventions replace every head's row; Kendall τ, the adversary's JSD, AER, gold "
        "mass and the erasure order read the heads' mean (layer rows: their own layer's heads)."
    )


STEPS_RANGE_NOTE = (
    "Steps: the decoder steps each statistic has a value at (not skipped, not undefined); "
    "“a to b” where the row's statistics rest on different steps (gold mass has none at <eos>)."
)
"""The note under a table whose steps column shows a range (:func:`_steps`)."""


def _steps(f: ModelFacts, keys: list[str]) -> str | None:
    """The decoder steps a question's statistics were computed on (their steps with a value,
    :attr:`ModelFacts.stat_steps`, as ``attnstudy ablate`` prints them): one count, or
    ``low to high`` where the row's statistics rest on different steps (gold mass leaves out <eos>,
    AER does not); None where none of them was counted."""
    counts = sorted({f.stat_steps[k] for k in keys if k in f.stat_steps})
    if not counts:
        return None
    return str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"


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


def summary_cells(table: pd.DataFrame) -> list[dict[str, str]]:
    """The summary table's rows as cell text for ``<experiment>.csv``: a missing value (a layer
    row's model-level columns, say) is an empty cell, never the text ``nan``."""
    return [
        {k: "" if pd.isna(v) else str(v) for k, v in r.items()} for r in table.to_dict("records")
    ]
