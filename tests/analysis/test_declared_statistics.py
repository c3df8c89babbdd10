"""No declared statistic is silently missing from a summary: every statistic of the catalogue
(:meth:`~attnstudy.analysis.catalogue.AblationSpec.all_stats`) yields its value
``ablation/<name>/<stat>``, or its count ``<stat>_n_undefined`` equal to the rows it had to
analyse (every one undefined) — on each path that builds a summary: :func:`run_suite`, an ad-hoc
``ablate`` (:func:`attnstudy.api.ablate`, the run logged to MLflow) and a study
(:func:`attnstudy.api.run`), every entry with every ranking, method and step score enabled (and
faithfulness' opt-in soft erasure), on
three copy-task examples.

A declared column the ablation did not write and a value that is ±inf were left out of the summary
with no count (the first: no key at all; the second: ``_n_undefined`` 0 beside no value).
"""

from __future__ import annotations

import math
import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from analysis_testkit import VOCAB, make_examples, sharpen, tiny_model
from attnstudy.analysis.attribution_params import METHODS
from attnstudy.analysis.catalogue import (
    AblationConfig,
    AblationSpec,
    Stat,
    get_ablation,
    list_ablations,
    register_ablation,
    unregister_ablation,
)
from attnstudy.analysis.contract import capabilities
from attnstudy.analysis.step_scores import (
    list_step_scores,
    register_step_score,
    unregister_step_score,
)
from attnstudy.analysis.suite import run_suite, summary_from_sums

ROOT = Path(__file__).parents[2]
N_EXAMPLES = 3


def every_option(names) -> dict:
    """Each ablation's settings with everything that adds statistics enabled (every ranking,
    method and step score, faithfulness' soft erasure) and small sizes (the checks are about
    keys, not numbers)."""
    scores = [s for s in list_step_scores() if s not in ("tvd", "flip")]
    small = {
        "permutation": {"n": 4},
        "adversarial": {"steps": 3},
        "erase_until_flip": {"n_random_orders": 2},
        "integrated_gradients": {"n_steps": 4},
        "source_prefix": {"n_steps": 4},
        "attribution_agreement": {"integrated_gradients": {"n_steps": 4}},
        "attribution_alignment": {"integrated_gradients": {"n_steps": 4}},
        "faithfulness": {"n_random": 2, "soft_draws": 1},  # soft_* statistics with soft_draws
        "contrastive": {"n": 4},
    }
    out = {}
    for name in names:
        params = get_ablation(name).params
        fields = params.model_fields
        opts = dict(small.get(name, {}))
        if "scores" in fields:
            opts["scores"] = scores
        if "rankings" in fields:
            opts["rankings"] = list(params.RANKINGS)
        if "methods" in fields:  # every method the field accepts (list[Literal[…]]), else all
            inner = typing.get_args(fields["methods"].annotation)[:1]
            opts["methods"] = list(typing.get_args(inner[0]) if inner else ()) or list(METHODS)
        if opts:
            out[name] = opts
    return out


def unaccounted(summary: dict[str, float], name: str, stats) -> list[str]:
    """The statistics of ``name`` with neither a value nor a count of undefined rows that
    explains its absence (every row the ablation analysed undefined)."""
    spec = get_ablation(name)
    n = summary[f"ablation/{name}/{'n_examples' if spec.unit == 'example' else 'n_steps'}"]
    analysed = n - summary[f"ablation/{name}/n_skipped"]
    return [
        stat
        for stat in stats
        if f"ablation/{name}/{stat}" not in summary
        and summary.get(f"ablation/{name}/{stat}_n_undefined") != analysed
    ]


def check_summary(summary: dict[str, float], names, columns) -> None:
    """Every statistic of every ablation ``names`` (its catalogue entry's and those found among
    the table ``columns``) is accounted for; every value is finite."""
    assert all(math.isfinite(v) for v in summary.values())
    for name in names:
        spec = get_ablation(name)
        stats = spec.all_stats(columns)
        assert set(spec.stats) <= set(stats)
        assert unaccounted(summary, name, stats) == [], name


FAMILIES = [
    ("additive", "bahdanau"),  # recurrent: local and global interventions, gradients, values
    ("multihead", "transformer"),  # self-attention too (rollout), heads
    ("none", "bahdanau"),  # no attention: the importance measures without it
]


