"""Python API with the CLI's verbs: ``train``, ``predict``, ``ablate``, ``run`` (DESIGN.md §6).

Composition root together with :mod:`attnstudy.cli`: it wires data, models, training, the
analysis suite and tracking. Everything here takes validated configs.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from .config import AblationConfig, ExperimentConfig, RunSpec
from .data.dates import is_heldout
from .data.tasks import DataError, Splits, load_task, tokenize
from .data.vocab import Vocab
from .metrics import evaluate, per_example
from .models.io import LoadedModel, load_model_dir, save_model_dir
from .tracking import Tracker, git_commit, project_root
from .training import early_stopping_metric, evaluate_split, max_decode_len, train


@dataclass
class ModelRun:
    """A trained model in the store."""

    run_id: str
    spec: RunSpec
    reused: bool
    metrics: dict[str, float] = field(default_factory=dict)


@functools.lru_cache(maxsize=8)
def _load_splits(data_json: str) -> Splits:
    from .config import DataConfig

    return load_task(DataConfig.model_validate_json(data_json))


def load_data(spec: RunSpec) -> tuple[Splits, Vocab, Vocab]:
    """The task's splits and vocabularies built from its training split (cached per data config)."""
    splits = _load_splits(spec.data.model_dump_json())
    src_vocab = Vocab.build(ex.src for ex in splits.train)
    tgt_vocab = Vocab.build(ex.tgt for ex in splits.train)
    return splits, src_vocab, tgt_vocab


def registered_name(spec: RunSpec) -> str:
    """Registered model name, e.g. ``quickstart-g2p-additive-bahdanau``."""
    return f"{spec.experiment}-{spec.data.task}-{spec.model.attention}-{spec.model.flow}"


def _run_tags(spec: RunSpec, study_id: str | None, kind: str) -> dict[str, str]:
    tags = {"kind": kind, "task": spec.data.task, "attention": spec.model.attention, "flow": spec.model.flow,
            "seed": str(spec.seed), "config_hash": spec.config_hash(), "git_commit": git_commit(),
            "experiment": spec.experiment}
    if study_id:
        tags["study_id"] = study_id
        tags["study_ids"] = study_id
    return tags


def train_spec(spec: RunSpec, tracker: Tracker, experiment_id: str, study_id: str | None = None,
               retrain: bool = False, resume: bool = False, progress: bool = True) -> ModelRun:
    """Train one model (or reuse a finished run with the same config hash) and log it.

    Raises:
        DataError: bad data. TrackingError: store problems. KeyboardInterrupt: the run is marked
        KILLED and the last complete checkpoint is kept for ``resume``.
    """
    h = spec.config_hash()
    if not retrain:
        existing = tracker.find_finished_model(experiment_id, h)
        if existing is not None:
            if study_id:
                ids = set(filter(None, existing.data.tags.get("study_ids", "").split(","))) | {study_id}
                tracker.set_tags(existing.info.run_id, {"study_ids": ",".join(sorted(ids))})
            return ModelRun(existing.info.run_id, spec, True, dict(existing.data.metrics))
    splits, src_vocab, tgt_vocab = load_data(spec)
    run_id = tracker.start_run(experiment_id, spec.name, _run_tags(spec, study_id, "model"), study_id)
    with tracker.active(run_id):
        tracker.log_params(run_id, spec.flat_params())
        tracker.log_params(run_id, {"data.n_train_examples": len(splits.train), "data.n_dev_examples": len(splits.dev),
                                    "data.n_test_examples": len(splits.test), "src_vocab_size": len(src_vocab),
                                    "tgt_vocab_size": len(tgt_vocab),
                                    "training.early_stopping_metric": early_stopping_metric(spec)})
        tracker.log_text(run_id, spec.model_dump_json(indent=2), "config.json")
        ckpt_dir = project_root() / "mlruns" / "checkpoints" / h
        result = train(spec, splits, src_vocab, tgt_vocab, ckpt_dir, resume=resume, progress=progress,
                       on_epoch=lambda epoch, m: tracker.log_metrics(run_id, m, step=epoch))
        final: dict[str, float] = {"train/seconds": result.seconds, "train/best_epoch": result.best_epoch,
                                   "train/epochs": len(result.history)}
        test_metrics, hyps = evaluate_split(result.model, splits.test, src_vocab, tgt_vocab, spec)
        final.update({f"test/{k}": v for k, v in test_metrics.items()})
        final.update(heldout_metrics(hyps, splits.test))
        # the best epoch's dev metrics were computed during training: no second decode of dev
        best = result.history[result.best_epoch - 1]
        final.update({f"best_dev/{k[len('dev/'):]}": v for k, v in best.items() if k.startswith("dev/")})
        if spec.training.beam_size > 1:
            beam_metrics, _ = evaluate_split(result.model, splits.test, src_vocab, tgt_vocab, spec,
                                             beam_size=spec.training.beam_size)
            final.update({f"test_beam/{k}": v for k, v in beam_metrics.items()})
        tracker.log_metrics(run_id, final, step=len(result.history))
        preds = pd.DataFrame(per_example(hyps, splits.test))
        preds.insert(0, "example_id", [ex.id for ex in splits.test])
        preds.insert(1, "src_len", [len(ex.src) for ex in splits.test])
        tracker.log_table(run_id, preds, "predictions/test.parquet")
        # the model files are kept locally first, so a tracking failure loses no trained model
        model_dir = save_model_dir(ckpt_dir / "model", result.model, spec, src_vocab, tgt_vocab)
        tracker.log_model_dir(run_id, model_dir, registered_name(spec))
    return ModelRun(run_id, spec, False, final)


