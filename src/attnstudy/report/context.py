"""Everything the report's templates render, as one context (:func:`report_context`): findings
and verdicts, the tables, the figures of the study drawn as PNG (:mod:`attnstudy.analysis.figures`)
with their captions, the runs with their links into the MLflow UI (:func:`ui_base_url`,
:class:`Links`), settings, definitions and references."""

from __future__ import annotations

import base64
import os

from attnstudy.pages.run_pages import estimates_table, figure_png
from attnstudy.serving.ui import TRAINING_VIEW_QUERY, runs_view_url
from attnstudy.verdict.findings import (
    LITERATURE,
    LITERATURE_CONTEXT,
    REFERENCES,
    ModelFacts,
    VerdictThresholds,
    overall,
    verdict,
)

from ..analysis import catalogue, figures
from ..analysis.catalogue import list_ablations
from ..analysis.per_example import SHOW_CRITERION, per_example_summary, pick_shown
from ..tracking import Artifact
from . import alignment_tables
from .facts import _bootstrap_cfg, layer_facts, model_facts, thresholds_of
from .prose import STUDY_FIGURES
from .store import ModelEntry, StudyData
from .tables import (
    adversary_table,
    data_label,
    model_label,
    per_instance_adversary,
    reason,
    status_lines,
    summary_tables,
    units_line,
)

DEFAULT_UI_URL = "http://127.0.0.1:5000"
ML_VIEW = TRAINING_VIEW_QUERY  # MLflow 3's training views (it opens in GenAI mode otherwise)


def ui_base_url(ui_url: str | None = None, tracking_uri: str | None = None) -> str:
    """The MLflow UI the report links to.

    In order: ``ui_url`` (``--ui-url``), ``$ATTNSTUDY_UI_URL``, the tracking URI when it is an
    http(s) tracking server (``attnstudy server`` / ``mlflow server`` serve the UI at the same
    address), for a SQLite store the address ``attnstudy ui`` last served it at (its port:
    :func:`attnstudy.serving.ui.recorded_address`), else http://127.0.0.1:5000 (``attnstudy ui``'s
    default).

    Args:
        ui_url: an explicit UI address, or None.
        tracking_uri: the store the study was read from (e.g. ``Tracker.uri``), or None.

    Returns:
        The base URL without a trailing slash.
    """
    server = (
        tracking_uri if tracking_uri and tracking_uri.startswith(("http://", "https://")) else None
    )
    served = None
    if not (ui_url or os.environ.get("ATTNSTUDY_UI_URL") or server) and tracking_uri:
        from attnstudy.serving.ui import recorded_address

        from ..config import sqlite_database

        database = sqlite_database(tracking_uri)
        served = recorded_address(database) if database is not None else None
    return (
        ui_url or os.environ.get("ATTNSTUDY_UI_URL") or server or served or DEFAULT_UI_URL
    ).rstrip("/")


class Links:
    """URLs into the MLflow UI (the model-training views) of one study."""

    def __init__(self, base: str, experiment_id: str):
        self.base, self.exp = base, experiment_id

    def run(self, run_id: str) -> str:
        return f"{self.base}/#/experiments/{self.exp}/runs/{run_id}?{ML_VIEW}"

    def artifact(self, run_id: str, path: str) -> str:
        return f"{self.base}/#/experiments/{self.exp}/runs/{run_id}/artifacts/{path}?{ML_VIEW}"

    def runs(self) -> str:
        """The training-runs view with every run a row of its own, as ``attnstudy ui`` opens it."""
        return runs_view_url(self.base, self.exp)

    def version(self, ref: str) -> str:
        name, _, version = ref.rpartition("/")
        return f"{self.base}/#/models/{name}/versions/{version}"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)[:60].strip("_")


def page_names(names: list[str]) -> dict[str, str]:
    """A file-name stem per model name, distinct for distinct names: :func:`_slug` where it is the
    only name with that slug, else the slug and the first 8 hex digits of the name's SHA-256
    (``copy add-1`` and ``copy add_1`` both slug to ``copy_add_1``, and each would open the other
    model's examples and figures)."""
    import hashlib

    slugs = {n: _slug(n) for n in dict.fromkeys(names)}
    taken: dict[str, int] = {}
    for slug in slugs.values():
        taken[slug] = taken.get(slug, 0) + 1
    return {
        n: slug
        if taken[slug] == 1
        else f"{slug}_{hashlib.sha256(n.encode('utf-8')).hexdigest()[:8]}"
        for n, slug in slugs.items()
    }


