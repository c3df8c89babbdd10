"""Model runs: training one model (or reusing a finished run of its model key) inside its MLflow
run, registering it, and loading a stored model back; the tags, names and keys a model run
carries.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnstudy.config import RunSpec
from attnstudy.data.tasks import get_task
from attnstudy.experiment import ExperimentConfig
from attnstudy.models.devices import resolve_device
from attnstudy.models.io import LoadedModel, ModelLoadError, load_model_dir, save_model_dir
from attnstudy.models.training import (
    checkpoint_lock,
    early_stopping_metric,
    evaluate_split,
    read_checkpoint,
    train,
    training_wait,
)
from attnstudy.pages import run_pages
from attnstudy.runtime.code_version import this_code
from attnstudy.runtime.notices import notice
from attnstudy.runtime.paths import (
    checkpoint_dir,
    default_tracking_uri,
    git_commit,
    old_checkpoint_dir,
)
from attnstudy.runtime.progress import reporting
from attnstudy.runtime.signals import Interrupted, deferred_signals
from attnstudy.scoring.metrics import heldout_metrics, per_example
from attnstudy.scoring.translation import check_installed, translation_scores
from attnstudy.study.checkpoint_store import CheckpointStore
from attnstudy.study.task_data import TaskData, check_data, task_data
from attnstudy.tracking import Artifact, Kind, Tag, Tracker, check_server, resolve_timeout, store
from attnstudy.tracking import models as packaging
from attnstudy.tracking.client import ServerUnansweredError, UnfinishedRunError, deleted_run_error


@dataclass
class ModelRun:
    """A trained model in the store.

    Attributes:
        run_id: its MLflow run.
        spec: its config.
        reused: True if an earlier finished run was reused instead of training.
        metrics: its final metrics.
        key: the model key (:meth:`RunSpec.model_key`).
        reason: why it was reused (empty when trained).
    """

    run_id: str
    spec: RunSpec
    reused: bool
    metrics: dict[str, float] = field(default_factory=dict)
    key: str = ""
    reason: str = ""


def registered_name(spec: RunSpec) -> str:
    """Registered model name, e.g. ``quickstart-g2p-additive-bahdanau``,
    ``quickstart-g2p-transformer-L2H4``."""
    return f"{spec.experiment}-{spec.data.task}-{spec.label}"


PACKAGE_ROOT = Path(__file__).resolve().parents[1]
"""The attnstudy package folder, logged with each model as its ``code/``."""

SERVING_CODE = PACKAGE_ROOT / "serving" / "pyfunc.py"
"""The registered pyfunc's code (logged with the attnstudy package, :data:`PACKAGE_ROOT`)."""


def variant_slug(spec: RunSpec) -> str:
    """The logged model's name: task and variant label, e.g. ``g2p-additive-bahdanau``."""
    return f"{spec.data.task}-{spec.label}"


def run_tags(
    spec: RunSpec, *, study_id: str | None, kind: str, key: str, digest: str
) -> dict[str, str]:
    """The tags of a run of ``spec``: its ``kind`` (model, ablation, adversary), the variant, the
    model ``key``, the data ``digest``, the code version (:mod:`attnstudy.runtime.code_version`)
    and,
    with a ``study_id``, the study."""
    code = this_code()
    tags = {
        Tag.KIND: kind,
        Tag.TASK: spec.data.task,
        Tag.ATTENTION: spec.model.attention,
        Tag.FLOW: getattr(spec.model, "flow", "–"),
        Tag.ARCHITECTURE: spec.model.architecture_tag,
        Tag.LAYERS: str(spec.model.n_layers),
        Tag.HEADS: str(spec.model.n_heads),
        Tag.VARIANT: spec.label,
        Tag.SEED: str(spec.seed),
        Tag.MODEL_KEY: key,
        Tag.DATA_DIGEST: digest,
        Tag.GIT_COMMIT: git_commit(),
        Tag.CODE_DIGEST: code.digest,
        Tag.CODE_COMMIT: code.commit,
        Tag.EXPERIMENT: spec.experiment,
        Tag.SCHEMA_VERSION: str(spec.schema_version),
    }
    if study_id:  # the study that starts the run (the studies it belongs to: their own tags)
        tags[Tag.STUDY_ID] = study_id
    return tags