def heldout_metrics(hyps: list[list[str]], test: list) -> dict[str, float]:
    """``test_heldin/*`` and ``test_heldout/*`` metrics when the test split mixes both (the dates task
    holds out locales/patterns, ids ``…/test/heldout/…``); empty otherwise. Reuses the decoded ``hyps``."""
    held = [is_heldout(ex.id) for ex in test]
    if not any(held) or all(held):
        return {}
    out: dict[str, float] = {}
    for name, want in (("heldin", False), ("heldout", True)):
        idx = [i for i, h in enumerate(held) if h == want]
        metrics = evaluate([hyps[i] for i in idx], [test[i] for i in idx])
        out.update({f"test_{name}/{k}": v for k, v in metrics.items()})
    return out


def train_experiment(cfg: ExperimentConfig, tracker: Tracker | None = None, study_id: str | None = None,
                     retrain: bool = False, resume: bool = False, progress: bool = True) -> list[ModelRun]:
    """Train (or reuse) every model of an experiment. Returns one :class:`ModelRun` per spec."""
    check_data(cfg)
    tracker = tracker or Tracker(cfg.experiment.tracking_uri, cfg.experiment.tracking_timeout)
    exp_id = tracker.experiment_id(cfg.experiment.name)
    return [train_spec(spec, tracker, exp_id, study_id, retrain, resume, progress) for spec in cfg.runs()]


def check_data(cfg: ExperimentConfig) -> None:
    """Load every model's data before anything touches the store, so bad data changes nothing.

    Raises:
        DataError: a missing or malformed data file, an empty split, …
    """
    for spec in cfg.runs():
        splits, _, _ = load_data(spec)
        for name in ("train", "dev", "test"):
            if not getattr(splits, name):
                raise DataError(f"{spec.name}: the {name} split is empty; check the data sizes and files")


def load_model(uri: str, tracker: Tracker | None = None) -> tuple[str, LoadedModel]:
    """Load a model from ``runs:/…``, ``models:/name/version``, ``models:/name@alias`` or a local
    directory holding the model files. Returns (run id or "", model).

    Raises:
        TrackingError, ModelLoadError.
    """
    if Path(uri).is_dir():
        return "", load_model_dir(uri)
    tracker = tracker or Tracker()
    with tempfile.TemporaryDirectory() as tmp:
        run_id, local = tracker.download_model_dir(uri, tmp)
        return run_id, load_model_dir(local)


def tokenizations(spec: RunSpec) -> tuple[str, str]:
    """How raw source text is split and how output tokens are joined: (source, target)."""
    if spec.data.task == "tsv":
        return spec.data.tokenization, spec.data.tokenization
    if spec.data.task == "g2p":
        return "chars", "spaces"
    tok = "chars" if spec.data.vocab_size <= 52 else "spaces"
    return tok, tok


