"""The numbers the verdicts and the tables read, per model: task metrics with bootstrap
intervals (:func:`task_estimates`), the ablation statistics as
:class:`attnstudy.verdict.findings.ModelFacts`
(:func:`model_facts`, :func:`facts_from`), per layer (:func:`layer_facts`), the shifted alignment
check, and the verdict's thresholds (:func:`thresholds_of`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from attnstudy.verdict.findings import (
    Estimate,
    ModelFacts,
    VerdictThresholds,
    estimate,
    facts_from_metrics,
    layer_name,
)

from ..analysis import catalogue
from ..analysis.catalogue import AblationConfig
from ..analysis.per_example import gold_mass_by_offset
from ..data.tasks import task_metrics
from .store import ModelEntry, StudyData


def _bootstrap_cfg(e: ModelEntry) -> SimpleNamespace:
    def get(key, cast, default):
        try:
            return cast(e.ablation_params[key])
        except (KeyError, ValueError):
            return default

    return SimpleNamespace(
        bootstrap_resamples=get("ablation.bootstrap_resamples", int, 1000),
        seed=get("ablation.seed", int, 0),
    )


def task_estimates(e: ModelEntry) -> dict[str, Estimate]:
    """Test metrics with 95 % percentile bootstrap intervals over the test examples (the model
    run's predictions): exact match (mean of ``correct``) and PER (Σ edit distance / Σ reference
    length). A point value is shown with an interval only if it reproduces the logged metric.
    The task's other metrics logged with ``_ci_low`` / ``_ci_high`` (BLEU and chrF,
    :mod:`attnstudy.scoring.translation`) are shown with the logged interval."""
    from ..analysis.suite import ratio_ci

    m = e.model_metrics
    out: dict[str, Estimate] = {}
    p = e.predictions
    cfg = _bootstrap_cfg(e)
    for key in ("test/exact_match", "test_heldin/exact_match", "test_heldout/exact_match"):
        if key not in m:
            continue
        out[key] = Estimate(float(m[key]), n=int(m.get("test/n", 0)) or None)
        if p is not None and "correct" in p and key == "test/exact_match":
            c = p["correct"].astype(float).to_numpy()
            r = ratio_ci(c, np.ones_like(c), cfg)
            if r and abs(r[0] - m[key]) < 1e-9:
                out[key] = Estimate(r[0], r[1], r[2], len(c))
    if "test/per" in m:
        out["test/per"] = Estimate(float(m["test/per"]))
        if p is not None and "edit_distance" in p:
            if "reference_length" in p:
                lengths = p["reference_length"].astype(float).to_numpy()
            else:  # stores of earlier versions: space-joined reference tokens
                lengths = (
                    p["reference"].astype(str).str.split(" ").map(len).astype(float).to_numpy()
                )
            r = ratio_ci(p["edit_distance"].astype(float).to_numpy(), lengths, cfg)
            if r and abs(r[0] - m["test/per"]) < 1e-9:
                out["test/per"] = Estimate(r[0], r[1], r[2], len(lengths))
    for tm in task_metrics([e.task]):  # logged with their intervals (BLEU, chrF)
        if tm.key not in out and f"{tm.key}_ci_low" in m:
            out[tm.key] = estimate(m, tm.key, int(m.get("test/n", 0)) or None)
    return out


def n_layers(e: ModelEntry) -> int:
    """Single layers analysed (all heads jointly) in the model's per-step table."""
    if e.steps is None or e.steps.empty or "layer" not in e.steps.columns:
        return 1
    from ..analysis.layers import layers_of

    return len(layers_of(e.steps))


def layer_facts(e: ModelEntry, base: ModelFacts) -> list[ModelFacts]:
    """Per-layer facts and the layer mean for a model with several layers (else ``[]``)."""
    if n_layers(e) < 2:
        return []
    from ..analysis.layers import layer_summaries

    names = [n for n in e.ablations_run if n not in e.skipped]
    cfg = AblationConfig(
        bootstrap_resamples=_bootstrap_cfg(e).bootstrap_resamples, seed=_bootstrap_cfg(e).seed
    )
    out = []
    per = layer_summaries(e.steps, names, cfg, e.analysis_prefix)
    for key, metrics in per.items():
        # the label is read by people (1-based); the metric keys keep the stored 0-based index
        label = (
            f"{e.variant} · layer {layer_name(key)}"
            if key != "mean"
            else f"{e.variant} · layer mean"
        )
        if key != "mean":
            # per-example ablations (the global permutation) are not in the per-step table: the
            # suite logged each layer's as ablation/layer<k>/<name>/<stat>
            prefix = f"ablation/layer{key}/"
            metrics = {
                "ablation/" + k[len(prefix) :]: v
                for k, v in e.ablation_metrics.items()
                if k.startswith(prefix) and "/head" not in k
            } | dict(metrics)
        f = facts_from(label, e, metrics)
        f.n_examples = base.n_examples
        out.append(f)
    return out


def shifted_alignment(e: ModelEntry, t: VerdictThresholds):
    """(offset, gold mass at the offset, gold mass in place) when the attention sits a source
    position off the gold links (by at least ``t.shift_gain``), else None; from the example
    records (reference prefix), with bootstrap intervals over examples."""
    from ..analysis.suite import ratio_ci

    offsets = gold_mass_by_offset(e.records)
    if not offsets or len(offsets[0][1]) < 2:
        return None
    cfg = _bootstrap_cfg(e)
    est = {}
    for k, (num, den) in offsets.items():
        r = ratio_ci(num, den, cfg)
        if r is not None:
            est[k] = Estimate(r[0], r[1], r[2], len(num))
    if 0 not in est:
        return None
    best = max((k for k in est if k != 0), key=lambda k: est[k].value, default=None)
    if best is None or est[best].value - est[0].value < t.shift_gain:
        return None
    return best, est[best], est[0]


def facts_from(name: str, e: ModelEntry, metrics: dict) -> ModelFacts:
    """:func:`attnstudy.verdict.findings.facts_from_metrics` of a model's entry: every statistic of
    the
    catalogue, and its task's metrics (the task registry's)."""
    return facts_from_metrics(
        name,
        e.attention,
        metrics,
        stat_keys=catalogue.stat_keys(),
        labels=catalogue.stat_labels(),
        roles=catalogue.verdict_roles(),
        params=e.ablation_params,
        task_metrics=e.model_metrics,
        task_keys=[m.key for m in task_metrics([e.task])],
    )


def model_facts(e: ModelEntry, t: VerdictThresholds) -> ModelFacts:
    """What the verdicts are computed from for one model: its ablation summary metrics with
    their bootstrap intervals, its task metrics, its number of test examples, and the shifted
    alignment check (:func:`shifted_alignment`, thresholds ``t``)."""
    f = facts_from(e.variant, e, e.ablation_metrics)
    f.task_metrics = task_estimates(e)
    if e.steps is not None and len(e.steps) and not f.n_examples:
        f.n_examples = int(e.steps["example_id"].nunique())
    f.shift = shifted_alignment(e, t)
    return f


def thresholds_of(data: StudyData, override: dict | None = None) -> VerdictThresholds:
    """The verdict's thresholds: the study's ``[report.verdict]`` (its logged experiment.json),
    then ``override`` (``attnstudy report --verdict KEY=VALUE``)."""
    base = ((data.experiment_json or {}).get("report") or {}).get("verdict") or {}
    return VerdictThresholds.model_validate(base | dict(override or {}))