def folder_digests_of(spec: RunSpec) -> dict[str, str] | None:
    """A pretrained model's folder digests (:func:`attnstudy.data.hf_folder.folder_digests`), None
    for a model trained here."""
    if not spec.model.pretrained:
        return None
    from attnstudy.data.hf_folder import folder_digests

    return folder_digests(spec.model.folder)


def model_key(spec: RunSpec) -> str:
    """:meth:`RunSpec.model_key` with the digest of the spec's data (loads the data, cached)."""
    return spec.model_key(task_data(spec).digest, folder_digests_of(spec))


def model_task(spec: RunSpec, phase: str = "training", *, noun: bool = False) -> str:
    """What a task of a study does to ``spec``'s model, as the progress lines name it.

    Args:
        phase: ``"training"`` (the task that runs :func:`train_spec`) or ``"ablation"``.
        noun: the noun (``training``, ``evaluation``, ``ablation``) instead of the verb
            (``train``, ``evaluate``, ``ablate``).

    Returns:
        ``train`` / ``training`` for the training task — ``evaluate`` / ``evaluation`` for a
        pretrained variant's (``model.source = "hf:FOLDER"``), which is evaluated, never
        trained — and ``ablate`` / ``ablation`` for the ablation task.
    """
    if phase == "ablation":
        return "ablation" if noun else "ablate"
    if spec.model.pretrained:
        return "evaluation" if noun else "evaluate"
    return "training" if noun else "train"


def train_spec(
    spec: RunSpec,
    tracker: Tracker,
    *,
    experiment_id: str,
    study_id: str | None = None,
    retrain: bool = False,
    resume: bool = False,
    progress: bool = True,
    continue_run: str | None = None,
) -> ModelRun:
    """Train one model (or reuse a finished run with the same model key) and log it; a
    pretrained variant (``model.source = "hf:FOLDER"``) is evaluated instead
    (:func:`attnstudy.study.pretrained.evaluate_pretrained`).
    ``continue_run``: a model run to reopen and train on into from the last checkpoint (a Ray
    task's retry takes over its dead attempt's run, :func:`attnstudy.study.tasks.train_task`).

    The model key (:meth:`RunSpec.model_key`) covers the used config fields and the data digest;
    a finished run with that key whose model files are in the store is reused (``ModelRun.reason``
    says which run and why; a registration a crash left unfinished is completed). While another
    process trains the same key, this one waits for it
    (:func:`attnstudy.models.training.training_wait`
    seconds, with a note naming it), then reuses its run if it finished one in this experiment,
    else trains the model itself.

    Raises:
        DataError: bad data. TrackingError: store problems. TrainingConflictError: another
        process still trains the same key after the wait. ConfigError: a malformed
        ``$ATTNSTUDY_TRAINING_WAIT``. KeyboardInterrupt: the run is marked KILLED and the last
        complete checkpoint is kept for ``resume``; :class:`attnstudy.runtime.signals.Interrupted`
        when the interrupt took effect after the run had FINISHED (its message says whether it
        is registered).
    """
    data = task_data(spec)
    digests = folder_digests_of(spec)  # a pretrained model: evaluated, not trained
    key = spec.model_key(data.digest, digests)
    reuse = functools.partial(
        _reuse,
        spec,
        tracker,
        experiment_id=experiment_id,
        data=data,
        key=key,
        digests=digests,
    )
    if not retrain and (reused := reuse()) is not None:
        return reused
    if digests is not None:
        return _evaluate(
            spec,
            tracker,
            experiment_id=experiment_id,
            study_id=study_id,
            key=key,
            data=data,
            digests=digests,
        )
    ckpt_dir = checkpoint_dir(spec.experiment, key)  # per experiment: the key is shared
    # a second training of the same model waits for the first (bounded) instead of tearing files
    with checkpoint_lock(
        ckpt_dir, wait=training_wait(), owner=f"experiment {spec.experiment!r}"
    ) as lock:
        if lock.waited_for and not retrain:  # its run is reused, if it finished one here
            if (reused := reuse()) is not None:
                return reused
            notice(
                f"{lock.waited_for} is done with this model, but experiment "
                f"{spec.experiment!r} has no finished run of it (it stopped or failed): this "
                "process trains it"
            )
        shared = _shared_checkpoints(spec, key, ckpt_dir, resume=resume)
        run_id, version = "", ""
        try:
            # signals wait from the end of the training block (the run's closing FINISHED) to
            # the end of its registration: an interrupt never leaves a half-registered model
            with ExitStack() as hold:
                run_id, model_id, final = _train_run(
                    spec,
                    tracker,
                    experiment_id=experiment_id,
                    study_id=study_id,
                    data=data,
                    key=key,
                    ckpt_dir=ckpt_dir,
                    resume=resume or continue_run is not None,
                    progress=progress,
                    hold=hold,
                    continue_run=continue_run,
                    on_checkpoint=None if shared is None else functools.partial(shared.upload, key),
                )
                # registered only once the run is FINISHED: a version never points at an
                # unfinished run
                version = _register(
                    spec, tracker, run_id, model_id, key=key, data=data, final=final
                )
        except KeyboardInterrupt:
            if not run_id:
                raise  # it stopped the training: its run is KILLED
            raise Interrupted(_finished_note(spec, run_id, version, study_id)) from None
    return ModelRun(run_id, spec, False, final, key, "")