def predict_loaded(loaded: LoadedModel, inputs: list[str], beam_size: int = 1, with_attention: bool = False) -> list[dict]:
    """Decode raw input strings with a loaded model.

    Returns:
        one dict per input: ``input``, ``output`` (detokenised), ``tokens``, ``n_unknown`` (source
        tokens mapped to ``<unk>``), and with ``with_attention`` the head-mean attention matrix
        ``attention`` (T_y × T_x, list of lists) with ``source_tokens``.

    Raises:
        DataError: an empty input.
    """
    from .data.batching import collate
    from .data.tasks import Example, detokenize
    from .models import eval_mode

    spec, model = loaded.spec, loaded.model
    tok, out_tok = tokenizations(spec)
    results = []
    for text in inputs:
        tokens = tokenize(text.lower() if spec.data.task == "g2p" else text, tok)
        if not tokens:
            raise DataError(f"empty input {text!r}: give at least one token")
        ex = Example(id="input", src=tuple(tokens), tgt=("<unk>",))
        batch = collate([ex], loaded.src_vocab, loaded.tgt_vocab)
        max_len = max_decode_len(spec, len(tokens))
        with eval_mode(model), torch.no_grad():
            if beam_size > 1:
                ids = model.beam_search(batch.src, batch.src_lengths, max_len, beam_size)[0]
            else:
                ids = model.greedy(batch.src, batch.src_lengths, max_len)[0]
        out_tokens = loaded.tgt_vocab.decode(ids)
        rec = {"input": text, "output": detokenize(out_tokens, out_tok), "tokens": out_tokens,
               "n_unknown": loaded.src_vocab.count_unknown(tokens)}
        if with_attention:
            tin = torch.tensor([[1] + ids])
            tout = torch.tensor([ids + [2]])
            with eval_mode(model), torch.no_grad():
                tr = model.trace(batch.src, batch.src_lengths, tin, tout)
            rec["source_tokens"] = tokens
            rec["attention"] = (None if tr.attention is None
                                else [[round(float(v), 4) for v in row] for row in tr.attention.mean(1)[0]])
        results.append(rec)
    return results


def predict(uri: str, inputs: list[str], beam_size: int = 1, with_attention: bool = False) -> list[dict]:
    """Load a model (see :func:`load_model`) and decode ``inputs`` (see :func:`predict_loaded`)."""
    _, loaded = load_model(uri)
    return predict_loaded(loaded, inputs, beam_size, with_attention)


def ablate_run(model_run_id: str, loaded: LoadedModel, cfg: AblationConfig, tracker: Tracker,
               study_id: str | None = None, progress: bool = True):
    """Run the ablation suite on a model's test sample and log it as a nested run.

    Returns:
        (ablation run id, SuiteResult); the per-step table is streamed to the run's
        ``ablations/steps.parquet`` artifact, so ``SuiteResult.table`` is None.
    """
    from analysis.suite import run_suite

    spec = loaded.spec
    splits = _load_splits(spec.data.model_dump_json())
    examples = splits.test[: cfg.n_examples]
    exp_id = tracker.get_run(model_run_id).info.experiment_id
    tags = _run_tags(spec, study_id, "ablation") | {"source_run_id": model_run_id}
    run_id = tracker.start_run(exp_id, f"{spec.name}/ablations", tags, model_run_id)
    with tracker.active(run_id):
        tracker.log_params(run_id, {f"ablation.{k}": (json.dumps(v) if isinstance(v, list) else str(v))
                                    for k, v in cfg.model_dump(mode="json", exclude={"adversarial"}).items()})
        tracker.log_params(run_id, {f"ablation.adversarial.{k}": str(v) for k, v in cfg.adversarial.model_dump().items()})
        with tempfile.TemporaryDirectory(prefix="attnstudy-ablate-") as tmp:
            steps_path = Path(tmp) / "steps.parquet"  # streamed: memory stays flat in n_examples
            t0 = time.perf_counter()
            result = run_suite(loaded.model, examples, loaded.src_vocab, loaded.tgt_vocab, cfg, progress=progress,
                               table_path=steps_path)
            summary = dict(result.summary) | {"ablation/seconds": time.perf_counter() - t0}
            tracker.log_artifact(run_id, steps_path, "ablations")
        if result.examples is not None and len(result.examples):
            tracker.log_table(run_id, result.examples, "ablations/examples.parquet")
        if "adversarial" in cfg.ablations and loaded.model.has_attention:
            from analysis.heatmaps import heatmap_data

            tracker.log_text(run_id, json.dumps(heatmap_data(loaded.model, examples, loaded.src_vocab,
                                                             loaded.tgt_vocab, cfg)), "ablations/heatmaps.json")
        if result.skipped:
            tracker.log_text(run_id, json.dumps(result.skipped, indent=2), "ablations/skipped.json")
            tracker.set_tags(run_id, {f"skipped.{k}": v[:500] for k, v in result.skipped.items()})
        tracker.log_metrics(run_id, summary)
    return run_id, result


