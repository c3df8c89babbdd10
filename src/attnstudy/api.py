"""Python API with the CLI's verbs: ``train``, ``predict``, ``ablate``, ``run``, ``report``
(docs/design.md §6), what a notebook needs to read their results (``ablation_summary``,
``example_records``, ``ablation_table``) and a Hugging Face folder's battery
(``load_pretrained``, ``text_examples``, ``tsv_examples``, ``ablate_pretrained``); the tutorial
``docs/tutorial.ipynb`` uses these names only.

Composition root together with :mod:`attnstudy.cli.main`: each verb is a thin function over the
modules
that do the work — :mod:`attnstudy.study.task_data` (a task's data, cached),
:mod:`attnstudy.study.model_runs`
(training and loading models), :mod:`attnstudy.study.ablation_runs` (the battery on a stored model),
:mod:`attnstudy.study.driver` (a whole study) and :mod:`attnstudy.study.adversaries` (trained
adversaries).
Everything here takes validated configs. The names those modules define that callers of earlier
versions imported from here are re-exported.
"""

from __future__ import annotations

from pathlib import Path

from attnstudy.models.inference import predict_loaded

# what callers of earlier versions imported from here ("as" marks a re-export)
from attnstudy.study.ablation_runs import (
    ablate_pretrained_on_experiment as ablate_pretrained_on_experiment,
)
from attnstudy.study.ablation_runs import ablate_run as ablate_run
from attnstudy.study.ablation_runs import ablation_key as ablation_key
from attnstudy.study.adversaries import run_trained_adversaries as run_trained_adversaries
from attnstudy.study.driver import Executor, StudyResult, run_study
from attnstudy.study.driver import Failure as Failure
from attnstudy.study.driver import StudyContext as StudyContext
from attnstudy.study.driver import StudyFailedError as StudyFailedError
from attnstudy.study.driver import error_text as _error_text  # noqa: F401 (its earlier name)
from attnstudy.study.driver import study_key as study_key
from attnstudy.study.model_runs import ModelRun as ModelRun
from attnstudy.study.model_runs import check_devices as check_devices
from attnstudy.study.model_runs import folder_digests_of as folder_digests_of
from attnstudy.study.model_runs import load_model, train_experiment
from attnstudy.study.model_runs import model_key as model_key
from attnstudy.study.model_runs import open_tracker as open_tracker
from attnstudy.study.model_runs import registered_name as registered_name
from attnstudy.study.model_runs import run_tags as _run_tags  # noqa: F401 (its earlier name)
from attnstudy.study.model_runs import train_spec as train_spec
from attnstudy.study.model_runs import variant_slug as variant_slug
from attnstudy.study.task_data import TaskData as TaskData
from attnstudy.study.task_data import check_data as check_data
from attnstudy.study.task_data import checked_task_data as checked_task_data
from attnstudy.study.task_data import load_data as load_data
from attnstudy.study.task_data import task_data as task_data

from .analysis.catalogue import AblationConfig
from .experiment import ExperimentConfig
from .experiment import load_experiment as load_experiment
from .tracking import Tracker, store


def train(
    cfg: ExperimentConfig,
    *,
    tracker: Tracker | None = None,
    retrain: bool = False,
    resume: bool = False,
    progress: bool = True,
) -> list[ModelRun]:
    """``attnstudy train``: train (or reuse) every model of an experiment
    (:func:`attnstudy.study.model_runs.train_experiment`). Returns one :class:`ModelRun` per variant
    ×
    seed.

    Raises:
        DataError, TrackingError: before anything is written.
    """
    return train_experiment(cfg, tracker, retrain=retrain, resume=resume, progress=progress)


def predict(
    uri: str,
    inputs: list[str],
    *,
    beam_size: int = 1,
    with_attention: bool = False,
    tracker: Tracker | None = None,
    force: bool = False,
) -> list[dict]:
    """Load a model (see :func:`load_model`) and decode ``inputs`` (see :func:`predict_loaded`)."""
    _, loaded = load_model(uri, tracker, force)
    return predict_loaded(loaded, inputs, beam_size, with_attention)