def _evaluate(
    spec: RunSpec, tracker: Tracker, *, experiment_id: str, study_id, key: str, data, digests
) -> ModelRun:
    """A pretrained variant evaluated and logged as its model run
    (:func:`attnstudy.study.pretrained.evaluate_pretrained`); ``data`` its task's data, ``digests``
    its folder's."""
    from attnstudy.study.pretrained import evaluate_pretrained

    run_id, final = evaluate_pretrained(
        spec,
        data.splits,
        data_digest=data.digest,
        digests=digests,
        tracker=tracker,
        experiment_id=experiment_id,
        study_id=study_id,
        tags=run_tags(spec, study_id=study_id, kind=Kind.MODEL, key=key, digest=data.digest),
    )
    return ModelRun(run_id, spec, False, final, key, "")


def _shared_checkpoints(spec: RunSpec, key: str, ckpt_dir: Path, *, resume: bool):
    """The experiment's part of the checkpoint store the nodes of a cluster share (None: none);
    with ``resume``, another node's last checkpoint fetched from it when this node has none, and
    a broken checkpoint reported before any run exists."""
    store = CheckpointStore.from_env()
    shared = None if store is None else store.for_experiment(spec.experiment)
    if resume and not (ckpt_dir / "last.pt").is_file():
        # another node's interrupted training: its last checkpoint from the store
        if shared is None or not shared.download(key, ckpt_dir / "last.pt"):
            _note_old_checkpoint(spec, key, ckpt_dir, store)
    if resume and (ckpt_dir / "last.pt").is_file():
        read_checkpoint(ckpt_dir / "last.pt")
    return shared


