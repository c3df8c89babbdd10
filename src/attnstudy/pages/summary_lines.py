"""The lines ``attnstudy ablate`` prints for a battery, from its numbers alone: each statistic
the report shows with its 95 % bootstrap interval, grouped by the report's questions, then the
verdict and what was skipped. No store and no MLflow: :mod:`attnstudy.report.ablate_summary`
reads a logged run's numbers and adds where its browser and run are;
``attnstudy ablate hf:FOLDER --tsv FILE`` (without ``--record``) (:mod:`attnstudy.study.unrecorded`)
prints these for a battery recorded nowhere.

Labels, units, directions and questions come from the catalogue
(:func:`attnstudy.analysis.catalogue.shown_stats`), the verdict from
:func:`attnstudy.verdict.findings.verdict`. Counters (``n_identity``, ``n_skipped``,
``…_n_undefined``) are not printed: the per-step table holds them.
"""

from __future__ import annotations

from attnstudy.analysis import catalogue
from attnstudy.verdict.findings import VerdictThresholds, facts_from_metrics, verdict

DIRECTION = {"higher": "higher = yes", "lower": "lower = yes", "": ""}
"""How a :data:`attnstudy.analysis.catalogue.Direction` is printed beside a statistic's unit."""


def catalogue_facts(name: str, attention: str, metrics: dict[str, float], params: dict[str, str]):
    """:func:`attnstudy.verdict.findings.facts_from_metrics` of an ablation run's ``metrics`` and
    ``params`` with every statistic, label and verdict role of the catalogue (what the run's
    pages and ``attnstudy ablate``'s lines are built from)."""
    return facts_from_metrics(
        name,
        attention,
        metrics,
        stat_keys=catalogue.stat_keys(),
        labels=catalogue.stat_labels(),
        roles=catalogue.verdict_roles(),
        params=params,
    )


def battery_lines(
    name: str,
    attention: str,
    metrics: dict[str, float],
    params: dict[str, str],
    *,
    skipped: dict[str, str] | None = None,
    thresholds: VerdictThresholds | None = None,
) -> list[str]:
    """A battery's statistics and verdict as ``attnstudy ablate`` prints them.

    Args:
        name: the model's label (the report's).
        attention: its attention family (``"none"``: no attention; ``"pretrained"``).
        metrics: ``ablation/<name>/<stat>`` with ``_ci_low`` / ``_ci_high`` and
            ``ablation/n_examples``, as the ablation run logs them.
        params: the ablation settings, ``ablation.*`` (:meth:`AblationConfig.flat`).
        skipped: ablation → why it was skipped (``SuiteResult.skipped``).
        thresholds: the verdict's thresholds (default :class:`VerdictThresholds`).

    Returns:
        Lines without newlines: a heading naming the model and the sample; per question its
        title and one line per measured statistic (label, ``value [low, high]``, unit, which
        direction answers yes, the decoder steps or examples it was computed on); the verdict
        (each question's answer, then its sentences); the skipped ablations.
    """
    facts = catalogue_facts(name, attention, metrics, params)
    prefix = params.get("ablation.prefix", "greedy")
    lines = [
        f"{name}: {facts.n_examples or '?'} test examples, prefix {prefix}; "
        "each statistic with its 95 % bootstrap interval over examples"
    ]
    shown = [s for s in catalogue.shown_stats() if s.key in facts.stats]
    titles = catalogue.questions()
    width = max((len(s.stat.label) for s in shown), default=0)
    question = None
    for s in shown:
        if s.stat.question != question:
            question = s.stat.question
            lines.append(titles[question].title if question in titles else question)
        est = facts.stats[s.key]
        what = "; ".join(x for x in (s.stat.unit, DIRECTION[s.stat.direction]) if x)
        lines.append(
            f"  {s.stat.label:<{width}}  {est.fmt()}  ({what}; {_counted(s, facts.stat_steps, metrics)})"
        )
    v = verdict(facts, thresholds)
    lines.append("verdict: " + ", ".join(f"{q} {a}" for q, a in v.answers.items()))
    lines += [f"  {sentence}" for sentence in v.sentences]
    lines += [f"skipped {ablation}: {reason}" for ablation, reason in (skipped or {}).items()]
    return lines


def _counted(
    shown: catalogue.ShownStat, stat_steps: dict[str, int], metrics: dict[str, float]
) -> str:
    """What a statistic was computed on: ``198 decoder steps`` (its steps with a value,
    :func:`attnstudy.verdict.findings.steps_computed_on`) or ``20 examples``."""
    if shown.key in stat_steps:
        return f"{stat_steps[shown.key]} decoder steps"
    examples = metrics.get(f"ablation/{shown.ablation}/n_examples") or metrics.get(
        "ablation/n_examples"
    )
    return f"{int(examples)} examples" if examples else "n not logged"
