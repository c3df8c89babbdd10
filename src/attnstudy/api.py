"""Python API with the CLI's verbs: ``train``, ``predict``, ``ablate``, ``run`` (docs/design.md §6).

Composition root together with :mod:`attnstudy.cli`: it wires data, models, training, the
analysis suite and tracking. Everything here takes validated configs.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd

from . import adversaries, run_pages
from .analysis.catalogue import AblationConfig
from .config import RunSpec
from .data.tasks import get_task, load_task, source_key
from .data.types import DataError, Splits, splits_digest
from .data.vocab import Vocab
from .devices import resolve_device
from .experiment import ExperimentConfig
from .inference import predict_loaded
from .metrics import heldout_metrics, per_example
from .models.io import LoadedModel, ModelLoadError, load_model_dir, save_model_dir
from .notices import notice
from .paths import checkpoint_dir, default_tracking_uri, git_commit
from .run_pages import timing_metrics
from .signals import Interrupted, deferred_signals
from .tracking import Artifact, Kind, Tag, Tracker, check_server, resolve_timeout, store
from .tracking import models as packaging
from .tracking.client import UnfinishedRunError
from .tracking.schema import Metric as MetricName
from .training import (
    checkpoint_lock,
    early_stopping_metric,
    evaluate_split,
    read_checkpoint,
    train,
    training_wait,
)


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


@dataclass(frozen=True)
class TaskData:
    """A task's materialised data and what is derived from it.

    Attributes:
        splits: train/dev/test examples.
        src_vocab, tgt_vocab: vocabularies of the training split.
        digest: :func:`attnstudy.data.types.splits_digest` of the splits (part of the model key).
        unknown: per ``<split>/<source|target>`` of dev and test, the number of tokens outside the
            training vocabulary (they become ``<unk>``) and ``…_tokens`` the number of tokens.
    """

    splits: Splits
    src_vocab: Vocab
    tgt_vocab: Vocab
    digest: str
    unknown: dict[str, int]


UNKNOWN_WARN_RATE = 0.01
"""Share of a dev/test field's tokens outside the training vocabulary above which a notice is printed."""


@functools.lru_cache(maxsize=8)
def _task_data(source_key: str) -> TaskData:
    from .config import DataConfig

    cfg = DataConfig.model_validate_json(json.loads(source_key)["config"])
    splits = load_task(cfg)
    try:
        src_vocab = Vocab.build(ex.src for ex in splits.train)
        tgt_vocab = Vocab.build(ex.tgt for ex in splits.train)
    except ValueError as err:
        raise DataError(f"task {cfg.task!r}: {err}") from None
    unknown: dict[str, int] = {}
    for split in ("dev", "test"):
        for side, vocab in (("source", src_vocab), ("target", tgt_vocab)):
            tokens = [
                t for ex in getattr(splits, split) for t in (ex.src if side == "source" else ex.tgt)
            ]
            n_unk = vocab.count_unknown(tokens)
            unknown[f"{split}/{side}"], unknown[f"{split}/{side}_tokens"] = n_unk, len(tokens)
            if tokens and n_unk / len(tokens) > UNKNOWN_WARN_RATE:
                notice(
                    f"{split} split: {n_unk:,} of {len(tokens):,} {side} tokens "
                    f"({100 * n_unk / len(tokens):.1f} %) are not in the training vocabulary and become <unk>"
                )
    return TaskData(splits, src_vocab, tgt_vocab, splits_digest(splits), unknown)


def task_data(spec: RunSpec) -> TaskData:
    """The task's data for ``spec``, cached in-process on the used data fields and (for TSV) the
    SHA-256 of the files' bytes, so a file replaced in place is read again.

    Raises:
        DataError: a data problem (file, line and what to do).
    """
    return _task_data(source_key(spec.data))


def load_data(spec: RunSpec) -> tuple[Splits, Vocab, Vocab]:
    """The task's splits and the vocabularies built from its training split (see :func:`task_data`)."""
    d = task_data(spec)
    return d.splits, d.src_vocab, d.tgt_vocab


def registered_name(spec: RunSpec) -> str:
    """Registered model name, e.g. ``quickstart-g2p-additive-bahdanau``,
    ``quickstart-g2p-transformer-L2H4``."""
    return f"{spec.experiment}-{spec.data.task}-{spec.label}"


SERVING_CODE = Path(__file__).with_name("serving.py")
"""The registered pyfunc's code (logged with the attnstudy package beside it)."""


def variant_slug(spec: RunSpec) -> str:
    """The logged model's name: task and variant label, e.g. ``g2p-additive-bahdanau``."""
    return f"{spec.data.task}-{spec.label}"


def _run_tags(
    spec: RunSpec, study_id: str | None, kind: str, key: str, digest: str
) -> dict[str, str]:
    tags = {
        Tag.KIND: kind,
        Tag.TASK: spec.data.task,
        Tag.ATTENTION: spec.model.attention,
        Tag.FLOW: getattr(spec.model, "flow", "–"),
        Tag.ARCHITECTURE: (
            f"hf:{spec.model.model_type}"
            if spec.model.architecture == "hf"
            else spec.model.architecture
        ),
        Tag.LAYERS: str(spec.model.n_layers),
        Tag.HEADS: str(spec.model.n_heads),
        Tag.VARIANT: spec.label,
        Tag.SEED: str(spec.seed),
        Tag.MODEL_KEY: key,
        Tag.DATA_DIGEST: digest,
        Tag.GIT_COMMIT: git_commit(),
        Tag.EXPERIMENT: spec.experiment,
        Tag.SCHEMA_VERSION: str(spec.schema_version),
    }
    if study_id:
        tags[Tag.STUDY_ID] = study_id
        tags[Tag.STUDY_IDS] = study_id
    return tags