@pytest.mark.parametrize(("attention", "flow"), FAMILIES, ids=[a for a, _ in FAMILIES])
def test_run_suite_accounts_for_every_declared_statistic(attention, flow):
    model = sharpen(tiny_model(attention, flow))
    names = [
        n
        for n in list_ablations()
        if all(c in capabilities(model) for c in get_ablation(n).requires)
    ]
    cfg = AblationConfig(
        ablations=names,
        n_examples=N_EXAMPLES,
        bootstrap_resamples=20,
        seed=3,
        **every_option(names),
    )
    res = run_suite(model, make_examples(N_EXAMPLES), VOCAB, VOCAB, cfg, progress=False)
    assert res.skipped == {}
    check_summary(res.summary, names, set(res.table.columns) | set(res.examples.columns))
    # the step scores' statistics are among them, for each ablation that takes scores
    for name, opts in every_option(names).items():
        for score in opts.get("scores", ()):
            assert any(k.startswith(f"ablation/{name}/") and score in k for k in res.summary), (
                name,
                score,
            )


def test_a_value_that_is_infinite_at_some_steps_is_counted_undefined_there():
    """A user's step score that is +inf at the <eos> steps: the statistic is the mean over the
    other steps, and those steps are counted undefined (the sum was inf, and the value was
    deleted with a count of 0 undefined)."""

    def p_or_inf(probs, reference, target):
        p = probs.gather(-1, target.broadcast_to(probs.shape[:-1]).unsqueeze(-1)).squeeze(-1)
        return torch.where(target.broadcast_to(p.shape) == 2, math.inf, p)  # 2: <eos>

    register_step_score("p_or_inf", p_or_inf, unit="probability")
    try:
        model = sharpen(tiny_model("additive"))
        cfg = AblationConfig(
            ablations=["uniform"], bootstrap_resamples=20, uniform={"scores": ["p_or_inf"]}
        )
        res = run_suite(model, make_examples(5), VOCAB, VOCAB, cfg, progress=False)
    finally:
        unregister_step_score("p_or_inf")
    rows = res.table[~res.table["uniform_skipped"].astype(bool)]
    values = rows["uniform_p_or_inf"]
    infinite = int(np.isinf(values).sum())
    assert infinite > 0 and np.isfinite(values).sum() > 0
    assert res.summary["ablation/uniform/p_or_inf_n_undefined"] == infinite
    assert res.summary["ablation/uniform/p_or_inf"] == pytest.approx(
        values[np.isfinite(values)].mean()
    )


def test_a_declared_column_the_ablation_did_not_write_is_counted_undefined():
    """A statistic whose column is missing from the ablation's rows had no key at all; now every
    analysed step counts undefined (an optional one, not selected by the settings, stays out)."""

    def run(model, batch, params, ctx):
        ids = [ex.id for ex in batch.examples]
        rows = [
            (i, t) for b, i in enumerate(ids) for t in range(int(batch.trace.step_mask[b].sum()))
        ]
        return pd.DataFrame(
            {
                "example_id": [i for i, _ in rows],
                "step": [t for _, t in rows],
                "probe_written": 1.0,
                "probe_skipped": False,
            }
        )

    register_ablation(
        AblationSpec(
            "probe",
            run=run,
            requires=(),
            stats={
                "written": Stat("probe_written"),
                "forgotten": Stat("probe_forgotten"),
                "not_selected": Stat("probe_not_selected", optional=True),
            },
        )
    )
    try:
        cfg = AblationConfig(ablations=["probe"], bootstrap_resamples=20)
        res = run_suite(tiny_model("additive"), make_examples(4), VOCAB, VOCAB, cfg, progress=False)
    finally:
        unregister_ablation("probe")
    n = len(res.table)
    assert res.summary["ablation/probe/n_steps"] == n
    assert res.summary["ablation/probe/written"] == 1.0
    assert res.summary["ablation/probe/forgotten_n_undefined"] == n
    assert "ablation/probe/forgotten" not in res.summary
    assert not any("not_selected" in k for k in res.summary)


