"""Building the report folder: ``report.html`` and ``report.md`` rendered from the context
(:func:`render_html`, :func:`render_markdown`), figures, example browsers and ``summary.csv``
written whole into :func:`report_dir` (or ``--out``) and logged to the study run
(:func:`build_report`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pandas as pd

from attnstudy.pages.templating import render
from attnstudy.runtime.outputs import (
    REPORT_KIND,
    check_files,
    replace_folder,
    store_folders_of,
    write_files,
)
from attnstudy.runtime.paths import project_root

from ..tracking import Artifact
from .alignment_tables import (
    breakdown_rows,
    flip_split_rows,
    side_by_side_rows,
    stored_examples,
)
from .context import report_context, ui_base_url
from .facts import layer_facts, model_facts, thresholds_of
from .store import load_study
from .tables import (
    adversary_rows,
    model_rows,
    seed_variance_rows,
    summary_cells,
    summary_frame,
    timing_rows,
)


def render_html(context: dict) -> str:
    """``report.html`` from :func:`report_context`'s data (Jinja2, images embedded)."""
    return render("report.html.j2", **context)


def render_markdown(context: dict) -> str:
    """``report.md`` from the same data as :func:`render_html`."""
    return render("report.md.j2", **context)


_SUFFIXED = re.compile(r".*-[0-9a-f]{12}")
"""A folder name that ends like :func:`report_folder_name`'s digest suffix."""