def folder_digests_of(spec: RunSpec) -> dict[str, str] | None:
    """A pretrained model's folder digests (:func:`attnstudy.hf_folder.folder_digests`), None
    for a model trained here."""
    if spec.model.architecture != "hf":
        return None
    from .hf_folder import folder_digests

    return folder_digests(spec.model.folder)


def model_key(spec: RunSpec) -> str:
    """:meth:`RunSpec.model_key` with the digest of the spec's data (loads the data, cached)."""
    return spec.model_key(task_data(spec).digest, folder_digests_of(spec))


def train_spec(
    spec: RunSpec,
    tracker: Tracker,
    experiment_id: str,
    study_id: str | None = None,
    retrain: bool = False,
    resume: bool = False,
    progress: bool = True,
) -> ModelRun:
    """Train one model (or reuse a finished run with the same model key) and log it; a
    pretrained variant (``model.source = "hf:FOLDER"``) is evaluated instead
    (:func:`attnstudy.pretrained.evaluate_pretrained`).

    The model key (:meth:`RunSpec.model_key`) covers the used config fields and the data digest;
    a finished run with that key whose model files are in the store is reused (``ModelRun.reason``
    says which run and why; a registration a crash left unfinished is completed). While another
    process trains the same key, this one waits for it (:func:`attnstudy.training.training_wait`
    seconds, with a note naming it), then reuses its run if it finished one in this experiment,
    else trains the model itself.

    Raises:
        DataError: bad data. TrackingError: store problems. TrainingConflictError: another
        process still trains the same key after the wait. ConfigError: a malformed
        ``$ATTNSTUDY_TRAINING_WAIT``. KeyboardInterrupt: the run is marked KILLED and the last
        complete checkpoint is kept for ``resume``; :class:`attnstudy.signals.Interrupted` when
        the interrupt took effect after the run had FINISHED (its message says whether it is
        registered).
    """
    data = task_data(spec)
    digests = folder_digests_of(spec)  # a pretrained model: evaluated, not trained
    key = spec.model_key(data.digest, digests)
    reuse = functools.partial(
        _reuse,
        spec,
        tracker,
        experiment_id=experiment_id,
        study_id=study_id,
        data=data,
        key=key,
        digests=digests,
    )
    if not retrain and (reused := reuse()) is not None:
        return reused
    if digests is not None:
        from .pretrained import evaluate_pretrained

        tags = _run_tags(spec, study_id, Kind.MODEL, key, data.digest)
        run_id, final = evaluate_pretrained(
            spec, data.splits, data.digest, digests, tracker, experiment_id, study_id, tags
        )
        return ModelRun(run_id, spec, False, final, key, "")
    ckpt_dir = checkpoint_dir(key)
    # a second training of the same model waits for the first (bounded) instead of tearing files
    with checkpoint_lock(
        ckpt_dir, wait=training_wait(), owner=f"experiment {spec.experiment!r}"
    ) as lock:
        if lock.waited_for and not retrain:  # its run is reused, if it finished one here
            if (reused := reuse()) is not None:
                return reused
            notice(
                f"{lock.waited_for} is done with this model, but experiment "
                f"{spec.experiment!r} has no finished run of it (a run is reused only within "
                "its experiment): this process trains it"
            )
        if resume and (ckpt_dir / "last.pt").is_file():
            read_checkpoint(
                ckpt_dir / "last.pt"
            )  # a broken checkpoint is reported before any run exists
        run_id, version = "", ""
        try:
            # signals wait from the end of the training block (the run's closing FINISHED) to
            # the end of its registration: an interrupt never leaves a half-registered model
            with ExitStack() as hold:
                run_id, model_id, final = _train_run(
                    spec,
                    tracker,
                    experiment_id,
                    study_id,
                    data,
                    key,
                    ckpt_dir,
                    resume,
                    progress,
                    hold=hold,
                )
                # registered only once the run is FINISHED: a version never points at an
                # unfinished run
                version = run_pages.register_version(
                    tracker,
                    run_id,
                    model_id,
                    registered_name(spec),
                    spec,
                    _run_tags(spec, None, Kind.MODEL, key, data.digest),
                    final,
                    early_stopping_metric(spec),
                )
        except KeyboardInterrupt:
            if not run_id:
                raise  # it stopped the training: its run is KILLED
            raise Interrupted(_finished_note(spec, run_id, version, study_id)) from None
    return ModelRun(run_id, spec, False, final, key, "")