def test_a_summary_value_that_is_not_finite_is_an_error_never_left_out():
    """Finite rows whose sum overflows: summary_from_sums deleted the value without a trace."""
    spec = get_ablation("uniform")
    sums = pd.DataFrame(
        {
            "uniform|n": [1.0, 1.0],
            "uniform|n_skipped": [0.0, 0.0],
            "uniform|tvd_n_undefined": [0.0, 0.0],
            "uniform|tvd|num": [1e308, 1e308],
            "uniform|tvd|den": [1.0, 1.0],
        },
        index=["a", "b"],
    )
    with pytest.raises(ValueError, match="ablation/uniform/tvd.*inf"):
        summary_from_sums(sums, [spec], AblationConfig(bootstrap_resamples=20))


def test_faithfulness_rankings_left_out_have_no_statistics_and_the_chosen_all():
    """The rankings a study leaves out are not measured (no key, no count: the report shows no
    column for them); every statistic of the chosen ones is in the summary, top-1 included."""
    cfg = AblationConfig(
        ablations=["faithfulness"],
        bootstrap_resamples=20,
        faithfulness={"rankings": ["attention", "random"], "n_random": 2},
    )
    res = run_suite(
        sharpen(tiny_model("additive")),
        make_examples(N_EXAMPLES),
        VOCAB,
        VOCAB,
        cfg,
        progress=False,
    )
    keys = {k.removeprefix("ablation/faithfulness/") for k in res.summary}
    for ranking in ("attention", "random"):
        for stat in ("comprehensiveness", "sufficiency", "comprehensiveness_top1"):
            assert f"{stat}_{ranking}" in keys
    assert not any(r in k for k in keys for r in ("saliency", "gradient", "occlusion", "leave"))


# ----------------------------------------------------------------------------- stored paths

# the entries of each kind the stored paths run: per step on the analysis prefix with step scores
# and more_stats, per step on the reference, per example, every ranking and every method
STORED = ["uniform", "permutation_global", "alignment", "faithfulness", "attribution_alignment"]


def _store_checks(run_ids, tracker) -> None:
    """Every statistic of :data:`STORED` accounted for in each ablation run's MLflow metrics
    (its more_stats found among the columns of its logged per-step table)."""
    for run_id in run_ids:
        run = tracker.get_run(run_id)
        columns = set(tracker.load_table(run_id, "ablations/steps.parquet").columns)
        skipped = {k.removeprefix("skipped.") for k in run.tags if k.startswith("skipped.")}
        names = [n for n in STORED if n not in skipped]
        assert skipped <= {"permutation_global", "uniform", "alignment"}  # the none model's
        check_summary(run.metrics, names, columns)
        # the unit the plain keys hold is named (test_primary_unit: a Transformer's heads)
        attention = run.tags["attention"] != "none"
        assert run.tags.get("ablation.primary_unit") == (
            "layer 1 of 1, all heads" if attention else None
        )


def _experiment():
    from attnstudy.experiment import load_experiment

    opts = every_option(STORED)
    sets = [
        f"ablation.ablations={STORED!r}".replace("'", '"'),
        f"ablation.n_examples={N_EXAMPLES}",
        "ablation.bootstrap_resamples=20",
    ]
    for name, values in opts.items():
        for key, value in values.items():
            if isinstance(value, dict):
                for k, v in value.items():
                    sets.append(f"ablation.{name}.{key}.{k}={v!r}")
            else:
                sets.append(f"ablation.{name}.{key}={value!r}".replace("'", '"'))
    return load_experiment(ROOT / "experiments" / "tiny.toml", sets)


# both on a copy of the session's store, whose tiny models they reuse (no training); figures are
# saved undrawn (the same ones are drawn in full by the tiny study's report)


@pytest.mark.slow
def test_a_study_logs_every_declared_statistic(tiny_study_root, figures_not_drawn):
    from attnstudy import api
    from attnstudy.tracking import Tracker

    result = api.run(_experiment(), progress=False, report=False)
    assert result.failures == [] and len(result.ablations) == 2  # additive and no attention
    assert all(m.reused for m in result.models)
    _store_checks(result.ablations.values(), Tracker(create=False))


@pytest.mark.slow
def test_ablate_logs_every_declared_statistic(tiny_study_root, tiny_models, figures_not_drawn):
    from attnstudy import api
    from attnstudy.tracking import Tracker

    cfg = _experiment().ablation
    tracker = Tracker(create=False)
    ids = [
        api.ablate(f"runs:/{r.run_id}", cfg, tracker=tracker, progress=False)[0]
        for r in tiny_models
    ]
    _store_checks(ids, tracker)
