"""The study report, built from the tracking store alone (docs/design.md §5).

Search the study's runs → load their tables (test predictions, per-step ablation tables, example
records) → findings (:mod:`attnstudy.verdict.findings`), tables with intervals, figures
(:mod:`attnstudy.analysis.figures`) → one context → ``report.html`` (Jinja2 template, figures
embedded as data URIs, so it renders from disk and inside MLflow's sandboxed artifact frame) and its
Markdown twin ``report.md`` from the same context, the figures as PNG files, the example browser of
every model, in ``reports/<experiment>/``; also logged as the study run's ``report/`` artifact, with
the cross-model summary as the study run's ``summary.json`` (MLflow table) and ``summary.csv``.
Any machine that sees the store can rebuild it.

The steps are modules of this package, each importing only those before it:

* :mod:`.store`: reading the study from the store (:func:`load_study`, :class:`StudyData`);
* :mod:`.prose`: the titles and captions the code places, from ``templates/report.toml``;
* :mod:`.facts`: the numbers per model the verdicts and tables read (:func:`model_facts`);
* :mod:`.tables`: the tables as rows of cell text (:func:`summary_tables`, :func:`summary_frame`);
* :mod:`.context`: everything the templates render, figures included (:func:`report_context`);
* :mod:`.build`: rendering and writing the folder, logging it (:func:`build_report`).

The names below are this package's public interface: import them from ``attnstudy.report``.
"""

from __future__ import annotations

from attnstudy.pages.run_pages import variant_name

from .build import StudyReport, build_report, render_html, render_markdown, report_dir
from .context import DEFAULT_UI_URL, ML_VIEW, Links, report_context, ui_base_url
from .facts import (
    facts_from,
    layer_facts,
    model_facts,
    n_layers,
    shifted_alignment,
    task_estimates,
    thresholds_of,
)
from .prose import STUDY_FIGURES
from .store import ModelEntry, StudyData, adversary_frame, latest_study, load_study
from .tables import (
    ADVERSARY_HEADER,
    adversary_rows,
    adversary_table,
    experiment_training_rows,
    model_rows,
    per_instance_adversary,
    reason,
    seed_variance_rows,
    status_lines,
    summary_cells,
    summary_frame,
    summary_tables,
    timing_rows,
    training_row,
)

__all__ = [
    "StudyReport",
    "ADVERSARY_HEADER",
    "DEFAULT_UI_URL",
    "ML_VIEW",
    "STUDY_FIGURES",
    "Links",
    "ModelEntry",
    "StudyData",
    "adversary_frame",
    "adversary_rows",
    "adversary_table",
    "build_report",
    "experiment_training_rows",
    "facts_from",
    "latest_study",
    "layer_facts",
    "load_study",
    "model_facts",
    "model_rows",
    "n_layers",
    "per_instance_adversary",
    "reason",
    "render_html",
    "render_markdown",
    "report_context",
    "report_dir",
    "seed_variance_rows",
    "shifted_alignment",
    "status_lines",
    "summary_cells",
    "summary_frame",
    "summary_tables",
    "task_estimates",
    "thresholds_of",
    "timing_rows",
    "training_row",
    "ui_base_url",
    "variant_name",
]
