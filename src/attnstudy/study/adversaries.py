"""Model-consistent adversaries of a study (``[trained_adversary]``; Wiegreffe & Pinter 2019, §4):
which models are attacked, the reuse key, the summary. The study runs them after the seed
variance (:func:`attnstudy.api.run_trained_adversaries`).

For every selected base model and every λ, the study trains a second model
(:func:`attnstudy.analysis.consistent_adversary.train_consistent_adversary`) and compares it with
the base model on test examples. Each adversary is one run, ``<task>/<label>/seed<N>/adversary-
lam<λ>``, nested under its base model's run (kind ``adversary``, tags ``source_run_id``,
``lambda``, ``adversary_key``): params, the per-epoch TVD / KL / loss, the per-step comparison
(``adversary/steps.parquet``) and its summary with 95 % bootstrap intervals resampling examples:
``adversary/attention_jsd``, ``adversary/output_tvd``, ``adversary/argmax_differs``. A finished run
with the same key (the base model's key, λ and every setting that changes the result) is reused,
so ``attnstudy run … --resume`` trains only what is missing. The study records its adversaries
as its members (``attnstudy.study.<id> = "adversary <k>"``); the report draws them as a curve beside the seed variance and Jain &
Wallace's per-instance adversary.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from pathlib import Path

import pandas as pd

from attnstudy.config import ConfigError, RunSpec
from attnstudy.experiment import ExperimentConfig, TrainedAdversaryConfig
from attnstudy.models.devices import resolve_device
from attnstudy.runtime.notices import notice
from attnstudy.runtime.progress import reporting
from attnstudy.study.model_runs import load_model, run_tags
from attnstudy.study.task_data import checked_task_data
from attnstudy.tracking import Artifact, Kind, Role, Tag, Tracker, store

ADVERSARY_SEED_OFFSET = 10_000
"""A scratch adversary of a base model with seed s is initialised (and its batches drawn) with
seed s + this offset, so it starts from neither the base model's weights nor another seed's."""

STATS = {
    "attention_jsd": "attention JSD",
    "output_tvd": "output TVD",
    "argmax_differs": "argmax differs",
}
"""The statistics comparing an adversary with its base model → their labels: the per-step columns
``adversary_<stat>``, summarised as ``adversary/<stat>``, reported under the label."""


def selected(cfg: ExperimentConfig, specs: list[RunSpec]) -> list[RunSpec]:
    """The base models ``[trained_adversary]`` attacks, in study order.

    Default: every variant whose attention is learned (not ``uniform`` or ``none``, not a
    pretrained folder), at the experiment's first seed.
    """
    adv = cfg.trained_adversary
    if not adv.enabled:
        return []
    seeds = adv.seeds or [cfg.experiment.seeds[0]]
    out = []
    for spec in specs:
        if spec.seed not in seeds:
            continue
        if adv.variants is not None:
            if spec.label in adv.variants:
                out.append(spec)
        elif not spec.model.pretrained and spec.model.attention not in ("uniform", "none"):
            out.append(spec)
    return out


def check_selection(cfg: ExperimentConfig, specs: list[RunSpec]) -> None:
    """Refuse a ``[trained_adversary]`` selection that names what the study does not train.

    Raises:
        ConfigError: an unknown variant label or seed, or a named variant without learned
            attention (``uniform``, ``none``, a pretrained folder), each in one line.
    """
    adv = cfg.trained_adversary
    if not adv.enabled:
        return
    labels = {s.label: s for s in specs}
    for label in adv.variants or []:
        if label not in labels:
            raise ConfigError(
                f"trained_adversary.variants: no variant {label!r} in this experiment "
                f"(its variants: {', '.join(sorted(labels))})"
            )
        model = labels[label].model
        if model.pretrained or model.attention in ("uniform", "none"):
            what = "a pretrained folder" if model.pretrained else model.attention
            raise ConfigError(
                f"trained_adversary.variants: {label!r} ({what}) has no learned attention to "
                "move; name a variant with learned attention"
            )
    seeds = {s.seed for s in specs}
    for seed in adv.seeds or []:
        if seed not in seeds:
            raise ConfigError(
                f"trained_adversary.seeds: no model of seed {seed} in this experiment "
                f"(its seeds: {sorted(seeds)})"
            )
    if not selected(cfg, specs):
        raise ConfigError(
            "[trained_adversary]: no variant with learned attention to attack; set "
            "trained_adversary.variants or remove the section"
        )


def adversary_key(
    base_key: str, lam: float, adv: TrainedAdversaryConfig, settings: dict[str, float | int]
) -> str:
    """SHA-256 of what decides an adversary's result: the base model's key, λ, ``init``, the
    layer and the resolved optimisation and evaluation settings, and ``"dropout": "seeded"``:
    since 2026-12-07 the adversary's dropout masks come from its seed alone
    (:func:`attnstudy.analysis.consistent_adversary.train_consistent_adversary`); before, from the
    process's torch generator as earlier work left it, so an adversary stored then is not reused."""
    payload = {
        "base": base_key,
        "lambda": lam,
        "init": adv.init,
        "layer": adv.layer,
        "dropout": "seeded",
        **settings,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def lambda_label(lam: float) -> str:
    """λ as it appears in run names: ``0.1`` → ``lam0.1``."""
    return f"lam{lam:g}"


def summarize(table: pd.DataFrame, ablation_cfg) -> dict[str, float]:
    """``adversary/<stat>`` (micro-average over steps) with ``_ci_low``/``_ci_high`` (95 %
    percentile bootstrap resampling examples, :func:`attnstudy.analysis.suite.step_mean_ci`) and
    ``adversary/n_steps``, from a :func:`compare_to_base` table."""
    from attnstudy.analysis.suite import put_estimate, step_mean_ci

    out: dict[str, float] = {"adversary/n_steps": float(len(table))}
    for stat in STATS:
        put_estimate(
            out, f"adversary/{stat}", step_mean_ci(table, f"adversary_{stat}", ablation_cfg)
        )
    return out


def run_trained_adversaries(
    cfg: ExperimentConfig,
    models: list,
    tracker: Tracker,
    study_id: str,
    *,
    progress: bool = True,
) -> list[str]:
    """Train (or reuse) every adversary ``[trained_adversary]`` asks for and record each as a member
    of the study (:func:`attnstudy.tracking.store.add_member`).

    Args:
        cfg: the experiment.
        models: the study's trained :class:`attnstudy.api.ModelRun` s.
        tracker: the store; study_id: the open study run.

    Returns:
        The adversary run ids, in (base model, λ) order.

    """
    adv = cfg.trained_adversary
    wanted = {id(s) for s in selected(cfg, [m.spec for m in models])}
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
                loaded, data = base
                run_id = _train_adversary(
                    base_run,
                    m.spec,
                    lam,
                    settings=settings,
                    key=key,
                    name=name,
                    loaded=loaded,
                    data=data,
                    cfg=cfg,
                    tracker=tracker,
                    study_id=study_id,
                    progress=progress,
                )
            run_ids.append(run_id)  # recorded in the study as it comes in
            store.add_member(tracker, study_id, run_id, Role.ADVERSARY, len(run_ids) - 1)
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
        "seed": spec.seed + ADVERSARY_SEED_OFFSET,
        "bootstrap_resamples": cfg.ablation.bootstrap_resamples,
    }
    key = adversary_key(base_run.tags.get(Tag.MODEL_KEY, ""), lam, adv, settings)
    return settings, key, f"{spec.name}/adversary-{lambda_label(lam)}"


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
    *,
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

    from attnstudy.analysis.consistent_adversary import compare_to_base, train_consistent_adversary
    from attnstudy.models.families import build_model

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
    tags = run_tags(
        spec,
        study_id=study_id,
        kind=Kind.ADVERSARY,
        key=base_run.tags.get(Tag.MODEL_KEY, ""),
        digest=data.digest,
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
    # CPU and memory as system/*, progress/fraction while it runs (as a trained model's run)
    with (
        tracker.active(run_id),
        tracker.system_metrics(run_id),
        reporting(tracker.progress_sink(run_id)),
    ):
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
        summary = summarize(table, cfg.ablation)
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