def _reuse(
    spec: RunSpec,
    tracker: Tracker,
    *,
    experiment_id: str,
    study_id: str | None,
    data: TaskData,
    key: str,
    digests: dict[str, str] | None,
) -> ModelRun | None:
    """The finished run of this model key in the experiment, as a reused :class:`ModelRun`
    (recorded in the study; a trained model's registration that a crash left unfinished is
    completed), or None."""
    existing = store.find_finished_model(tracker, experiment_id, key, model_files=digests is None)
    if existing is None:
        return None
    if study_id:
        store.add_study(tracker, existing, study_id)
    if digests is None:
        run_pages.complete_registration(
            tracker,
            existing,
            name=registered_name(spec),
            spec=spec,
            tags=_run_tags(spec, None, Kind.MODEL, key, data.digest),
            early_stopping=early_stopping_metric(spec),
        )
    same = "same folder files" if digests is not None else "same used config fields and seed"
    reason = (
        f"finished run {existing.run_id} has the same model key {key} "
        f"({same}, data digest {data.digest[:12]})"
    )
    return ModelRun(existing.run_id, spec, True, dict(existing.metrics), key, reason)


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


def _train_run(
    spec: RunSpec,
    tracker: Tracker,
    experiment_id: str,
    study_id: str | None,
    data: TaskData,
    key: str,
    ckpt_dir: Path,
    resume: bool,
    progress: bool,
    *,
    hold: ExitStack | None = None,
) -> tuple[str, str, dict[str, float]]:
    """Train one model inside its own run (see :func:`train_spec`). Returns (run id, logged model id, metrics).

    ``hold``: signals are held from the end of the run's block (its closing FINISHED included)
    until ``hold`` closes (the caller registers the model meanwhile).
    """
    splits, src_vocab, tgt_vocab = data.splits, data.src_vocab, data.tgt_vocab
    device = resolve_device(spec.training.device)  # where this process trains, before any run
    tags = _run_tags(spec, study_id, Kind.MODEL, key, data.digest) | {Tag.DEVICE: str(device)}
    run_id = tracker.start_run(experiment_id, spec.name, tags, study_id)
    with tracker.active(run_id):
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
                "src_vocab_size": len(src_vocab),
                "tgt_vocab_size": len(tgt_vocab),
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
        )
        final: dict[str, float] = {
            "train/seconds": result.seconds,
            "train/best_epoch": result.best_epoch,
            "train/epochs": len(result.history),
        }
        test_metrics, hyps = evaluate_split(result.model, splits.test, src_vocab, tgt_vocab, spec)
        final.update({f"test/{k}": v for k, v in test_metrics.items()})
        final.update(heldout_metrics(hyps, splits.test, get_task(spec.data.task).heldout))
        # the best epoch's dev metrics were computed during training: no second decode of dev;
        # where the average of the last epochs beat it, the model is that average
        best = result.averaged or result.history[result.best_epoch - 1]
        final.update(
            {f"best_dev/{k[len('dev/') :]}": v for k, v in best.items() if k.startswith("dev/")}
        )
        if spec.training.average_last > 1:
            final["train/averaged_epochs"] = float(len(result.averaged_epochs))
        if spec.training.beam_size > 1:
            beam_metrics, _ = evaluate_split(
                result.model,
                splits.test,
                src_vocab,
                tgt_vocab,
                spec,
                beam_size=spec.training.beam_size,
            )
            final.update({f"test_beam/{k}": v for k, v in beam_metrics.items()})
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
            package_dir=SERVING_CODE.parent,
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
            result.history,
            result.best_epoch,
            early_stopping_metric(spec),
            preds,
        )
        run_pages.log_alignments(tracker, run_id, result.model, splits.test, src_vocab, tgt_vocab)
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
        train_spec(spec, tracker, exp_id, study_id, retrain, resume, progress)
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


def check_data(cfg: ExperimentConfig) -> None:
    """Load every model's data before anything touches the store, so bad data changes nothing.

    Raises:
        DataError: a missing or malformed data file, an empty split, …
    """
    for spec in cfg.runs():
        if spec.model.architecture == "hf":
            from .hf_folder import HFError, check_folder

            check_folder(spec.model.folder)
            if importlib.util.find_spec("transformers") is None:
                raise HFError(
                    f"{spec.name}: a pretrained model needs the optional extra: "
                    "pip install 'attnstudy[hf]'"
                )
        splits, _, _ = load_data(spec)
        for name in ("train", "dev", "test"):
            if not getattr(splits, name):
                raise DataError(
                    f"{spec.name}: the {name} split is empty; check the data sizes and files"
                )


def load_model(
    uri: str, tracker: Tracker | None = None, force: bool = False
) -> tuple[str, LoadedModel]:
    """Load a model from ``runs:/…``, ``models:/name/version``, ``models:/name/latest``,
    ``models:/name@alias`` or a local directory holding the model files. Returns (run id or "", model).

    Args:
        force: also load the model of a run that is not FINISHED (RUNNING, KILLED, FAILED).

    Raises:
        ModelNotFoundError, UnfinishedRunError, TrackingError, ModelLoadError.
    """
    if Path(uri).is_dir():
        return "", load_model_dir(uri)
    tracker = tracker or Tracker(create=False)
    if uri.startswith("runs:/"):
        from .pretrained import TAG_FOLDER, load_model_run

        run_id = uri.removeprefix("runs:/").strip("/")
        try:
            run = tracker.get_run(run_id)
        except Exception:  # noqa: BLE001 - the download below names the missing run
            run = None
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