def _figures(data: StudyData, facts, *, layers, palette, eps) -> list[dict]:
    """The report's figures, in its order: the summary of estimates, accuracy by length, each
    ablation's own figure (as its catalogue entry declares it), each model's heatmaps, seed
    variance and the trained adversaries; rendered (:func:`_rendered`)."""
    steps = data.steps
    analysis = (
        steps[steps["prefix"] == steps["analysis_prefix"]]
        if len(steps) and "prefix" in steps
        else steps
    )
    out = _summary_figure(data, facts, layers=layers, palette=palette)
    out.append(
        (
            "accuracy_by_length",
            figures.accuracy_by_length(data.predictions, palette),
            STUDY_FIGURES["accuracy_by_length"],
        )
    )
    ran = [n for n in list_ablations() if any(n in e.ablations_run for e in data.entries)]
    per_example = data.examples
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
                examples=per_example,
            ),
            fig.title,
        )
        key = fig.kind if fig.kind != "stat_distributions" else spec.name
        out.append((key, drawn, (fig.title, fig.caption)))
    out += _heatmap_figures(data, facts, eps=eps)
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
    return _rendered(data, out)


def _summary_figure(data: StudyData, facts, *, layers, palette) -> list[tuple]:
    """The summary of estimates (none without estimates): every model, the one without attention
    too (its τ gradient–LOO is a value; the rest n/a), a model with several layers as its layers
    and their mean (its own row is one of its layers), in shades of its colour."""
    all_facts = [f for e in data.entries if (f := facts.get(e.model_run_id))]
    all_facts = [x for f in all_facts for x in (layers.get(_run_of(data, f)) or [f])]
    est = estimates_table(all_facts)
    layer_pal = dict(palette)
    for f in all_facts:
        if f.name not in layer_pal:
            base = f.name.split(" · ")[0]
            shades = [x.name for x in all_facts if x.name.split(" · ")[0] == base]
            layer_pal[f.name] = figures._shade(
                palette.get(base, (0.3, 0.3, 0.3)), shades.index(f.name), len(shades)
            )
    if not len(est):
        return []
    return [
        (
            "summary",
            figures.estimates_plot(est, layer_pal, models=[f.name for f in all_facts]),
            STUDY_FIGURES["summary"],
        )
    ]


def _heatmap_figures(data: StudyData, facts, *, eps) -> list[tuple]:
    """Each model's heatmaps: its recorded examples (the best, median and worst picks), or the
    heatmaps a run logged before records existed."""
    out = []
    pages = page_names([e.variant for e in data.entries])
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
            out.append((f"heatmaps_{pages[e.variant]}", fig, _heatmaps_caption(e)))
        elif e.legacy_heatmaps:
            out.append(
                (
                    f"heatmaps_{pages[e.variant]}",
                    figures.attention_heatmaps(
                        [
                            h | {"title": f"{e.variant}: {h.get('title', '')}"}
                            for h in e.legacy_heatmaps
                        ]
                    ),
                    _heatmaps_caption(e),
                )
            )
    return out


def _rendered(data: StudyData, out: list[tuple]) -> list[dict]:
    """The figures ``(key, figure, (title, caption))`` as PNG files and data URIs, each caption
    saying what its n/a marks stand for."""
    result = []
    for key, fig, (title, caption) in out:
        caption = caption + _na_caption(
            data, getattr(fig, "attnstudy_na", {}), getattr(fig, "attnstudy_labels", [])
        )
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


def _label_keys() -> dict[str, str]:
    """Figure label → ``ablation/<name>/<stat>``: the statistics' labels (the summary plot) and
    the τ pairs' (the Kendall τ figure), from the catalogue's columns."""
    keys = {st.stat.label: st.key for st in catalogue.shown_stats()}
    by_column = {st.stat.column: st.key for st in catalogue.shown_stats() if st.stat.column}
    keys |= {label: by_column[c] for c, label in figures.TAU_COLUMNS.items() if c in by_column}
    return keys


def _na_reason(e: ModelEntry | None, key: str | None) -> str:
    """Why a figure has no value for a model (of the statistic ``key``, if known): the model's
    table cell's reason (:func:`attnstudy.report.tables.reason`), or no attention."""
    if e is None:
        return "no value"
    if e.attention == "none":
        return "no attention"
    return reason(e, key) if key else "no value at any step"


def _na_caption(data: StudyData, na: dict[str, list[str]], labels_shown: list[str]) -> str:
    """The caption's count of the models a figure marks "n/a", with why, grouped:
    `` n/a (…): 2 of 6 models — a, b (no attention).``; "" for none.

    Args:
        data: the study (its models' entries give the reasons).
        na: model (or ``model · layer l``) → the labels it has no value for (``[]``: anything the
            figure shows), as the figure recorded them (``fig.attnstudy_na``).
        labels_shown: every label the figure shows (``fig.attnstudy_labels``), if it said: a model
            missing most of them is "n/a for all but …".
    """
    if not na:
        return ""
    by_name = {e.variant: e for e in data.entries}
    keys = _label_keys()
    groups: dict[str, list[str]] = {}
    for name, labels in na.items():
        e = by_name.get(name.split(" · ")[0])
        whys: dict[str, list[str]] = {}
        for label in labels or [""]:
            whys.setdefault(_na_reason(e, keys.get(label)), []).append(label)
        if len(whys) == 1 and labels and 2 * len(labels) > len(labels_shown) > len(labels):
            rest = [x for x in labels_shown if x not in labels]  # the shorter list
            text = f"{next(iter(whys))}: every statistic but " + ", ".join(f"‘{x}’" for x in rest)
        else:
            text = "; ".join(
                why + (": " + ", ".join(f"‘{x}’" for x in shown) if shown != [""] else "")
                for why, shown in whys.items()
            )
        groups.setdefault(text, []).append(name)
    n = len({e.variant for e in data.entries})
    parts = "; ".join(f"{', '.join(names)} ({why})" for why, names in groups.items())
    return f" n/a (marked on the figure, not left out): {len(na)} of {n} models — {parts}."


