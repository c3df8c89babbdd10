"""Ablation runs: the battery on one stored model's test sample, logged as a run nested under the
model's, with its pages; the ablation key; the battery on a pretrained folder outside a study.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path

from attnstudy.analysis.catalogue import AblationConfig
from attnstudy.config import RunSpec
from attnstudy.experiment import ExperimentConfig
from attnstudy.models.devices import resolve_device
from attnstudy.models.io import LoadedModel
from attnstudy.pages import run_pages
from attnstudy.runtime.paths import default_tracking_uri
from attnstudy.runtime.progress import reporting
from attnstudy.study import ablation_resume
from attnstudy.study.model_runs import folder_digests_of, run_tags, train_spec
from attnstudy.study.task_data import checked_task_data, load_data
from attnstudy.tracking import Kind, Tag, Tracker, check_server, resolve_timeout
from attnstudy.tracking.schema import ablation_run_name


def ablation_key(cfg: AblationConfig) -> str:
    """Key of an ablation configuration (a finished ablation run of a resumed study is reused on it)."""
    return hashlib.sha256(json.dumps(cfg.resolved(), sort_keys=True).encode()).hexdigest()[:16]


def ablate_run(
    model_run_id: str,
    loaded: LoadedModel,
    cfg: AblationConfig,
    tracker: Tracker,
    *,
    study_id: str | None = None,
    progress: bool = True,
    thresholds=None,
    resume: bool = False,
):
    """Run the ablation suite on a model's test sample and log it as a nested run, with its
    example browser, tables, figures, description and verdict (:mod:`attnstudy.pages.run_pages`).

    Every finished batch's state is kept among the run's artifacts while it runs
    (:mod:`attnstudy.study.ablation_resume`), and removed once the run is FINISHED.

    Args:
        thresholds: the verdict's thresholds (``VerdictThresholds``; default values).
        resume: continue the newest interrupted (KILLED or FAILED) ablation run of this model
            run, study, ablation key and code digest from its last finished batch, in that run
            (:func:`attnstudy.study.ablation_resume.find_interrupted`); without one, a new run.

    Returns:
        (ablation run id, SuiteResult); the per-step table is streamed to the run's
        ``ablations/steps.parquet`` artifact, so ``SuiteResult.table`` is None.
    """
    from attnstudy.analysis.heatmaps import Recorder
    from attnstudy.analysis.suite import run_suite

    spec = loaded.spec
    model_run = tracker.get_run(model_run_id)
    data = checked_task_data(loaded, model_run.tags.get(Tag.DATA_DIGEST), f"runs:/{model_run_id}")
    examples = data.splits.test[: cfg.n_examples]
    if spec.model.pretrained:  # as the model's tokenizer splits them
        from attnstudy.study.pretrained import analysed_examples

        examples = analysed_examples(loaded.model, spec, examples)
    exp_id = model_run.experiment_id
    key = model_run.tags.get(Tag.MODEL_KEY) or spec.model_key(data.digest, folder_digests_of(spec))
    device = resolve_device(cfg.device, "ablation.device")
    tags = run_tags(spec, study_id=study_id, kind=Kind.ABLATION, key=key, digest=data.digest)
    tags |= {Tag.SOURCE_RUN_ID: model_run_id, Tag.ABLATION_KEY: ablation_key(cfg)}
    tags |= {Tag.DEVICE: str(device)}
    loaded.model.to(device)  # float32 whatever the training precision
    run_id, journal = _open_run(
        tracker,
        exp_id,
        model_run_id,
        name=ablation_run_name(spec.name),
        tags=tags,
        study_id=study_id,
        resume=resume,
    )
    with journal, tracker.active(run_id), tracker.system_metrics(run_id):  # CPU and memory
        tracker.log_params(run_id, cfg.flat())
        run_pages.log_analysed_dataset(tracker, run_id, spec, examples)
        recorder = Recorder(cfg.prefix)
        with tempfile.TemporaryDirectory(prefix="attnstudy-ablate-") as tmp:
            steps_path = Path(tmp) / "steps.parquet"  # streamed: memory stays flat in n_examples
            t0 = time.perf_counter()
            with reporting(tracker.progress_sink(run_id)):  # progress/fraction while it runs
                result = run_suite(
                    loaded.model,
                    examples,
                    loaded.src_vocab,
                    loaded.tgt_vocab,
                    cfg,
                    progress=progress,
                    table_path=steps_path,
                    label=spec.name,
                    recorder=recorder,
                    journal=journal,
                )
            summary, timing = run_pages.log_battery(
                tracker,
                run_id,
                result,
                prefix=cfg.prefix,
                started=t0,
                n_examples=len(examples),
                steps_path=steps_path,
            )
            run_pages.log_ablation_pages(
                tracker,
                run_id,
                model_run_id,
                name=run_pages.variant_name(model_run.tags),
                attention=spec.model.attention,
                examples=examples,
                params=cfg.flat(),
                summary=summary,
                steps_path=steps_path,
                per_example=result.examples,
                records=recorder.result(),
                thresholds=thresholds,
                task=spec.data.task,
            )
        run_pages.log_outcome(tracker, run_id, result, summary | timing)
    return run_id, result


def _open_run(
    tracker: Tracker,
    exp_id: str,
    model_run_id: str,
    *,
    name: str,
    tags: dict,
    study_id: str | None,
    resume: bool,
):
    """The ablation run: with ``resume`` the newest interrupted one of the same model run, study,
    ablation key and code digest, reopened (its device tag renewed), else a new one; returns
    (run id, the journal that keeps its finished batches among its artifacts)."""
    state_key = ablation_resume.resume_key(
        model_run_id, tags[Tag.ABLATION_KEY], tags[Tag.CODE_DIGEST]
    )
    run_id = None
    if resume:
        run_id = ablation_resume.find_interrupted(
            tracker,
            exp_id,
            model_run_id=model_run_id,
            ablation_key=state_key["ablation_key"],
            code_digest=state_key["code_digest"],
            study_id=study_id,
        )
    resumed = run_id is not None
    if resumed:
        tracker.reopen_run(run_id)
        tracker.set_tags(run_id, {Tag.DEVICE: tags[Tag.DEVICE]})
    else:
        run_id = tracker.start_run(exp_id, name, tags, model_run_id)
    return run_id, ablation_resume.ArtifactJournal(tracker, run_id, state_key, resumed=resumed)


def ablate_pretrained_on_experiment(
    uri: str, cfg: ExperimentConfig, abl: AblationConfig, progress: bool = True
):
    """``attnstudy ablate hf:FOLDER --data EXPERIMENT.toml``: the pretrained model evaluated on
    the experiment's task (its base ``[data]``; a model run in the experiment's MLflow
    experiment, reused while the folder's files and the data are unchanged) and the battery run
    on the first ``abl.n_examples`` test examples, as for a study's pretrained variant — but in
    no study.

    Args:
        uri: ``hf:FOLDER`` (relative to the working directory).
        cfg: the :class:`attnstudy.experiment.ExperimentConfig`; its store is used.
        abl: the ablation settings.

    Returns:
        (model run id, ablation run id, :class:`~attnstudy.analysis.suite.SuiteResult`).

    Raises:
        HFError, DataError: an unusable folder or data, before anything is written.
        TrackingError: the store.
    """
    from pydantic import ValidationError

    from attnstudy.config import ConfigError, _describe
    from attnstudy.data.hf_folder import HF_PREFIX, check_folder
    from attnstudy.study.pretrained import load_model_run

    folder = Path(uri.removeprefix(HF_PREFIX)).expanduser().resolve()
    try:
        spec = RunSpec(
            experiment=cfg.experiment.name,
            seed=cfg.experiment.seeds[0],
            data=cfg.data,
            model={"source": f"{HF_PREFIX}{folder}"},
            training=cfg.training,
        )
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None
    check_folder(folder)
    load_data(spec)  # bad data is refused before the store is touched
    tracking_uri = cfg.experiment.tracking_uri or default_tracking_uri()
    timeout = resolve_timeout(cfg.experiment.tracking_timeout)
    check_server(tracking_uri, timeout)
    tracker = Tracker(tracking_uri, timeout)
    exp_id = tracker.experiment_id(cfg.experiment.name)
    model_run = train_spec(spec, tracker, experiment_id=exp_id, progress=progress)
    loaded = load_model_run(tracker, model_run.run_id)
    run_id, result = ablate_run(
        model_run.run_id,
        loaded,
        abl,
        tracker,
        study_id=None,
        progress=progress,
        thresholds=cfg.report.verdict,
    )
    return model_run.run_id, run_id, result