def _note_old_checkpoint(
    spec: RunSpec, key: str, ckpt_dir: Path, store: CheckpointStore | None
) -> None:
    """A note for a ``--resume`` that finds no checkpoint of its experiment but one stored before
    checkpoints were kept per experiment (:func:`attnstudy.runtime.paths.old_checkpoint_dir`,
    ``PREFIX/<model key>/last.pt`` in the shared store): it is not resumed, because nothing in it
    says which experiment wrote it, and another experiment's finished training would be replayed
    as this one's."""
    old = old_checkpoint_dir(key) / "last.pt"
    if old.is_file():
        where, to = str(old), str(ckpt_dir / "last.pt")
    elif store is not None and store.holds(key):
        mine = store.for_experiment(spec.experiment)
        where = f"s3://{store.bucket}/{store.key_of(key)}"
        to = f"s3://{mine.bucket}/{mine.key_of(key)}"
    else:
        return
    notice(
        f"{spec.name}: a checkpoint of this model from before checkpoints were kept per "
        f"experiment ({where}) is not resumed: nothing in it says which experiment wrote it; "
        f"the training starts at epoch 1 (if it is experiment {spec.experiment!r}'s, stop, "
        f"move it to {to} and run with --resume again)"
    )


def _reuse(
    spec: RunSpec,
    tracker: Tracker,
    *,
    experiment_id: str,
    data: TaskData,
    key: str,
    digests: dict[str, str] | None,
) -> ModelRun | None:
    """The finished run of this model key in the experiment, as a reused :class:`ModelRun`
    (the study records it with its other members:
    :meth:`attnstudy.study.driver.StudyContext.record`; a
    trained model's registration that a crash left unfinished is completed), or None."""
    existing = store.find_finished_model(tracker, experiment_id, key, model_files=digests is None)
    if existing is None:
        return None
    if digests is None:
        run_pages.complete_registration(
            tracker,
            existing,
            name=registered_name(spec),
            spec=spec,
            tags=run_tags(spec, study_id=None, kind=Kind.MODEL, key=key, digest=data.digest),
            early_stopping=early_stopping_metric(spec),
        )
    same = "same folder files" if digests is not None else "same used config fields and seed"
    reason = (
        f"finished run {existing.run_id} has the same model key {key} "
        f"({same}, data digest {data.digest[:12]})" + _other_code_note(existing)
    )
    return ModelRun(existing.run_id, spec, True, dict(existing.metrics), key, reason)


def _other_code_note(existing) -> str:
    """A note for a reused run that other attnstudy code trained (its ``attnstudy.code_digest``
    differs from this process's), empty otherwise and for runs recorded before the tag existed.

    Noted, not refused: the model key covers the config and the data, and most code changes
    (the report, the CLI, an analysis) leave a trained model as it is; ``--retrain`` trains it
    again with this code when the change concerns the model or its training.
    """
    from attnstudy.runtime.code_version import UNKNOWN, CodeVersion

    digest = existing.tags.get(Tag.CODE_DIGEST)
    if not digest or digest == this_code().digest:
        return ""
    then = CodeVersion(digest, existing.tags.get(Tag.CODE_COMMIT, UNKNOWN))
    return (
        f"; note: it was trained by other attnstudy code ({then.describe()}; this is "
        f"{this_code().describe()}): --retrain trains it again with this code"
    )


def _finished_note(spec: RunSpec, run_id: str, version: str, study_id: str | None) -> str:
    """What an interrupt that took effect after a model run FINISHED left behind."""
    name = registered_name(spec)
    done = (
        f"model run runs:/{run_id} had already FINISHED and is registered as "
        f"models:/{name}/{version} (models:/{name}@seed{spec.seed})"
        if version
        else f"model run runs:/{run_id} had already FINISHED but is not registered yet (the "
        "next train, which reuses it, registers it)"
    )
    then = (
        "the study run is marked KILLED (resume with --resume)"
        if study_id
        else "no run was killed (train again for the models not trained yet; finished runs "
        "are reused)"
    )
    return f"{done}; {then}"


def _register(
    spec: RunSpec, tracker: Tracker, run_id: str, model_id: str, *, key: str, data, final: dict
) -> str:
    """Register a FINISHED model run's logged model as a new version of its registered model
    (:func:`attnstudy.pages.run_pages.register_version`); returns the version."""
    return run_pages.register_version(
        tracker,
        run_id,
        model_id,
        name=registered_name(spec),
        spec=spec,
        tags=run_tags(spec, study_id=None, kind=Kind.MODEL, key=key, digest=data.digest),
        metrics=final,
        early_stopping=early_stopping_metric(spec),
    )


