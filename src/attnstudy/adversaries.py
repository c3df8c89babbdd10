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
so ``attnstudy run … --resume`` trains only what is missing. The study lists its adversaries in
the ``adversary_run_ids`` tag; the report draws them as a curve beside the seed variance and Jain &
Wallace's per-instance adversary.
"""

from __future__ import annotations

import hashlib
import json

import pandas as pd

from .config import ConfigError, RunSpec
from .experiment import ExperimentConfig, TrainedAdversaryConfig

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
        elif spec.model.architecture != "hf" and spec.model.attention not in ("uniform", "none"):
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
        if model.architecture == "hf" or model.attention in ("uniform", "none"):
            what = "a pretrained folder" if model.architecture == "hf" else model.attention
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
    layer and the resolved optimisation and evaluation settings."""
    payload = {
        "base": base_key,
        "lambda": lam,
        "init": adv.init,
        "layer": adv.layer,
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
    from .analysis.suite import put_estimate, step_mean_ci

    out: dict[str, float] = {"adversary/n_steps": float(len(table))}
    for stat in STATS:
        put_estimate(
            out, f"adversary/{stat}", step_mean_ci(table, f"adversary_{stat}", ablation_cfg)
        )
    return out