def ablate(uri: str, cfg: AblationConfig | None = None, tracker: Tracker | None = None, progress: bool = True):
    """Load a model from the store and run the ablation suite on it (nested run under the model).

    Returns:
        (ablation run id, SuiteResult).
    """
    tracker = tracker or Tracker()
    run_id, loaded = load_model(uri, tracker)
    if not run_id:
        raise ValueError("ablate needs a model in the tracking store (runs:/… or models:/…)")
    study_id = tracker.get_run(run_id).data.tags.get("study_id")
    return ablate_run(run_id, loaded, cfg or AblationConfig(), tracker, study_id, progress)


def run(cfg: ExperimentConfig, retrain: bool = False, progress: bool = True, config_text: str | None = None,
        report: bool = True) -> dict:
    """The main job: a study run that trains what is missing, ablates every model, and reports.

    Returns:
        dict with ``study_run_id``, ``models`` (ModelRun list), ``ablations`` (run ids) and
        ``report`` (path or None).
    """
    check_data(cfg)
    tracker = Tracker(cfg.experiment.tracking_uri, cfg.experiment.tracking_timeout)
    exp_id = tracker.experiment_id(cfg.experiment.name)
    study_id = tracker.start_run(exp_id, f"{cfg.experiment.name}/study",
                                 {"kind": "study", "experiment": cfg.experiment.name, "git_commit": git_commit()})
    with tracker.active(study_id):
        tracker.set_tags(study_id, {"study_id": study_id})
        if config_text:
            tracker.log_text(study_id, config_text, "experiment.toml")
        tracker.log_text(study_id, cfg.model_dump_json(indent=2), "experiment.json")
        models = [train_spec(spec, tracker, exp_id, study_id, retrain, progress=progress) for spec in cfg.runs()]
        ablations = {}
        for m in models:
            _, loaded = load_model(f"runs:/{m.run_id}", tracker)
            ablations[m.run_id], _ = ablate_run(m.run_id, loaded, cfg.ablation, tracker, study_id, progress)
        tracker.set_tags(study_id, {"model_run_ids": ",".join(m.run_id for m in models)})
        _seed_variance(models, cfg.ablation, tracker, study_id)
        report_path = None
        if report:
            from analysis.report import build_report

            report_path = build_report(tracker, study_id)
    return {"study_run_id": study_id, "models": models, "ablations": ablations, "report": report_path}


def _seed_variance(models: list[ModelRun], cfg: AblationConfig, tracker: Tracker, study_id: str) -> None:
    """For every configuration trained with several seeds: attention JSD vs output TVD between
    seeds (Wiegreffe & Pinter 2019), logged to the study run."""
    from analysis.report import variant_name
    from analysis.seed_variance import seed_variance

    groups: dict[str, list[ModelRun]] = {}
    for m in models:
        groups.setdefault(m.spec.model_copy(update={"seed": 0}).config_hash(), []).append(m)
    tables, metrics = [], {}
    for runs in groups.values():
        if len(runs) < 2:
            continue
        loaded = [load_model(f"runs:/{m.run_id}", tracker)[1] for m in runs]
        if any(lm.src_vocab != loaded[0].src_vocab or lm.tgt_vocab != loaded[0].tgt_vocab for lm in loaded):
            continue
        if not loaded[0].model.has_attention:
            continue
        examples = _load_splits(runs[0].spec.data.model_dump_json()).test[: cfg.n_examples]
        table = seed_variance([lm.model for lm in loaded], examples, loaded[0].src_vocab, loaded[0].tgt_vocab,
                              seeds=[m.spec.seed for m in runs])
        spec = runs[0].spec
        name = variant_name({"task": spec.data.task, "attention": spec.model.attention, "flow": spec.model.flow})
        tables.append(table.assign(variant=name))
        slug = f"{spec.data.task}_{spec.model.attention}_{spec.model.flow}"
        metrics[f"seed_variance/{slug}/attention_jsd"] = float(table["seed_variance_attention_jsd"].mean())
        metrics[f"seed_variance/{slug}/output_tvd"] = float(table["seed_variance_output_tvd"].mean())
    if tables:
        tracker.log_table(study_id, pd.concat(tables, ignore_index=True), "seed_variance/steps.parquet")
        tracker.log_metrics(study_id, metrics)


def report(study_id: str | None = None, experiment: str | None = None, out_dir: str | None = None,
           tracker: Tracker | None = None) -> Path:
    """Build the report of a study (default: the latest study of ``experiment``, default quickstart).

    Raises:
        LookupError: no such experiment or study run.
    """
    from analysis.report import build_report, latest_study

    tracker = tracker or Tracker()
    study_id = study_id or latest_study(tracker, experiment or "quickstart")
    return build_report(tracker, study_id, out_dir)