def _log_inputs(tracker: Tracker, run_id: str, spec: RunSpec, data: TaskData) -> dict:
    """What a model run trains on: its splits as datasets (returned: split → dataset), the used
    config as params (the long ones in full as an artifact), the data's sizes and digest, the
    unknown-token counts, and the config itself."""
    splits = data.splits
    datasets = run_pages.log_model_datasets(tracker, run_id, spec, splits)
    params, full = spec.flat_params()
    tracker.log_params(run_id, params)
    if full:
        tracker.log_text(run_id, json.dumps(full, indent=2), Artifact.PARAMS_FULL)
    tracker.log_params(
        run_id,
        {
            "data.n_train_examples": len(splits.train),
            "data.n_dev_examples": len(splits.dev),
            "data.n_test_examples": len(splits.test),
            "src_vocab_size": len(data.src_vocab),
            "tgt_vocab_size": len(data.tgt_vocab),
            "data.digest": data.digest,
            "training.early_stopping_metric": early_stopping_metric(spec),
        },
    )
    tracker.log_metrics(
        run_id,
        {
            f"data/{k}_unknown" if not k.endswith("_tokens") else f"data/{k}": v
            for k, v in data.unknown.items()
        },
    )
    tracker.log_text(run_id, spec.model_dump_json(indent=2), Artifact.CONFIG)
    return datasets


def _evaluate_trained(spec: RunSpec, data: TaskData, result, final: dict) -> list:
    """The trained model's test metrics (greedy, held-out part, BLEU and chrF, beam) and its best
    dev metrics, added to ``final``; returns the greedy test hypotheses."""
    splits, src_vocab, tgt_vocab = data.splits, data.src_vocab, data.tgt_vocab
    test_metrics, hyps = evaluate_split(result.model, splits.test, src_vocab, tgt_vocab, spec)
    final.update({f"test/{k}": v for k, v in test_metrics.items()})
    final.update(translation_scores(spec.data, splits.test, hyps, "test"))  # BLEU, chrF
    task = get_task(spec.data.task)
    final.update(heldout_metrics(hyps, splits.test, task.heldout, task.error_rate))
    # the best epoch's dev metrics were computed during training: no second decode of dev;
    # where the average of the last epochs beat it, the model is that average
    best = result.averaged or result.history[result.best_epoch - 1]
    final.update(
        {f"best_dev/{k[len('dev/') :]}": v for k, v in best.items() if k.startswith("dev/")}
    )
    if spec.training.average_last > 1:
        final["train/averaged_epochs"] = float(len(result.averaged_epochs))
    if spec.training.beam_size > 1:
        beam_metrics, beam_hyps = evaluate_split(
            result.model,
            splits.test,
            src_vocab,
            tgt_vocab,
            spec,
            beam_size=spec.training.beam_size,
        )
        final.update({f"test_beam/{k}": v for k, v in beam_metrics.items()})
        final.update(translation_scores(spec.data, splits.test, beam_hyps, "test_beam"))
    return hyps


def _open_run(tracker, experiment_id, name, tags, *, study, reopen) -> str:
    """A new model run in ``study``, or the run ``reopen`` reopened (:meth:`Tracker.reopen_run`)."""
    if reopen is None:
        return tracker.start_run(experiment_id, name, tags, study)
    tracker.reopen_run(reopen)
    return reopen