def predict(
    uri: str,
    inputs: list[str],
    beam_size: int = 1,
    with_attention: bool = False,
    tracker: Tracker | None = None,
    force: bool = False,
) -> list[dict]:
    """Load a model (see :func:`load_model`) and decode ``inputs`` (see :func:`predict_loaded`)."""
    _, loaded = load_model(uri, tracker, force)
    return predict_loaded(loaded, inputs, beam_size, with_attention)


def checked_task_data(loaded: LoadedModel, trained_digest: str | None, where: str) -> TaskData:
    """The data of a stored model's task, refused if it is not the data the model was trained on.

    Args:
        loaded: the model (its stored config names the data).
        trained_digest: the data digest recorded when it was trained (None for older runs, which
            are checked through their vocabularies only).
        where: the model's URI, for the message.

    Raises:
        DataError: the data changed since training (another digest, or other vocabularies).
    """
    data = task_data(loaded.spec)
    pretrained = loaded.spec.model.architecture == "hf"  # its vocabulary is its tokenizer's
    changed = (trained_digest is not None and trained_digest != data.digest) or (
        not pretrained
        and (data.src_vocab != loaded.src_vocab or data.tgt_vocab != loaded.tgt_vocab)
    )
    if changed:
        raise DataError(
            f"{where}: the data of task {loaded.spec.data.task!r} changed since this model was trained "
            f"(data digest {data.digest[:12]}, trained on {str(trained_digest)[:12]}); its test examples would "
            "not be the ones it was evaluated on: restore the data or train again"
        )
    return data


def ablate_run(
    model_run_id: str,
    loaded: LoadedModel,
    cfg: AblationConfig,
    tracker: Tracker,
    study_id: str | None = None,
    progress: bool = True,
    thresholds=None,
):
    """Run the ablation suite on a model's test sample and log it as a nested run, with its
    example browser, tables, figures, description and verdict (:mod:`attnstudy.run_pages`).

    Args:
        thresholds: the verdict's :class:`attnstudy.findings.VerdictThresholds` (default values).

    Returns:
        (ablation run id, SuiteResult); the per-step table is streamed to the run's
        ``ablations/steps.parquet`` artifact, so ``SuiteResult.table`` is None.
    """
    from attnstudy.analysis.suite import run_suite

    spec = loaded.spec
    model_run = tracker.get_run(model_run_id)
    data = checked_task_data(loaded, model_run.tags.get(Tag.DATA_DIGEST), f"runs:/{model_run_id}")
    examples = data.splits.test[: cfg.n_examples]
    if spec.model.architecture == "hf":  # as the model's tokenizer splits them
        from .pretrained import analysed_examples

        examples = analysed_examples(loaded.model, spec, examples)
    exp_id = model_run.experiment_id
    key = model_run.tags.get(Tag.MODEL_KEY) or spec.model_key(data.digest, folder_digests_of(spec))
    device = resolve_device(cfg.device, "ablation.device")
    tags = _run_tags(spec, study_id, Kind.ABLATION, key, data.digest) | {
        Tag.SOURCE_RUN_ID: model_run_id,
        Tag.ABLATION_KEY: ablation_key(cfg),
        Tag.DEVICE: str(device),
    }
    loaded.model.to(device)  # float32 whatever the training precision
    run_id = tracker.start_run(exp_id, f"{spec.name}/ablations", tags, model_run_id)
    with tracker.active(run_id):
        tracker.log_params(run_id, cfg.flat())
        run_pages.log_analysed_dataset(tracker, run_id, spec, examples)
        from attnstudy.analysis.heatmaps import Recorder

        recorder = Recorder(cfg.prefix)
        with tempfile.TemporaryDirectory(prefix="attnstudy-ablate-") as tmp:
            steps_path = Path(tmp) / "steps.parquet"  # streamed: memory stays flat in n_examples
            t0 = time.perf_counter()
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
            )
            summary = dict(result.summary) | {
                "ablation/seconds": time.perf_counter() - t0,
                "ablation/n_examples": float(len(examples)),
            }
            timing = timing_metrics(result, cfg.prefix, summary["ablation/seconds"])
            tracker.log_artifact(run_id, steps_path, "ablations")
            if result.examples is not None and len(result.examples):
                tracker.log_table(run_id, result.examples, Artifact.EXAMPLES)
            run_pages.log_ablation_pages(
                tracker,
                run_id,
                model_run_id,
                run_pages.variant_name(model_run.tags),
                spec.model.attention,
                examples,
                cfg.flat(),
                summary,
                steps_path,
                result.examples,
                recorder.result(),
                thresholds,
            )
        if result.skipped:
            tracker.log_text(run_id, json.dumps(result.skipped, indent=2), Artifact.SKIPPED)
            tracker.set_tags(
                run_id, {f"{Tag.SKIPPED_PREFIX}{k}": v[:500] for k, v in result.skipped.items()}
            )
        tracker.log_metrics(run_id, summary | timing)
    return run_id, result