def ablate(
    uri: str,
    cfg: AblationConfig | None = None,
    *,
    tracker: Tracker | None = None,
    progress: bool = True,
    force: bool = False,
):
    """Load a model from the store and run the ablation suite on it (nested run under the model).

    An ad-hoc ablation belongs to no study: it never changes a study's report. The model's run must
    be FINISHED unless ``force``.

    Returns:
        (ablation run id, SuiteResult).
    """
    tracker = tracker or Tracker(create=False)
    run_id, loaded = load_model(uri, tracker, force)
    if run_id:
        store.reconcile_orphans(tracker, tracker.get_run(run_id).experiment_id)
    if not run_id:
        raise ValueError("ablate needs a model in the tracking store (runs:/… or models:/…)")
    return ablate_run(run_id, loaded, cfg or AblationConfig(), tracker, progress=progress)


def run(
    cfg: ExperimentConfig,
    *,
    retrain: bool = False,
    progress: bool = True,
    config_text: str | None = None,
    report: bool = True,
    resume: bool = False,
    executor: Executor | None = None,
) -> StudyResult:
    """``attnstudy run``, the main job: a study run that trains what is missing, ablates every
    model and reports (:func:`attnstudy.study.driver.run_study`, which says what is checked first
    and
    how failures and ``resume`` behave). Without an ``executor``, ``experiment.workers`` models
    run side by side in worker processes of this machine (:mod:`attnstudy.executors.local_workers`;
    one
    worker: in this process).

    Returns:
        :class:`StudyResult`.

    Raises:
        DataError, TrackingError, DeviceError, OutputError: before anything is written.
        StudyFailedError: some variants failed (its ``result`` holds what was done).
    """
    if executor is None:
        from attnstudy.executors.local_workers import local_executor

        executor = local_executor(cfg)  # None: one worker, in this process
    reporter = None
    if report:  # the study's last step, passed in: the study imports no report module
        from .report import StudyReport

        reporter = StudyReport()
    return run_study(
        cfg,
        retrain=retrain,
        progress=progress,
        config_text=config_text,
        report=reporter,
        resume=resume,
        executor=executor,
    )


def report(
    study_id: str | None = None,
    *,
    experiment: str | None = None,
    out_dir: str | None = None,
    tracker: Tracker | None = None,
    ui_url: str | None = None,
    verdict: dict[str, float] | None = None,
    results_dir: str | None = None,
) -> Path:
    """Build the report of a study (default: the latest study of ``experiment``, default quickstart).

    Args:
        ui_url: the MLflow UI its links point to (default :func:`attnstudy.report.ui_base_url`).
        verdict: verdict thresholds over the study's ``[report.verdict]``.
        results_dir: also write its summary tables there as CSV (:mod:`attnstudy.report.results`);
            for an experiment without a study (trained by ``attnstudy train``), only its table of
            trainings, ``<experiment>-models.csv``, whose path is then returned.

    Raises:
        LookupError: no such experiment or study run, or no store.
        attnstudy.runtime.outputs.OutputError: ``out_dir`` or ``results_dir`` may not be written (a
            protected place, or what attnstudy did not write or a user changed); nothing written.
        attnstudy.runtime.outputs.ReplacedMeanwhileError: another process replaced the report folder
            while this one was writing it.
    """
    from attnstudy.report import build_report, latest_study

    tracker = tracker or Tracker(create=False)
    if study_id is None and results_dir is not None:
        try:
            study_id = latest_study(tracker, experiment or "quickstart")
        except LookupError:  # trained by `attnstudy train` only: the table of trainings
            from attnstudy.report import experiment_training_rows
            from attnstudy.report.results import write_results
            from attnstudy.runtime.outputs import store_folders_of

            name = experiment or "quickstart"
            rows = experiment_training_rows(tracker, name)
            (path,) = write_results(
                results_dir, name, {"-models": rows}, store_folders_of(tracker.uri)
            ) or (None,)
            if path is None:
                raise LookupError(f"experiment {name!r} has no study and no model run") from None
            return path
    study_id = study_id or latest_study(tracker, experiment or "quickstart")
    return build_report(
        tracker,
        study_id,
        out_dir,
        ui_url=ui_url,
        verdict_overrides=verdict,
        results_dir=results_dir,
    )


# ----------------------------------------------------------------------------- reading a run


def ablation_summary(run_id: str, *, tracker: Tracker | None = None) -> list[str]:
    """What ``attnstudy ablate`` prints for the ablation run ``run_id``: each statistic with its
    95 % interval, grouped by the report's questions, the verdict (each question's answer, then
    its sentences), the example browser's path and the run (:func:`attnstudy.report.ablate_summary.
    summary_lines`, default thresholds)."""
    from attnstudy.report.ablate_summary import summary_lines

    return summary_lines(tracker or Tracker(create=False), run_id)