def _train_run(
    spec: RunSpec,
    tracker: Tracker,
    *,
    experiment_id: str,
    study_id: str | None,
    data: TaskData,
    key: str,
    ckpt_dir: Path,
    resume: bool,
    progress: bool,
    hold: ExitStack | None = None,
    on_checkpoint=None,
    continue_run: str | None = None,
) -> tuple[str, str, dict[str, float]]:
    """Train one model inside its own run (see :func:`train_spec`). Returns (run id, logged model id, metrics).

    ``hold``: signals are held from the end of the run's block (its closing FINISHED included)
    until ``hold`` closes (the caller registers the model meanwhile). ``on_checkpoint``: called
    with each ``last.pt`` written (:func:`attnstudy.models.training.train`). ``continue_run``:
    reopen that run (:meth:`attnstudy.tracking.Tracker.reopen_run`) instead of starting one.
    """
    splits, src_vocab, tgt_vocab = data.splits, data.src_vocab, data.tgt_vocab
    device = resolve_device(spec.training.device)  # where this process trains, before any run
    check_installed(spec.data)  # sacrebleu for a translation task, before any run or training
    tags = run_tags(spec, study_id=study_id, kind=Kind.MODEL, key=key, digest=data.digest)
    tags |= {Tag.DEVICE: str(device)}
    run_id = _open_run(tracker, experiment_id, spec.name, tags, study=study_id, reopen=continue_run)
    with tracker.active(run_id), tracker.system_metrics(run_id):  # CPU and memory as system/*
        datasets = _log_inputs(tracker, run_id, spec, data)
        cpu_start = time.process_time()
        with reporting(tracker.progress_sink(run_id)):  # progress/fraction while it trains
            result = train(
                spec,
                splits,
                src_vocab,
                tgt_vocab,
                ckpt_dir,
                resume=resume,
                progress=progress,
                on_epoch=lambda epoch, m: tracker.log_metrics(run_id, m, step=epoch),
                device=device,
                on_checkpoint=on_checkpoint,
            )
        final: dict[str, float] = {
            "train/seconds": result.seconds,
            # CPU seconds of this process's threads while training (data loading excluded)
            "train/cpu_seconds": time.process_time() - cpu_start,
            "train/best_epoch": result.best_epoch,
            "train/epochs": len(result.history),
        }
        hyps = _evaluate_trained(spec, data, result, final)
        preds = pd.DataFrame(per_example(hyps, splits.test))
        preds.insert(0, "example_id", [ex.id for ex in splits.test])
        preds.insert(1, "src_len", [len(ex.src) for ex in splits.test])
        tracker.log_table(run_id, preds, Artifact.PREDICTIONS)
        # the model files are kept locally first, so a tracking failure loses no trained model
        model_dir = save_model_dir(ckpt_dir / "model", result.model, spec, src_vocab, tgt_vocab)
        model_id = packaging.log_model_dir(
            tracker,
            run_id,
            model_dir,
            code_path=SERVING_CODE,
            package_dir=PACKAGE_ROOT,
            name=variant_slug(spec),
        )
        # test metrics are linked to the logged model and the test dataset (its page shows them)
        test = {k: v for k, v in final.items() if k.startswith("test")}
        tracker.log_metrics(
            run_id, {k: v for k, v in final.items() if k not in test}, step=len(result.history)
        )
        tracker.log_metrics(
            run_id, test, step=len(result.history), model_id=model_id, dataset=datasets["test"]
        )
        run_pages.log_training_pages(
            tracker,
            run_id,
            spec,
            history=result.history,
            best_epoch=result.best_epoch,
            metric=early_stopping_metric(spec),
            predictions=preds,
        )
        run_pages.log_alignments(
            tracker, run_id, result.model, splits.test, src_vocab=src_vocab, tgt_vocab=tgt_vocab
        )
        tracker.set_tags(
            run_id,
            {
                Tag.NOTE: run_pages.describe_model_run(
                    spec,
                    final,
                    {k: len(getattr(splits, k)) for k in ("train", "dev", "test")},
                )
            },
        )
        if hold is not None:
            hold.enter_context(deferred_signals())
    return run_id, model_id, final