def ablate(
    uri: str,
    cfg: AblationConfig | None = None,
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
    return ablate_run(run_id, loaded, cfg or AblationConfig(), tracker, None, progress)


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

    from .config import ConfigError, _describe
    from .hf_folder import HF_PREFIX, check_folder
    from .pretrained import load_model_run

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
    model_run = train_spec(spec, tracker, exp_id, progress=progress)
    loaded = load_model_run(tracker, model_run.run_id)
    run_id, result = ablate_run(
        model_run.run_id, loaded, abl, tracker, None, progress, cfg.report.verdict
    )
    return model_run.run_id, run_id, result


@dataclass
class Failure:
    """One part of a study that failed: which variant, in which phase, and why."""

    name: str
    phase: str
    error: str
    run_id: str | None = None

    def __str__(self) -> str:
        return f"{self.name} ({self.phase}: {self.error})"


@dataclass
class StudyResult:
    """What :func:`run` did.

    Attributes:
        study_run_id: the study run.
        models: the trained or reused models.
        ablations: model run id → ablation run id.
        report: path of report.html, or None.
        failures: what failed (the study run is then FAILED).
        resumed: True if an interrupted study was continued.
    """

    study_run_id: str
    models: list[ModelRun] = field(default_factory=list)
    ablations: dict[str, str] = field(default_factory=dict)
    report: Path | None = None
    failures: list[Failure] = field(default_factory=list)
    resumed: bool = False

    def __getitem__(self, key: str):  # dict-style access, as earlier versions returned a dict
        return {
            "study_run_id": self.study_run_id,
            "models": self.models,
            "ablations": self.ablations,
            "report": self.report,
        }[key]


class StudyFailedError(RuntimeError):
    """Some variants of a study failed; the others ran. ``result`` holds everything."""

    def __init__(self, result: StudyResult):
        self.result = result
        n = len(result.failures)
        super().__init__(
            f"{n} part(s) of the study failed: " + "; ".join(map(str, result.failures))
        )


def _error_text(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300]}" if text else type(err).__name__