def _heatmaps_caption(e: ModelEntry) -> tuple[str, str]:
    title, caption = STUDY_FIGURES["heatmaps"]
    return f"{title}: {e.variant}", caption


def _run_of(data: StudyData, f: ModelFacts) -> str:
    for e in data.entries:
        if e.variant == f.name:
            return e.model_run_id
    return ""


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
    findings, verdicts, vfacts, vconfigs = _findings(data, facts, layers, t)
    eps_values = {f.eps for f in facts.values() if f.eps is not None}
    eps = next(iter(eps_values)) if len(eps_values) == 1 else None
    p_values = {f.n_permutations for f in facts.values() if f.n_permutations}
    prefixes = {e.analysis_prefix for e in data.entries if e.ablation_run_id}
    seeds = {e.seed for e in data.entries}
    by_config = {}
    for e in data.entries:
        by_config.setdefault(e.config, set()).add(e.seed)
    one_seed = all(len(s) == 1 for s in by_config.values())
    figs = _figures(data, facts, layers=layers, palette=palette, eps=eps)
    runs = _runs(data, facts, links)
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
        "tables": alignment_tables.with_sure_only_note(data, summary_tables(data, facts, layers)),
        "extra_tables": [
            t
            for t in (
                adversary_table(data),
                alignment_tables.side_by_side_table(data, facts, layers),
                alignment_tables.flip_split_table(data),
            )
            if t is not None
        ],
        "figures": figs,
        "runs": runs,
        "settings": {
            "eps": ", ".join(f"{x:g}" for x in sorted(eps_values)) or None,
            "permutations": ", ".join(str(x) for x in sorted(p_values)) or None,
            "prefix": ", ".join(sorted(prefixes)) or None,
            "units": units_line(data),
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
        "literature_context": LITERATURE_CONTEXT,
        "config_text": data.config_text or "(not logged)",
    }


def _findings(data: StudyData, facts: dict, layers: dict, t: VerdictThresholds):
    """Per model its finding (the verdict, per layer too; or why it has none: training or
    ablations failed, not ablated), and the verdicts with their facts and configurations for
    the overall paragraph: ``(findings, verdicts, facts, configs)``."""
    findings = []
    verdicts, vfacts, vconfigs = [], [], []
    for e in data.entries:
        f = facts[e.model_run_id]
        if e.model_status != "FINISHED":
            findings.append(
                {
                    "model": e.variant,
                    "heading": model_label(e, data.experiment),
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
                    "heading": model_label(e, data.experiment),
                    "text": f"Ablations {reason(e, 'ablation/x/y')}: "
                    f"{e.ablation_error or 'no reason recorded'}.",
                    "layers": [],
                }
            )
            continue
        if e.ablation_run_id is None:
            findings.append(
                {
                    "model": e.variant,
                    "heading": model_label(e, data.experiment),
                    "text": "Not ablated in this study.",
                    "layers": [],
                }
            )
            continue
        v = verdict(f, t)
        verdicts.append(v)
        vfacts.append(f)
        vconfigs.append(e.config)
        findings.append(
            {
                "model": e.variant,
                "heading": model_label(e, data.experiment),
                "text": v.text,
                "layers": [
                    {"name": lf.name, "text": verdict(lf, t).text} for lf in layers[e.model_run_id]
                ],
                "categories": v.answers,
            }
        )
    return findings, verdicts, vfacts, vconfigs


def _runs(data: StudyData, facts: dict, links: Links) -> list[dict]:
    """The runs table: per model its data, runs, example browser, registered version and links."""
    runs = []
    pages = page_names([e.variant for e in data.entries])
    for e in data.entries:
        f = facts[e.model_run_id]
        runs.append(
            {
                "model": e.variant,
                "experiment": data.experiment,
                "data": data_label(e.model_params),
                "model_run": e.model_run_id,
                "model_url": links.run(e.model_run_id),
                "ablation_run": e.ablation_run_id,
                "ablation_url": links.run(e.ablation_run_id) if e.ablation_run_id else None,
                "browser_file": f"examples/{pages[e.variant]}.html"
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
    return runs