def open_tracker(cfg: ExperimentConfig, devices_here: bool = True) -> Tracker:
    """The experiment's store, opened in the order a study needs: a tracking server is checked
    (read-only) first, then every variant's data is loaded and checked (and, when the work runs in
    this process, ``devices_here``, its devices), and only then is the store opened (a local one is
    created if missing), so bad data, a missing GPU or an unreachable server changes nothing.

    Raises:
        TrackingError: the server did not answer. DataError: bad data. DeviceError: a device this
        machine does not have (nothing was written).
    """
    uri = cfg.experiment.tracking_uri or default_tracking_uri()
    timeout = resolve_timeout(cfg.experiment.tracking_timeout)
    check_server(uri, timeout)
    training_wait()  # a malformed $ATTNSTUDY_TRAINING_WAIT is refused before anything is written
    check_data(cfg)
    if devices_here:
        check_devices(cfg)
    return Tracker(uri, timeout)


def train_experiment(
    cfg: ExperimentConfig,
    tracker: Tracker | None = None,
    *,
    study_id: str | None = None,
    retrain: bool = False,
    resume: bool = False,
    progress: bool = True,
) -> list[ModelRun]:
    """Train (or reuse) every model of an experiment. Returns one :class:`ModelRun` per spec.

    Raises:
        DataError, TrackingError: before anything is written (see :func:`open_tracker`).
    """
    if tracker is None:
        tracker = open_tracker(cfg)
    else:
        check_data(cfg)
        check_devices(cfg)
    exp_id = tracker.experiment_id(cfg.experiment.name)
    store.reconcile_orphans(tracker, exp_id)
    return [
        train_spec(
            spec,
            tracker,
            experiment_id=exp_id,
            study_id=study_id,
            retrain=retrain,
            resume=resume,
            progress=progress,
        )
        for spec in cfg.runs()
    ]


def check_devices(cfg: ExperimentConfig) -> None:
    """Resolve every training device and the ablation device on this machine (the local executor
    runs the work here), before anything touches the store.

    Raises:
        DeviceError: a device this machine does not have (one line, with what to use instead).
    """
    for spec in cfg.runs():
        resolve_device(spec.training.device)
    resolve_device(cfg.ablation.device, "ablation.device")


def load_model(
    uri: str, tracker: Tracker | None = None, force: bool = False
) -> tuple[str, LoadedModel]:
    """Load a model from ``runs:/…``, ``models:/name/version``, ``models:/name/latest``,
    ``models:/name@alias`` or a local directory holding the model files. Returns (run id or "", model).

    Args:
        force: also load the model of a run that is not FINISHED (RUNNING, KILLED, FAILED).

    Raises:
        ModelNotFoundError, DeletedError (a deleted run or experiment, whatever ``force``),
        UnfinishedRunError, TrackingError, ModelLoadError.
    """
    if Path(uri).is_dir():
        return "", load_model_dir(uri)
    tracker = tracker or Tracker(create=False)
    if uri.startswith("runs:/"):
        from attnstudy.study.pretrained import TAG_FOLDER, load_model_run

        run_id = uri.removeprefix("runs:/").strip("/")
        try:
            run = tracker.get_run(run_id)
        except ServerUnansweredError:
            raise  # asking again (the download below) would wait the whole timeout again
        except Exception:  # noqa: BLE001 - the download below names the missing run
            run = None
        if run is not None:
            again = (
                "ablate hf:FOLDER again to record the model anew"
                if TAG_FOLDER in run.tags
                else "train the model again"
            )
            if deleted := deleted_run_error(tracker, uri, run, again):
                raise deleted
        if run is not None and TAG_FOLDER in run.tags:  # a pretrained model's run
            if run.status != "FINISHED" and not force:
                raise UnfinishedRunError(
                    f"{uri}: run {run_id} is {run.status}: its evaluation may be incomplete; "
                    "use --force to use it anyway"
                )
            return run_id, load_model_run(tracker, run_id)
    with tempfile.TemporaryDirectory() as tmp:
        run_id, local = packaging.download_model_dir(tracker, uri, tmp, allow_unfinished=force)
        try:
            return run_id, load_model_dir(local)
        except ModelLoadError as err:  # name the URI, not the temporary folder it was read from
            raise ModelLoadError(str(err).replace(str(local), uri)) from None