def report_folder_name(experiment: str) -> str:
    """The report folder's name for an experiment name: one folder per name, for every name.

    A name that is already a safe folder name (lower-case letters, digits and ``_.-``, no leading
    dot, no ``..``, at most 200 characters) is the folder's name itself (``quickstart``,
    ``dates-seeds``). Any other name (a leading dot, ``..``, a capital, a space, a ``/`` or a
    character outside ASCII, which only the store can hold) becomes a slug with the first 12 hex
    digits of the SHA-256 of the exact name appended: ``.tiny`` → ``tiny-<12 hex>``, ``My exp`` →
    ``My_exp-<12 hex>``. So two names never share a folder, also on a file system that ignores
    case (a plain name is lower-case; a suffixed one differs by its digest), and a plain name that
    itself ends like a suffix (``-`` and 12 hex digits) is suffixed too, so it cannot be taken for
    another name's folder.

    Returns:
        A single path component, at most 213 characters, never starting with a dot.
    """
    slug = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]", "_", experiment)).lstrip(".")
    if slug and slug == experiment and slug == slug.lower() and len(slug) <= 200:
        if not _SUFFIXED.fullmatch(slug):
            return slug
    digest = hashlib.sha256(experiment.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{slug[:200] or 'study'}-{digest}"


def report_dir(experiment: str) -> Path:
    """The default report folder ``<project root>/reports/<report_folder_name(experiment)>``.

    The name may come from the store (a tag), so it is reduced to a safe, one-to-one folder name
    (:func:`report_folder_name`) and the result is checked to stay inside ``reports/``.

    Raises:
        ValueError: if the folder would leave ``reports/`` (cannot happen for a slug; checked anyway).
    """
    root = (project_root() / "reports").resolve()
    out = (root / report_folder_name(experiment)).resolve()
    if out.parent != root:
        raise ValueError(f"report folder {out} is not inside {root}")
    return out


def build_report(
    tracker,
    study_id: str,
    out_dir: str | Path | None = None,
    *,
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
            ``<experiment>-adversaries.csv``, ``<experiment>-alignment.csv`` (attention's alignment
            beside the reference aligner's and the attribution argmaxes) and
            ``<experiment>-alignment-flips.csv`` (flip rates where attention aligns and where it
            does not: :mod:`attnstudy.report.alignment_tables`), and for a task with word tags
            ``<experiment>-alignment-tags.csv`` and ``-alignment-shape.csv`` (attention's alignment
            by the source word's tag and by link shape)
            (:func:`attnstudy.report.results.write_results`), each row naming the study run.

    Returns:
        Path of ``report.html``.

    Raises:
        attnstudy.runtime.outputs.OutputError: the report or results folder may not be written
            (:func:`attnstudy.runtime.outputs.replace_folder`,
            :func:`attnstudy.runtime.outputs.write_files`).
        attnstudy.runtime.outputs.ReplacedMeanwhileError: another process replaced the report folder
            meanwhile.
    """
    data = load_study(tracker, study_id)
    ui = ui_base_url(ui_url, tracker.uri)
    context = report_context(data, ui, thresholds_of(data, verdict_overrides))
    facts = {
        e.model_run_id: model_facts(e, thresholds_of(data, verdict_overrides)) for e in data.entries
    }
    layers = {e.model_run_id: layer_facts(e, facts[e.model_run_id]) for e in data.entries}
    table = summary_frame(context)

    def build(tmp: Path) -> None:
        _write_report_folder(
            tmp,
            data,
            context=context,
            table=table,
            thresholds=thresholds_of(data, verdict_overrides),
        )

    stores = store_folders_of(tracker.uri)
    results = None
    if results_dir is not None:  # checked before the report is written, written after
        results = _result_files(tracker, study_id, data, table, facts=facts, layers=layers)
        check_files(results_dir, results, option="--results", store_folders=stores)
    out = replace_folder(
        out_dir if out_dir else report_dir(data.experiment),
        build,
        kind=REPORT_KIND,
        option="--out" if out_dir else "the report folder",
        store_folders=stores,
    )
    if results is not None:
        write_files(results_dir, results, option="--results", store_folders=stores)
    _log_report(tracker, study_id, out, figures=context["figures"], table=table)
    return out / "report.html"


def _write_report_folder(tmp: Path, data, *, context: dict, table, thresholds) -> None:
    """The report's files into the new folder ``tmp``: figures, each model's example browser,
    ``summary.csv``, ``adversaries.csv`` (when the study has adversaries), ``report.html`` and
    ``report.md``."""
    from attnstudy.pages.browser import browser_data, browser_html

    (tmp / "figures").mkdir()
    for fig in context["figures"]:
        (tmp / fig["file"]).write_bytes(fig["png"])
    (tmp / "examples").mkdir()
    for e, run in zip(data.entries, context["runs"]):
        if run["browser_file"]:
            f = model_facts(e, thresholds)
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
                browser_data(
                    e.records,
                    e.steps,
                    examples=e.examples,
                    predictions=e.predictions,
                    meta=meta,
                    task=e.task,
                )
            )
            (tmp / run["browser_file"]).write_text(page, encoding="utf-8")
    (tmp / "summary.csv").write_text(table.to_csv(index=False), encoding="utf-8")
    if not data.adversaries.empty:
        pd.DataFrame(adversary_rows(data)).to_csv(tmp / "adversaries.csv", index=False)
    (tmp / "report.html").write_text(render_html(context), encoding="utf-8")
    (tmp / "report.md").write_text(render_markdown(context), encoding="utf-8")


def _result_files(
    tracker, study_id: str, data, table, *, facts: dict, layers: dict
) -> dict[str, bytes]:
    """``--results``' files (file name → contents, :func:`attnstudy.report.results.result_files`):
    the
    summary, adversaries, models, seed variance, timing and alignment tables, each row naming the
    study run."""
    from attnstudy.report.results import result_files

    study = {"study run": study_id}
    return result_files(
        data.experiment,
        {
            "": [r | study for r in summary_cells(table)],
            "-adversaries": [r | study for r in adversary_rows(data)],
            "-models": [r | study for r in model_rows(data)],
            "-seed-variance": [r | study for r in seed_variance_rows(data)],
            "-timing": [r | study for r in timing_rows(data)],
            "-alignment": [r | study for r in side_by_side_rows(data, facts, layers)],
            "-alignment-flips": [r | study for r in flip_split_rows(data)],
            **{
                suffix: [r | study for r in rows]
                for suffix, rows in breakdown_rows(data, stored_examples(tracker)).items()
            },
        },
    )


def _log_report(tracker, study_id: str, out: Path, *, figures: list[dict], table) -> None:
    """Log the written report, its figures and summary table to the study run; a read-only store
    leaves the report written and says so in one notice (the report is what was asked for)."""
    from attnstudy.runtime.notices import notice

    from ..tracking import StoreReadOnlyError

    try:
        for fig in figures:
            tracker.log_artifact(study_id, out / fig["file"], Artifact.FIGURES_DIR)
        tracker.log_artifacts(study_id, out, Artifact.REPORT_DIR)
        if len(table):
            tracker.log_table(study_id, table, Artifact.STUDY_SUMMARY)
            tracker.log_mlflow_table(study_id, table, Artifact.STUDY_SUMMARY_TABLE)
    except StoreReadOnlyError as err:
        notice(
            f"the report is written to {out} but not logged to the study run {study_id}: the "
            f"tracking store {err.store} is read-only ({err.reason})"
        )


class StudyReport:
    """The report as a study's last step (:func:`attnstudy.study.driver.run_study`'s ``report``):
    the
    study calls it without importing the report, which sits above it."""

    def check(self, cfg, tracker) -> None:
        """Refuse, before the study starts, a report folder that would be refused at its end.

        Raises:
            attnstudy.runtime.outputs.OutputError: the folder may not be replaced.
        """
        from attnstudy.runtime.outputs import check_replace

        check_replace(
            report_dir(cfg.experiment.name),
            kind=REPORT_KIND,
            option="the report folder",
            store_folders=store_folders_of(tracker.uri),
        )

    def build(self, tracker, study_id: str) -> Path:
        """:func:`build_report` of study ``study_id`` into its default folder."""
        return build_report(tracker, study_id)