def study_key(cfg: ExperimentConfig, keys: list[str]) -> str:
    """A study's identity for ``--resume``: the experiment name, its models' keys and the ablation config."""
    blob = json.dumps(
        {
            "experiment": cfg.experiment.name,
            "models": keys,
            "ablation": cfg.ablation.resolved(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ablation_key(cfg: AblationConfig) -> str:
    """Key of an ablation configuration (a finished ablation run of a resumed study is reused on it)."""
    return hashlib.sha256(json.dumps(cfg.resolved(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class StudyContext:
    """What an executor needs to train and ablate a study's variants inside its open study run.

    Attributes:
        cfg, specs: the experiment and its variants × seeds (in order).
        tracker, experiment_id, study_id: the store, the experiment and the open study run.
        result: where the executor records what it did: ``models`` (in ``specs`` order),
            ``ablations`` (model run id → ablation run id) and ``failures``.
        retrain, resume, progress: as :func:`run`'s.
        done: model run id → its FINISHED ablation run of a resumed study (reused, not run again).
        record: writes ``result``'s run ids to the study run (call it as they come in).
    """

    cfg: ExperimentConfig
    specs: list[RunSpec]
    tracker: Tracker
    experiment_id: str
    study_id: str
    result: StudyResult
    retrain: bool
    resume: bool
    progress: bool
    done: dict[str, str]
    record: Callable[[], None]


class Executor(Protocol):
    """Where a study's trainings and ablations run (the local process, or a cluster:
    :class:`attnstudy.distributed.RayExecutor`)."""

    def prepare(self, cfg: ExperimentConfig, tracker: Tracker, experiment_id: str) -> None:
        """Check that the study can run there (before the study run exists); raise if not."""

    def run_variants(self, ctx: StudyContext) -> None:
        """Train and ablate every variant of ``ctx.specs``, recording into ``ctx.result``;
        a variant's failure is recorded, never raised."""

    def close(self) -> None:
        """Release what :meth:`prepare` acquired (always called)."""


def run(
    cfg: ExperimentConfig,
    retrain: bool = False,
    progress: bool = True,
    config_text: str | None = None,
    report: bool = True,
    resume: bool = False,
    executor: Executor | None = None,
) -> StudyResult:
    """The main job: a study run that trains what is missing, ablates every model, and reports.

    Config and data of every variant are checked before anything is written. A runtime failure of
    one variant (training or ablation) is isolated: its run is FAILED and tagged with the error,
    the other variants go on, the report is still built, and the study run ends FAILED with
    ``study/n_ok`` / ``study/n_failed`` and the list. Ctrl-C (or SIGTERM) stops the whole study
    (KILLED). With ``resume``, the newest interrupted study of the same experiment, models and
    ablation settings is continued: finished models and their finished ablations are reused, an
    interrupted training resumes from its checkpoint.

    Args:
        executor: where the trainings and ablations run; None: in this process, one after
            another (the devices are then checked here first). Seed variance, the trained
            adversaries and the report are computed here from the store either way.

    Returns:
        :class:`StudyResult`.

    Raises:
        DataError, TrackingError, DeviceError: before anything is written.
        StudyFailedError: some variants failed (its ``result`` holds what was done).
    """
    adversaries.check_selection(cfg, cfg.runs())
    tracker = open_tracker(cfg, devices_here=executor is None)
    if report:  # a report folder that would be refused at the end is refused before the study
        from attnstudy.outputs import REPORT_KIND, check_replace, store_folders_of
        from attnstudy.report import report_dir

        check_replace(
            report_dir(cfg.experiment.name),
            kind=REPORT_KIND,
            option="the report folder",
            store_folders=store_folders_of(tracker.uri),
        )
    exp_id = tracker.experiment_id(cfg.experiment.name)
    try:
        if executor is not None:
            executor.prepare(cfg, tracker, exp_id)
        return _run(cfg, tracker, exp_id, retrain, progress, config_text, report, resume, executor)
    finally:
        if executor is not None:
            executor.close()


def _run(
    cfg: ExperimentConfig,
    tracker: Tracker,
    exp_id: str,
    retrain: bool,
    progress: bool,
    config_text: str | None,
    report: bool,
    resume: bool,
    executor: Executor | None,
) -> StudyResult:
    """:func:`run` once the store is open and the executor ready."""
    store.reconcile_orphans(tracker, exp_id)
    specs = cfg.runs()
    skey = study_key(cfg, [model_key(spec) for spec in specs])
    study_id = store.find_resumable_study(tracker, exp_id, skey) if resume else None
    resumed = study_id is not None
    if resume and not resumed:
        other = store.interrupted_studies(tracker, exp_id)
        found = (
            f"has this configuration (the newest, {other[0]}, has another study key: a config, "
            "data or ablation setting changed since)"
            if other
            else "to continue"
        )
        notice(
            f"--resume: no interrupted study of experiment {cfg.experiment.name!r} {found}; "
            "starting a new study (a model's interrupted training still resumes from its "
            "checkpoint)"
        )
    if resumed:
        tracker.reopen_run(study_id)
    else:
        study_id = store.start_study(tracker, exp_id, cfg.experiment.name, skey, git_commit())
    result = StudyResult(study_id, resumed=resumed)
    try:
        with tracker.active(study_id):
            _run_study(
                cfg,
                tracker,
                exp_id,
                study_id,
                specs,
                result,
                retrain,
                resume,
                progress,
                config_text,
                executor,
            )
    except StudyFailedError:
        pass  # the study run is FAILED with the list; the report is still built
    if report:
        from attnstudy.report import build_report

        try:
            result.report = build_report(tracker, study_id)
        except Exception as err:
            result.failures.append(Failure("report", "report", _error_text(err)))
            tracker.set_tags(study_id, {Tag.FAILED: "; ".join(map(str, result.failures))[:5000]})
            tracker.end_run(study_id, "FAILED")
    if result.failures:
        raise StudyFailedError(result)
    return result


def _run_study(
    cfg: ExperimentConfig,
    tracker: Tracker,
    exp_id: str,
    study_id: str,
    specs: list[RunSpec],
    result: StudyResult,
    retrain: bool,
    resume: bool,
    progress: bool,
    config_text: str | None,
    executor: Executor | None = None,
) -> None:
    """Train, ablate and compare inside the open study run (see :func:`run`).

    Raises:
        StudyFailedError: some variants failed (after every other variant ran).
    """
    if config_text:
        tracker.log_text(study_id, config_text, Artifact.EXPERIMENT_TOML)
    tracker.log_text(study_id, cfg.model_dump_json(indent=2), Artifact.EXPERIMENT_JSON)
    if not result.resumed:
        tracker.log_params(
            study_id,
            {"experiment": cfg.experiment.name, "n_models": len(specs), **cfg.ablation.flat()},
        )
    tracker.set_tags(
        study_id,
        {
            Tag.NOTE: run_pages.describe_study(
                cfg.experiment.name, len(specs), cfg.ablation.resolved()
            )
        },
    )
    akey = ablation_key(cfg.ablation)

    def record() -> None:
        store.record_study(
            tracker,
            study_id,
            [m.run_id for m in result.models],
            list(result.ablations.values()),
            [f.run_id for f in result.failures if f.run_id],
        )

    done = store.finished_ablations(tracker, study_id, akey) if result.resumed else {}
    ctx = StudyContext(
        cfg, specs, tracker, exp_id, study_id, result, retrain, resume, progress, done, record
    )
    if executor is None:
        _run_variants_here(ctx)
    else:
        executor.run_variants(ctx)
    try:
        _seed_variance(result.models, cfg.ablation, tracker, study_id)
    except Exception as err:
        result.failures.append(Failure("seed variance", "analysis", _error_text(err)))
    if cfg.trained_adversary.enabled:
        try:
            run_trained_adversaries(cfg, result.models, tracker, study_id, progress)
        except Exception as err:
            result.failures.append(Failure("trained adversary", "analysis", _error_text(err)))
    n_ok = len(specs) - len(
        {f.name for f in result.failures if f.phase in ("training", "ablation")}
    )
    tracker.log_metrics(
        study_id, {MetricName.STUDY_N_OK: n_ok, MetricName.STUDY_N_FAILED: len(specs) - n_ok}
    )
    if result.failures:
        tracker.set_tags(study_id, {Tag.FAILED: "; ".join(map(str, result.failures))[:5000]})
        raise StudyFailedError(result)


def _run_variants_here(ctx: StudyContext) -> None:
    """The local executor: every training, then every ablation, one after another in this process."""
    cfg, tracker, exp_id, study_id, result = (
        ctx.cfg,
        ctx.tracker,
        ctx.experiment_id,
        ctx.study_id,
        ctx.result,
    )
    retrain, resume, progress, done, record = (
        ctx.retrain,
        ctx.resume,
        ctx.progress,
        ctx.done,
        ctx.record,
    )
    for spec in ctx.specs:
        try:
            result.models.append(
                train_spec(spec, tracker, exp_id, study_id, retrain, resume, progress)
            )
        except Exception as err:  # isolated: the run is FAILED with the error; the others go on
            result.failures.append(
                Failure(
                    spec.name, "training", _error_text(err), getattr(err, "failed_run_id", None)
                )
            )
        record()
    for m in result.models:
        if m.run_id in done:
            result.ablations[m.run_id] = done[m.run_id]
            continue
        try:
            _, loaded = load_model(f"runs:/{m.run_id}", tracker)
            result.ablations[m.run_id], _ = ablate_run(
                m.run_id, loaded, cfg.ablation, tracker, study_id, progress, cfg.report.verdict
            )
        except Exception as err:
            result.failures.append(
                Failure(
                    m.spec.name, "ablation", _error_text(err), getattr(err, "failed_run_id", None)
                )
            )
        record()


def _seed_variance(
    models: list[ModelRun], cfg: AblationConfig, tracker: Tracker, study_id: str
) -> None:
    """For every configuration trained with several seeds: attention JSD vs output TVD between
    seeds (Wiegreffe & Pinter 2019), logged to the study run."""
    from attnstudy.analysis.seed_variance import seed_variance

    variant_name = run_pages.variant_name

    groups: dict[str, list[ModelRun]] = {}
    for m in models:
        groups.setdefault(model_key(m.spec.model_copy(update={"seed": 0})), []).append(m)
    tables, metrics = [], {}
    for runs in groups.values():
        if len(runs) < 2:
            continue
        loaded = [load_model(f"runs:/{m.run_id}", tracker)[1] for m in runs]
        device = resolve_device(cfg.device, "ablation.device")
        for lm in loaded:
            lm.model.to(device)
        if any(
            lm.src_vocab != loaded[0].src_vocab or lm.tgt_vocab != loaded[0].tgt_vocab
            for lm in loaded
        ):
            continue
        if not loaded[0].model.has_attention:
            continue
        examples = task_data(runs[0].spec).splits.test[: cfg.n_examples]
        table = seed_variance(
            [lm.model for lm in loaded],
            examples,
            loaded[0].src_vocab,
            loaded[0].tgt_vocab,
            seeds=[m.spec.seed for m in runs],
        )
        spec = runs[0].spec
        name = variant_name({Tag.TASK: spec.data.task, Tag.VARIANT: spec.label})
        tables.append(table.assign(variant=name))
        slug = f"{spec.data.task}_{spec.label}".replace("-", "_")
        metrics[f"seed_variance/{slug}/attention_jsd"] = float(
            table["seed_variance_attention_jsd"].mean()
        )
        metrics[f"seed_variance/{slug}/output_tvd"] = float(
            table["seed_variance_output_tvd"].mean()
        )
    if tables:
        tracker.log_table(study_id, pd.concat(tables, ignore_index=True), Artifact.SEED_VARIANCE)
        tracker.log_metrics(study_id, metrics)


def run_trained_adversaries(
    cfg: ExperimentConfig,
    models: list,
    tracker: Tracker,
    study_id: str,
    progress: bool = True,
) -> list[str]:
    """Train (or reuse) every adversary ``[trained_adversary]`` asks for and record them on the
    study (``adversary_run_ids``).

    Args:
        cfg: the experiment.
        models: the study's trained :class:`attnstudy.api.ModelRun` s.
        tracker: the store; study_id: the open study run.

    Returns:
        The adversary run ids, in (base model, λ) order.

    """
    adv = cfg.trained_adversary
    wanted = {id(s) for s in adversaries.selected(cfg, [m.spec for m in models])}
    run_ids = []
    for m in models:
        if id(m.spec) not in wanted:
            continue
        base_run = tracker.get_run(m.run_id)
        base = None  # the base model and its data: read once, when some λ is to be trained
        for lam in adv.lambdas:
            settings, key, name = _adversary_plan(base_run, m.spec, lam, cfg)
            run_id = _finished_adversary(tracker, base_run, key, name)
            if run_id is None:
                if base is None:
                    _, loaded = load_model(f"runs:/{m.run_id}", tracker)
                    data = checked_task_data(
                        loaded, base_run.tags.get(Tag.DATA_DIGEST), f"runs:/{m.run_id}"
                    )
                    base = loaded, data
                run_id = _train_adversary(
                    base_run, m.spec, lam, settings, key, name, *base, cfg, tracker, study_id,
                    progress,
                )  # fmt: skip
            run_ids.append(run_id)
            tracker.set_tags(study_id, {Tag.ADVERSARY_RUN_IDS: ",".join(run_ids)})
    return run_ids


def _adversary_plan(
    base_run, spec: RunSpec, lam: float, cfg: ExperimentConfig
) -> tuple[dict, str, str]:
    """The settings, key and run name of the adversary of ``base_run`` at λ = ``lam``."""
    adv = cfg.trained_adversary
    settings = {
        "epochs": adv.epochs,
        "lr": adv.lr if adv.lr is not None else spec.training.lr,
        "batch_size": adv.batch_size or spec.training.batch_size,
        "n_train": adv.n_train or 0,
        "n_examples": adv.n_examples or cfg.ablation.n_examples,
        "seed": spec.seed + adversaries.ADVERSARY_SEED_OFFSET,
        "bootstrap_resamples": cfg.ablation.bootstrap_resamples,
    }
    key = adversaries.adversary_key(base_run.tags.get(Tag.MODEL_KEY, ""), lam, adv, settings)
    return settings, key, f"{spec.name}/adversary-{adversaries.lambda_label(lam)}"


def _finished_adversary(tracker: Tracker, base_run, key: str, name: str) -> str | None:
    """The id of a finished adversary run with this key (reused), or None."""
    for done in tracker.search_runs(
        [base_run.experiment_id],
        f"tags.{Tag.ADVERSARY_KEY} = '{key}' and attributes.status = 'FINISHED'",
        max_results=1,
    ):
        notice(f"{name}: reusing the finished adversary run {done.run_id} (same key)")
        return done.run_id
    return None


def _train_adversary(
    base_run,
    spec: RunSpec,
    lam: float,
    settings: dict,
    key: str,
    name: str,
    loaded,
    data,
    cfg: ExperimentConfig,
    tracker: Tracker,
    study_id: str,
    progress: bool,
) -> str:
    """Train one adversary from the loaded base model (left unchanged) and log its run."""
    import copy

    import torch

    from .analysis.consistent_adversary import compare_to_base, train_consistent_adversary
    from .models.build import build_model

    adv = cfg.trained_adversary
    base_run_id = base_run.run_id
    train = data.splits.train[: settings["n_train"] or None]
    examples = data.splits.test[: settings["n_examples"]]
    device = resolve_device(spec.training.device, "training.device")
    torch.set_num_threads(spec.training.threads)
    base = loaded.model.to(device)
    if adv.init == "base":
        adversary = copy.deepcopy(base)
    else:
        torch.manual_seed(settings["seed"])
        adversary = build_model(spec.model, len(loaded.src_vocab), len(loaded.tgt_vocab))
    adversary.to(device)
    tags = _run_tags(
        spec, study_id, Kind.ADVERSARY, base_run.tags.get(Tag.MODEL_KEY, ""), data.digest
    )
    tags |= {
        Tag.SOURCE_RUN_ID: base_run_id,
        Tag.ADVERSARY_KEY: key,
        Tag.LAMBDA: f"{lam:g}",
        Tag.DEVICE: str(device),
        Tag.NOTE: (
            f"Model-consistent adversary (Wiegreffe & Pinter 2019, §4) of {spec.name} with "
            f"λ = {lam:g}: trained to keep the base model's outputs (TVD) while moving its "
            f"attention away (−λ·KL), init = {adv.init}; compared on {len(examples)} test examples "
            "(reference prefix)."
        ),
    }
    run_id = tracker.start_run(base_run.experiment_id, name, tags, base_run_id)
    with tracker.active(run_id):
        tracker.log_params(
            run_id, {"lambda": lam, "init": adv.init, "layer": adv.layer, **settings}
        )
        t0 = time.perf_counter()
        history = train_consistent_adversary(
            base,
            adversary,
            train,
            loaded.src_vocab,
            loaded.tgt_vocab,
            lam,
            settings["epochs"],
            settings["lr"],
            settings["batch_size"],
            settings["seed"],
            clip_norm=spec.training.clip_norm,
            layer=adv.layer,
            progress=progress,
            on_epoch=lambda epoch, metrics: tracker.log_metrics(run_id, metrics, step=epoch),
        )
        seconds = time.perf_counter() - t0
        table = compare_to_base(
            base, adversary, examples, loaded.src_vocab, loaded.tgt_vocab, layer=adv.layer
        )
        summary = adversaries.summarize(table, cfg.ablation)
        summary |= {
            "adversary/seconds": seconds,
            "adversary/n_examples": float(len(examples)),
            "adversary/final_train_loss": history[-1]["train/loss"],
        }
        with tempfile.TemporaryDirectory(prefix="attnstudy-adversary-") as tmp:
            path = Path(tmp) / Path(Artifact.ADVERSARY_STEPS).name
            table.to_parquet(path, index=False)
            tracker.log_artifact(run_id, path, str(Path(Artifact.ADVERSARY_STEPS).parent))
        tracker.log_metrics(run_id, summary)
    return run_id


def report(
    study_id: str | None = None,
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
        results_dir: also write its summary tables there as CSV (:mod:`attnstudy.results`);
            for an experiment without a study (trained by ``attnstudy train``), only its table of
            trainings, ``<experiment>-models.csv``, whose path is then returned.

    Raises:
        LookupError: no such experiment or study run, or no store.
    """
    from attnstudy.report import build_report, latest_study

    tracker = tracker or Tracker(create=False)
    if study_id is None and results_dir is not None:
        try:
            study_id = latest_study(tracker, experiment or "quickstart")
        except LookupError:  # trained by `attnstudy train` only: the table of trainings
            from attnstudy.outputs import store_folders_of
            from attnstudy.report import experiment_training_rows
            from attnstudy.results import write_results

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