def example_records(run_id: str, *, tracker: Tracker | None = None) -> list[dict]:
    """The analysed examples' records of the ablation run ``run_id`` (``ablations/heatmaps.json``:
    tokens, the analysed prefix's rows, attention per layer, the ablations' maps;
    :func:`attnstudy.analysis.heatmaps.example_records`), as
    :func:`attnstudy.analysis.figures.example_heatmaps` draws them."""
    import json
    import tempfile

    from .tracking import Artifact

    tracker = tracker or Tracker(create=False)
    with tempfile.TemporaryDirectory() as tmp:
        local = tracker.download_artifact(run_id, Artifact.HEATMAPS, tmp)
        return json.loads(Path(local).read_text(encoding="utf-8"))


ABLATION_TABLES = {"steps": "STEPS", "examples": "EXAMPLES_CSV", "summary": "SUMMARY_CSV"}
"""The tables :func:`ablation_table` reads (their :class:`~attnstudy.tracking.Artifact` paths:
``ablations/steps.parquet``, ``ablations/examples.csv``, ``ablations/summary.csv``): one row per
decoder step (and unit), one per analysed example (and unit), one per statistic."""


def ablation_table(run_id: str, name: str = "examples", *, tracker: Tracker | None = None):
    """A table of the ablation run ``run_id`` as a DataFrame: ``"steps"``, ``"examples"`` or
    ``"summary"`` (:data:`ABLATION_TABLES`).

    Raises:
        ValueError: another name.
    """
    from .tracking import Artifact

    if name not in ABLATION_TABLES:
        raise ValueError(f"no ablation table {name!r}; valid: {', '.join(ABLATION_TABLES)}")
    path = getattr(Artifact, ABLATION_TABLES[name])
    return (tracker or Tracker(create=False)).load_table(run_id, path)


# ----------------------------------------------------------------------------- a pretrained folder


def load_pretrained(folder: str | Path):
    """A ``save_pretrained`` encoder-decoder folder (Marian, BART, T5) as the battery runs it,
    offline and safetensors only (:func:`attnstudy.models.hf.load_pretrained`; needs the ``[hf]``
    extra)."""
    from .models.hf import load_pretrained as load

    return load(folder)


def text_examples(model, rows, name: str = "text") -> list:
    """Examples of raw ``(source, target[, links])`` texts as the pretrained ``model`` sees them
    (:func:`attnstudy.study.pretrained_examples.text_examples`): ids ``<name>/<n>``, the model's subwords,
    gold links between words."""
    from attnstudy.study.pretrained_examples import text_examples as examples

    return examples(model, rows, name)


def tsv_examples(model, path: str | Path) -> list:
    """A TSV file's examples as the pretrained ``model`` sees them, as ``attnstudy ablate
    hf:FOLDER --tsv FILE`` reads them (:func:`attnstudy.study.pretrained_examples.tsv_examples`)."""
    from attnstudy.study.pretrained_examples import tsv_examples as examples

    return examples(model, path)


def ablate_pretrained(
    uri: str,
    tsv: str | Path,
    cfg: AblationConfig | None = None,
    *,
    tracker: Tracker | None = None,
    experiment: str = "pretrained",
    progress: bool = True,
):
    """``attnstudy ablate hf:FOLDER --tsv FILE``: the battery on a ``save_pretrained`` folder over
    a TSV's examples, tracked as every ablation run is (browser, tables, verdict; the folder's
    model run is made on first use and reused while its files are unchanged:
    :func:`attnstudy.study.pretrained.ablate_pretrained`).

    Args:
        uri: ``hf:FOLDER`` or ``runs:/<model run>`` of an earlier call.
        tsv: ``source<TAB>target[<TAB>links]`` lines; the first ``cfg.n_examples`` are analysed.
        cfg: the battery (default :class:`AblationConfig`).
        tracker: the store (default: the project's, created for ``hf:``).
        experiment: the MLflow experiment of the runs.

    Returns:
        (model run id, ablation run id, :class:`~attnstudy.analysis.suite.SuiteResult`).

    Raises:
        HFError, DataError: an unusable folder or file, one line each.
    """
    from attnstudy.study.pretrained import ablate_pretrained as ablate_folder

    tracker = tracker or Tracker(create=uri.startswith("hf:"))
    return ablate_folder(
        uri, tsv, cfg or AblationConfig(), tracker, experiment=experiment, progress=progress
    )
