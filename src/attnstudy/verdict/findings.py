"""The report's findings: a short verdict per model, built only from the measured numbers with
their 95 % intervals and n, one overall paragraph, and the literature's findings cited once per
report (:data:`LITERATURE_CONTEXT`), not in every model's verdict.

Four questions, each answered by a rule on interval bounds whose thresholds are stated in the
report and configurable (``[report.verdict]`` of the experiment file, or ``attnstudy report
--verdict KEY=VALUE``). Which statistics feed which question, and how, is declared by the
statistics themselves in the ablation catalogue (:class:`VerdictRole`, the catalogue's
``Stat(verdict=…)``; :func:`attnstudy.analysis.catalogue.verdict_roles` passes them in
:attr:`ModelFacts.roles`); this module holds the rules and the sentences, and names no ablation:

* **used?** — does the output depend on the attention weights? Its measures' intervals against
  ``used_flip`` / ``unused_flip`` (the permutation flip rate: the share of random permutations of
  α_t that change the predicted token, averaged over steps), with the statistics beside them
  (uniform and erase-max flip rates) and the global-permutation exact-match drop (:class:`Drop`);
* **unique?** — is there another attention distribution, far from α_t, with nearly the same
  output? Adversarial share of steps with an alternative within ε_eval (TVD) and its JSD: not
  unique where both pass their thresholds, unique where either stays below;
* **agrees?** — does attention rank source tokens as the importance measures do? Attention's
  Kendall τ with every importance measure measured (gradient × input, leave-one-out, saliency,
  input × gradient, integrated gradients, occlusion, and any entry declaring one), against one
  yardstick: the median τ between the pairs of importance measures other than attention that
  were measured (τ gradient–LOO of the importance ablation, the attribution_agreement matrix);
  unclear while that yardstick is itself weak, n/a without one. Attention's τ with measures built
  from attention (norm, rollout) is named, not read;
* **aligns?** — is the attention argmax a word alignment? AER against ``align_aer`` /
  ``no_align_aer``, with the attention mass on gold links beside it.

Where the opt-in ``faithfulness`` ablation ran, one more sentence names the ranking whose deletion
lowers p(y_t) most (comprehensiveness AOPC, DeYoung et al. 2020) with its interval, and whether
that interval is clear of the runner-up's (:func:`_faithful`; the rankings are those measured); an
entry's ``note`` role adds a sentence of its own (the contrastive gradient's τ with attention).

Only these published reference points are quoted with numbers (others qualitatively):
Jain & Wallace 2019 (NAACL), Moradi et al. 2019, Vashishth et al. 2019 (see :data:`LITERATURE`),
in :data:`LITERATURE_CONTEXT` only. Moradi et al.'s shares are of output words by word class, not
per-step token flip rates, so they are cited as context, never set beside a measured flip rate.

This module imports only the standard library, pydantic and the torch-free :mod:`attnstudy.config`
(it is used by config validation).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from attnstudy.config import _Strict
from attnstudy.verdict.roles import (  # noqa: F401 (re-exported: the roles' names beside the verdict's)
    THRESHOLD_QUESTIONS,
    VERDICT_QUESTIONS,
    WORDING,
    Drop,
    Thresholds,
    VerdictRole,
    Wording,
    criterion_sentence,
)

LITERATURE = {
    "jw": "Jain & Wallace (2019, NAACL)",
    "moradi": "Moradi et al. (2019)",
    "vashishth": "Vashishth et al. (2019)",
    "kk": "Koehn & Knowles (2017)",
}
LITERATURE_CONTEXT = (
    f"{LITERATURE['jw']} found, for text classifiers with BiLSTM encoders, that permuting "
    "attention often changed the output little, that adversarial attention far from the original "
    "gave nearly the same output for most instances, and that attention correlated only weakly "
    f"with gradient and leave-one-out importance. {LITERATURE['vashishth']} found that in neural "
    "machine translation, unlike in classification, permuting attention degrades the output "
    f"substantially. {LITERATURE['moradi']} report that an NMT model under counterfactual "
    "attention at every decoder step still produced the same word for 68 % of function words and "
    "21 % of content words; those are shares of output words by word class, not the per-step "
    "token flip rates of this report's tables, so the two are not compared here."
)
"""The literature's findings the report cites, once, beside the per-model verdicts (which quote
only this study's numbers)."""

REFERENCES = [
    "Jain, S. & Wallace, B. C. (2019). Attention is not Explanation. NAACL.",
    "Moradi, P., Kambhatla, N. & Sarkar, A. (2019). Interrogating the Explanatory Power of "
    "Attention in Neural Machine Translation. WNGT.",
    "Vashishth, S., Upadhyay, S., Tomar, G. S. & Faruqui, M. (2019). Attention Interpretability "
    "Across NLP Tasks. arXiv:1909.11218.",
    "Serrano, S. & Smith, N. A. (2019). Is Attention Interpretable? ACL.",
    "Wiegreffe, S. & Pinter, Y. (2019). Attention is not not Explanation. EMNLP.",
    "Och, F. J. & Ney, H. (2003). A Systematic Comparison of Various Statistical Alignment "
    "Models. Computational Linguistics 29(1).",
    "Koehn, P. & Knowles, R. (2017). Six Challenges for Neural Machine Translation. WNMT.",
]


class VerdictThresholds(_Strict):
    """``[report.verdict]``: the thresholds the verdict's rules use (all stated in the report)."""

    used_flip: float = Field(
        0.10,
        ge=0,
        le=1,
        description="attention is used if the permutation flip rate's lower 95 % bound is at least this",
    )
    unused_flip: float = Field(
        0.02,
        ge=0,
        le=1,
        description="attention is not used if the permutation flip rate's upper 95 % bound is below this",
    )
    unique_found: float = Field(
        0.5,
        ge=0,
        le=1,
        description="not a unique explanation if the share of steps with an adversary within ε_eval "
        "has its lower bound at least this …",
    )
    unique_jsd: float = Field(
        0.1,
        ge=0,
        le=math.log(2),
        description="… and the adversaries' JSD (nats) has its lower bound at least this; unique if "
        "either upper bound is below its threshold",
    )
    tau_weak: float = Field(
        0.3,
        ge=-1,
        le=1,
        description="Kendall τ below this is weak agreement; agreement is unclear while "
        "gradient–LOO's upper bound is below this and attention's τ is not above it",
    )
    tau_strong: float = Field(
        0.6, ge=-1, le=1, description="Kendall τ at least this is strong agreement"
    )
    align_aer: float = Field(
        0.3,
        ge=0,
        le=1,
        description="attention aligns if the AER's upper 95 % bound is at most this",
    )
    no_align_aer: float = Field(
        0.6,
        ge=0,
        le=1,
        description="attention does not align if the AER's lower 95 % bound is at least this",
    )
    shift_gain: float = Field(
        0.2,
        ge=0,
        le=1,
        description="attention is reported as shifted if gold mass one source position off exceeds "
        "gold mass in place by at least this",
    )


class ReportConfig(BaseModel):
    """``[report]`` of an experiment file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    verdict: VerdictThresholds = Field(default_factory=VerdictThresholds)


@dataclass(frozen=True)
class Estimate:
    """A statistic with its 95 % bootstrap interval (NaN bounds: none) and n examples."""

    value: float
    low: float = math.nan
    high: float = math.nan
    n: int | None = None

    @property
    def has_ci(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def fmt(self, digits: int = 3) -> str:
        """``value [low, high]`` (or the value alone when there is no interval)."""
        v = f"{self.value:.{digits}g}" if abs(self.value) < 1000 else f"{self.value:,.0f}"
        if not self.has_ci:
            return v
        return f"{v} [{self.low:.{digits}g}, {self.high:.{digits}g}]"

    def pct(self) -> str:
        """As percentages: ``41 % [38, 44]``."""
        v = f"{100 * self.value:.0f} %"
        return f"{v} [{100 * self.low:.0f}, {100 * self.high:.0f}]" if self.has_ci else v


def estimate(metrics: dict, key: str, n: int | None = None) -> Estimate | None:
    """The :class:`Estimate` of metric ``key`` (with ``key_ci_low``/``key_ci_high``), or None."""
    if key not in metrics or metrics[key] is None or not math.isfinite(float(metrics[key])):
        return None
    return Estimate(
        float(metrics[key]),
        float(metrics.get(f"{key}_ci_low", math.nan)),
        float(metrics.get(f"{key}_ci_high", math.nan)),
        n,
    )


def steps_computed_on(metrics: dict, key: str) -> int | None:
    """The decoder steps the statistic ``key`` (``ablation/<name>/<stat>``) was computed on.

    ``ablation/<name>/n_steps`` (the steps analysed) less ``ablation/<name>/n_skipped`` (steps the
    ablation could not analyse, e.g. one-token sources for the permutation) less
    ``<key>_n_undefined`` (steps where the statistic has no value, e.g. <eos> for gold mass),
    each as the suite logged it (:func:`attnstudy.analysis.suite.summary_from_sums`); counters
    not logged count 0 (a ratio of sums, AER, logs no undefined count).

    Returns:
        The count (≥ 0), or None where ``n_steps`` was not logged (per-example ablations).
    """
    n = metrics.get(f"{key.rsplit('/', 1)[0]}/n_steps")
    if not n or not math.isfinite(float(n)):
        return None
    less = 0.0
    for counter in (f"{key.rsplit('/', 1)[0]}/n_skipped", f"{key}_n_undefined"):
        v = metrics.get(counter)
        if v is not None and math.isfinite(float(v)):
            less += float(v)
    return max(int(round(float(n) - less)), 0)


@dataclass
class ModelFacts:
    """What the verdict of one model (one layer, or the layer mean) is built from.

    Attributes:
        name: the model (``g2p additive-bahdanau``, ``… · layer 2``, ``… · layer mean``).
        attention: the attention score (``none`` and ``uniform`` are baselines).
        stats: ``ablation/<name>/<stat>`` → :class:`Estimate` (the keys present were measured).
        n_examples, n_steps: the analysed sample (n_steps: the first ablation's count).
        steps_of: each ablation's analysed decoder steps (``ablation/<name>/n_steps``): the
            alignment counts the reference prefix's steps, the interventions the analysis
            prefix's.
        stat_steps: ``ablation/<name>/<stat>`` → the decoder steps that statistic was computed on
            (:func:`steps_computed_on`: analysed, not skipped, not undefined); what ``attnstudy
            ablate``, the report's steps columns and the verdict's "n = …" print.
        eps: ε_eval of the adversarial search (TVD); n_permutations: P.
        shift: (offset, gold mass at the offset, gold mass in place) when attention sits off the
            gold links (see :func:`attnstudy.report.shifted_alignment`), else None.
        task_metrics: ``test/exact_match`` … → :class:`Estimate`.
        labels: ``ablation/<name>/<stat>`` → the statistic's label in the report (the
            catalogue's :attr:`~attnstudy.analysis.catalogue.Stat.label`).
        roles: ``ablation/<name>/<stat>`` → its :class:`VerdictRole`, in the catalogue's order
            (:func:`attnstudy.analysis.catalogue.verdict_roles`): what the verdict reads.
    """

    name: str
    attention: str
    stats: dict[str, Estimate] = field(default_factory=dict)
    n_examples: int | None = None
    n_steps: int | None = None
    eps: float | None = None
    n_permutations: int | None = None
    shift: tuple[int, Estimate, Estimate] | None = None
    task_metrics: dict[str, Estimate] = field(default_factory=dict)
    steps_of: dict[str, int] = field(default_factory=dict)
    stat_steps: dict[str, int] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    roles: dict[str, VerdictRole] = field(default_factory=dict)

    def get(self, name: str, stat: str) -> Estimate | None:
        return self.stats.get(f"ablation/{name}/{stat}")


@dataclass
class Verdict:
    """The answers for one model: each question's category and its sentences.

    Attributes:
        used, unique, agrees, aligns: ``yes`` / ``no`` / ``unclear`` / ``n/a`` (not measured),
            and for ``agrees`` also ``weaker`` (attention agrees with some importance measure
            less than the measures agree with each other; ``unclear`` there when they hardly
            agree themselves); ``agrees`` is ``n/a`` without a yardstick (no pair of
            importance measures other than attention measured), even where its sentence names
            attention's τ with a measure; ``aligns`` has ``partly`` for its middle answer.
        sentences: the generated text, one sentence per question (in that order), plus notes.
        agrees_against: the pair of importance measures the agreement was read against where
            it was one pair (``gradient and leave-one-out``); empty for a median of several.
    """

    name: str
    used: str = "n/a"
    unique: str = "n/a"
    agrees: str = "n/a"
    aligns: str = "n/a"
    sentences: list[str] = field(default_factory=list)
    agrees_against: str = ""

    @property
    def text(self) -> str:
        return " ".join(self.sentences)

    @property
    def answers(self) -> dict[str, str]:
        """Each question of :data:`VERDICT_QUESTIONS` → its category, in that order."""
        return {q: getattr(self, q) for q in VERDICT_QUESTIONS}


def _lo(e: Estimate) -> float:
    return e.low if e.has_ci else e.value


def _hi(e: Estimate) -> float:
    return e.high if e.has_ci else e.value


def layer_name(index: int, layers: int | None = None) -> str:
    """A layer as a person reads it, 1-based (``index`` is the stored 0-based one): ``2``, or
    with ``layers`` ``2 of 2 (the last)``."""
    if layers is None:
        return str(index + 1)
    return f"{index + 1} of {layers}" + (" (the last)" if index + 1 == layers > 1 else "")


def _pct_against(x: float, threshold: float) -> str:
    """``x`` as a percentage with as many decimals as it takes to show its side of ``threshold``
    (0.0237 against 0.02: ``2.4 %``; 0.0999 against 0.1: ``9.99 %``, not ``10.0 %``)."""
    for digits in range(0, 7):
        shown = round(100 * x, digits)
        if (shown < 100 * threshold) == (x < threshold) and (shown == 100 * threshold) == (
            x == threshold
        ):
            break
    return f"{100 * x:.{digits}f} %"


def verdict(f: ModelFacts, t: VerdictThresholds | None = None) -> Verdict:
    """The generated verdict of one model from its measured numbers (see the module docstring).

    Args:
        f: the model's facts, with the catalogue's verdict roles (:attr:`ModelFacts.roles`).
        t: the thresholds (defaults: :class:`VerdictThresholds`).

    Returns:
        :class:`Verdict`; a model without attention gets one sentence saying there is nothing to test.

    Raises:
        ValueError: ``f`` has statistics but no verdict roles (every question would read
            "not measured").
    """
    t = t or VerdictThresholds()
    if f.stats and not f.roles:
        raise ValueError(
            "ModelFacts without verdict roles: pass roles=attnstudy.analysis.catalogue."
            "verdict_roles() (facts_from_metrics(roles=…))"
        )
    v = Verdict(f.name)
    if f.attention == "none":
        em = f.task_metrics.get("test/exact_match")
        v.sentences.append(
            "No attention: this model is the bottleneck baseline, with nothing to test"
            + (f"; its test exact match is {em.fmt()}" if em else "")
            + ", the measure of what attention adds to the task."
        )
        return v
    _decide("used", f, t, v)
    _decide("unique", f, t, v)
    _agrees(f, t, v)
    _decide("aligns", f, t, v)
    _faithful(f, v)
    _notes(f, t, v)
    return v


def _roles(f: ModelFacts, question: str, *kinds: str) -> list[tuple[str, VerdictRole]]:
    """``(key, role)`` of every statistic feeding ``question`` in one of ``kinds``, in the
    catalogue's order."""
    return [(k, r) for k, r in f.roles.items() if r.question == question and r.role in kinds]


def _ran(f: ModelFacts, key: str) -> bool:
    """Whether the ablation of ``ablation/<name>/<stat>`` ran for this model."""
    prefix = key.rsplit("/", 1)[0] + "/"
    return prefix.split("/")[1] in f.steps_of or any(k.startswith(prefix) for k in f.stats)


def _fill(template: str, f: ModelFacts, e: Estimate | None, **more: str) -> str:
    """A role's phrase or note with its placeholders (:class:`VerdictRole`)."""
    values: dict[str, str] = {
        "P": f"P = {f.n_permutations} " if f.n_permutations else "",
        "eps": f" ε = {f.eps:g}" if f.eps is not None else " ε",
    }
    if e is not None:
        values |= {
            "fmt": e.fmt(),
            "pct": e.pct(),
            "keep": Estimate(1 - e.value, 1 - e.high, 1 - e.low, e.n).pct(),
        }
    return template.format(**values, **more)


def _reading(e: Estimate, rule: Thresholds, direction: str, t: VerdictThresholds) -> str:
    """What one measure says: ``yes``, ``no`` or ``middle`` (:class:`Thresholds`)."""
    yes, no = rule.value("yes", t), rule.value("no", t)

    def below(x: float, threshold: float) -> bool:  # the upper bound against its threshold
        return x <= threshold if rule.at_most else x < threshold

    if direction == "higher":
        if _lo(e) >= yes:
            return "yes"
        return "no" if below(_hi(e), no) else "middle"
    if below(_hi(e), yes):
        return "yes"
    return "no" if _lo(e) >= no else "middle"


def _stated(role: VerdictRole, w: Wording, t: VerdictThresholds) -> str:
    """A measure's thresholds where its entry gives numbers (the report's thresholds table lists
    only those of ``[report.verdict]``): `` (yes: upper bound < 0.5; no: lower bound ≥ 0.9)``."""
    rule = role.rule
    if not isinstance(rule, Thresholds) or (isinstance(rule.yes, str) and isinstance(rule.no, str)):
        return ""
    below = "≤" if rule.at_most else "<"
    yes, no = ("lower bound ≥", f"upper bound {below}")
    if role.direction != "higher":
        yes, no = (f"upper bound {below}", "lower bound ≥")
    return (
        f" ('{w.names[0]}' where its {yes} {rule.value('yes', t):g}, '{w.names[1]}' where its "
        f"{no} {rule.value('no', t):g})"
    )


def _why(e: Estimate, rule: Thresholds, direction: str, t: VerdictThresholds, w: Wording) -> str:
    """Why a measure decides neither way, its bounds against the thresholds as percentages."""
    yes, no = rule.value("yes", t), rule.value("no", t)
    high, low = ("no", no), ("yes", yes)
    if direction != "higher":
        high, low = ("yes", yes), ("no", no)
    name = dict(zip(("yes", "no"), w.names))
    return (
        f"the upper bound {_pct_against(_hi(e), high[1])} is not below the "
        f"{_pct_against(high[1], high[1])} threshold for '{name[high[0]]}', the lower bound "
        f"{_pct_against(_lo(e), low[1])} is below the {_pct_against(low[1], low[1])} threshold "
        f"for '{name[low[0]]}'"
    )


def _decide(question: str, f: ModelFacts, t: VerdictThresholds, v: Verdict) -> None:
    """A question of :data:`WORDING`: its measures' :class:`Thresholds`, its sentence with the
    statistics beside them, then their notes (a :class:`Drop`'s last)."""
    w = WORDING[question]
    measures = _roles(f, question, "measure")
    present = [(k, r, f.stats[k]) for k, r in measures if k in f.stats]
    if not present:
        if w.missing is not None:
            names = list(dict.fromkeys(k.split("/")[1] for k, _ in measures)) or ["no ablation"]
            v.sentences.append(w.missing.format(ablations=" or ".join(names)))
        return
    readings = [_reading(e, r.rule, r.direction, t) for _, r, e in present]  # type: ignore[arg-type]
    declared = [k for k, _ in measures if _ran(f, k)]
    if "yes" in readings:
        answer = "yes"
    elif all(k in f.stats for k in declared) and all(x == "no" for x in readings):
        answer = "no"
    else:
        answer = "middle"
    setattr(v, question, w.middle_answer if answer == "middle" else answer)
    what = ", ".join(_fill(r.phrase, f, e) + _stated(r, w, t) for _, r, e in present)
    beside = [
        _fill(r.phrase, f, f.stats[k])
        for k, r in _roles(f, question, "beside")
        if k in f.stats and r.phrase and not isinstance(r.rule, Drop)
    ]
    if beside:
        what += w.beside[0] + w.beside[1].join(beside) + w.beside[2]
    steps = f.stat_steps.get(present[0][0])
    n = f" (n = {f.n_examples} examples, {steps} decoder steps)" if f.n_examples and steps else ""
    why = "; ".join(
        _why(e, r.rule, r.direction, t, w)  # type: ignore[arg-type]
        for (_, r, e), x in zip(present, readings)
        if x == "middle"
    )
    s = getattr(w, answer).format(n=n, what=what, why=why)
    if question == "used" and answer == "no" and f.attention == "uniform":
        s += " (The uniform baseline: its weights are fixed by construction, so nothing can depend on them.)"
    notes, drops = [], []
    for k, r in _roles(f, question, "beside"):
        if not r.note or k not in f.stats:
            continue
        if isinstance(r.rule, Drop):
            base = k.rsplit("/", 1)[0]
            original = f.stats.get(f"{base}/{r.rule.original}")
            changed = f.stats.get(f"{base}/{r.rule.changed}")
            if original is not None and changed is not None:
                drops.append(
                    _fill(r.note, f, f.stats[k], original=original.fmt(), changed=changed.fmt())
                )
        else:
            notes.append(_fill(r.note, f, f.stats[k]))
    if question == "aligns" and f.shift is not None:
        offset, moved, here = f.shift
        side = "after" if offset > 0 else "before"
        notes.append(
            f"Its attention sits {abs(offset)} source position{'s' if abs(offset) > 1 else ''} "
            f"{side} the gold links: gold mass {moved.fmt()} at offset {offset:+d} against "
            f"{here.fmt()} in place, a structured pattern AER does not credit (NMT attention need "
            f"not coincide with word alignment and can be shifted: {LITERATURE['kk']})."
        )
    v.sentences.append(" ".join([s, *notes, *drops]))


def _strength(e: Estimate, t: VerdictThresholds) -> str:
    return (
        "weakly"
        if e.value < t.tau_weak
        else ("strongly" if e.value >= t.tau_strong else "moderately")
    )


def _relation(name: str, e: Estimate, t: VerdictThresholds) -> str:
    """Attention's τ with a measure in words; the sign is read from the interval: below 0 is the
    opposite order, not weak agreement."""
    if _hi(e) < 0:
        return f"disagrees with {name} at τ = {e.fmt(2)} (ranks positions in opposite order)"
    if _lo(e) <= 0:
        return f"shows no evidence of agreement with {name} at τ = {e.fmt(2)} (contains 0)"
    return f"agrees with {name} at τ = {e.fmt(2)} ({_strength(e, t)})"


def _named(f: ModelFacts, kind: str, question: str = "agrees") -> dict[str, Estimate]:
    """Each measure (or pair) of ``kind`` once, by its first statistic measured."""
    out: dict[str, Estimate] = {}
    for k, r in _roles(f, question, kind):
        if k in f.stats:
            out.setdefault(r.measure, f.stats[k])
    return out


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def yardstick(pairs: dict[str, Estimate]) -> tuple[str, Estimate] | None:
    """The agreement question's yardstick: the median of the pairs' τ (for an even number of
    pairs the lower of the two middle ones, so that it is a measured pair with its own interval),
    as ``(pair, estimate)``; None without pairs."""
    if not pairs:
        return None
    ordered = sorted(pairs.items(), key=lambda kv: kv[1].value)
    return ordered[(len(ordered) - 1) // 2]


def _agrees(f: ModelFacts, t: VerdictThresholds, v: Verdict) -> None:
    measures = _named(f, "measure")
    pairs = _named(f, "yardstick")
    beside = _named(f, "beside")
    also = "; ".join(_relation(name, e, t) for name, e in beside.items() if name not in measures)
    if not measures:
        if not also:
            v.sentences.append("Agreement with other importance measures was not measured.")
            return
        names = list(dict.fromkeys(r.measure for _, r in _roles(f, "agrees", "measure")))
        v.sentences.append(
            f"Attention {also}; its agreement with an importance measure that does not read the "
            f"attention ({', '.join(names)}) was not measured."
        )
        return
    parts = [_relation(name, e, t) for name, e in measures.items()]
    s = "Attention " + _and(parts)
    y = yardstick(pairs)
    if y is None:
        ablations = list(
            dict.fromkeys(k.split("/")[1] for k, _ in _roles(f, "agrees", "yardstick"))
        )
        s += (
            "; no pair of importance measures other than attention was measured "
            f"({', '.join(ablations) or 'no ablation measures one'}), so the answer has no "
            "yardstick"
        )
    else:
        pair, gl = y
        v.agrees_against = pair if len(pairs) == 1 else ""
        if len(pairs) == 1:
            s += f", against τ = {gl.fmt(2)} between {pair} themselves"
            weak = f"{pair} hardly agree with each other (τ below {t.tau_weak:g})"
        else:
            s += (
                f", against τ = {gl.fmt(2)} between {pair}, the median of the {len(pairs)} pairs "
                "of importance measures other than attention"
            )
            weak = (
                "the importance measures other than attention hardly agree with each other "
                f"(median τ below {t.tau_weak:g})"
            )
        if any(_hi(e) < _lo(gl) for e in measures.values()):
            v.agrees = "weaker"
            s += ": it agrees with them less than they agree with each other"
        elif _hi(gl) < t.tau_weak and not all(e.value >= t.tau_weak for e in measures.values()):
            # two importance measures that hardly agree are no yardstick: "as well as they do"
            # was a "yes" for τ ≈ 0 against a baseline of τ ≈ 0
            v.agrees = "unclear"
            s += f": {weak}, so the comparison says little"
        else:
            v.agrees = "yes"
            s += ": about as well as they agree with each other, or better"
    s += "." + (f" Attention also {also}." if also else "")
    v.sentences.append(s)


def _faithful(f: ModelFacts, v: Verdict) -> None:
    """Which ranking is most faithful: the highest comprehensiveness AOPC among the rankings
    measured (``faithful`` rankings, :class:`VerdictRole`), "clearly" when its interval lies
    above the runner-up's; nothing when fewer than two were measured. Rankings compete within
    their criterion; each criterion after the first adds a sentence of its order and where it
    differs from the first's (:func:`~attnstudy.verdict.roles.criterion_sentence`)."""
    groups: dict[str, dict[str, tuple[Estimate, VerdictRole]]] = {}
    for k, r in _roles(f, "faithful", "ranking"):
        e = f.stats.get(k)
        found = groups.setdefault(r.criterion, {})  # the criteria in the catalogue's order
        if e is not None and math.isfinite(e.value):
            found.setdefault(r.measure, (e, r))
    if not groups:
        return
    first, *others = groups
    comp = groups[first]
    if len(comp) >= 2:
        ranked = sorted(comp.items(), key=lambda kv: -kv[1][0].value)
        (best, (e, _)), (second, (e2, _)) = ranked[0], ranked[1]
        what = (
            f"deleting the source tokens {best} ranks first lowers p(y_t) by {e.fmt()} "
            f"(comprehensiveness AOPC), against {e2.fmt()} for {second}"
        )
        for _, (e3, r) in ranked[2:]:
            if r.phrase:
                what += " and " + _fill(r.phrase, f, e3)
        if e.has_ci and e2.has_ci and e.low > e2.high:
            v.sentences.append(f"The most faithful ranking is {best}: {what}.")
        else:
            v.sentences.append(
                f"No ranking is clearly the most faithful: {what}, and the intervals overlap."
            )
    referenced = {r.versus for g in groups.values() for _, r in g.values() if r.versus}
    for criterion in others:
        group = groups[criterion]
        if len(group) < 2 or (criterion in referenced and criterion != first):
            continue  # a reference only (deletion's sufficiency): no sentence of its own
        versus = next(iter(group.values()))[1].versus or first
        ref = groups.get(versus, {})
        values = {m: e for m, (e, _) in group.items()}
        refs = {m: e for m, (e, _) in ref.items()}
        lower = next(iter(group.values()))[1].direction == "lower"
        ref_lower = bool(ref) and next(iter(ref.values()))[1].direction == "lower"
        v.sentences.append(
            criterion_sentence(criterion, values, versus, refs, lower=lower, first_lower=ref_lower)
        )


def _notes(f: ModelFacts, t: VerdictThresholds, v: Verdict) -> None:
    """The sentences of their own (``note`` roles), in the catalogue's order."""
    for k, r in f.roles.items():
        if r.role == "note" and k in f.stats:
            e = f.stats[k]
            v.sentences.append(_fill(r.note, f, e, relation=_relation(r.measure, e, t)))


def overall(
    verdicts: list[Verdict], facts: list[ModelFacts], configs: list[str] | None = None
) -> str:
    """One paragraph over every model with attention: how many are used, unique, agreeing and
    aligned, and what that says about the report's question.

    Args:
        verdicts, facts: one per model (each seed of a configuration is a model).
        configs: each model's configuration (its name without the seed, in the same order); where
            a configuration has more than one seed, the first sentence counts the configurations
            beside the models and a closing sentence says whether its seeds get the same answers
            (:func:`across_seeds`).

    Raises:
        ValueError: ``configs`` is not one per model.
    """
    if configs is not None and len(configs) != len(facts):
        raise ValueError(f"{len(facts)} models but {len(configs)} configurations")
    keep = [i for i, f in enumerate(facts) if f.attention != "none"]
    tested = [(verdicts[i], facts[i]) for i in keep]
    if not tested:
        return "No model of this study has attention: there is nothing to test."
    n = len(tested)

    def count(attr: str, value: str) -> int:
        return sum(getattr(v, attr) == value for v, _ in tested)

    used = [v.name for v, _ in tested if v.used == "yes"]
    not_unique = [v.name for v, _ in tested if v.unique == "no"]
    gold = [v for v, _ in tested if v.aligns != "n/a"]
    tested_configs = None if configs is None else [configs[i] for i in keep]
    scope = _scope(n, tested_configs)
    if used:
        how = _question_summary(tested, "used", used)
        parts = [
            f"Of the {scope}, {len(used)} use{'s' if len(used) == 1 else ''} it"
            + (f": {how}" if how else "")
        ]
    else:
        parts = [f"Of the {scope}, none is shown to use it"]
    if count("used", "no"):
        k = count("used", "no")
        parts.append(f"{k} do{'es' if k == 1 else ''} not use it")
    measured_u = [v for v, _ in tested if v.unique != "n/a"]
    not_unique_all = len(not_unique) == len(measured_u)
    if measured_u:
        how = _question_summary(tested, "unique", not_unique)
        parts.append(
            f"it is not a unique explanation for {len(not_unique)} of {len(measured_u)}"
            + (f" ({how})" if how else "")
            if not_unique
            else f"it is close to unique for {count('unique', 'yes')} of {len(measured_u)}"
        )
    measured_a = [v for v, _ in tested if v.agrees != "n/a"]
    if measured_a:
        against = {v.agrees_against for v in measured_a}
        pair = against.pop() if len(against) == 1 else ""
        whom = f"{pair} importance" if pair else "the importance measures"
        parts.append(
            f"it agrees with {whom} as well as they agree with each other for "
            f"{count('agrees', 'yes')} of {len(measured_a)}"
        )
    if gold:
        parts.append(
            f"and it aligns with gold links for {count('aligns', 'yes')} of the {len(gold)} with "
            "gold alignments"
        )
    text = "; ".join(parts) + "." + _answer(bool(used), bool(measured_u) and not_unique_all)
    if tested_configs is not None:
        text += across_seeds([v for v, _ in tested], tested_configs)
    return text


def _question_summary(tested: list, question: str, names: list[str]) -> str:
    """The summary sentence part of the first measure of ``question`` that the models ``names``
    (of ``tested``: (verdict, facts) pairs) measured, with their span in %; "" if none did."""
    roles = {k: r for _, f in tested for k, r in f.roles.items()}
    for k, r in roles.items():
        if r.question != question or r.role != "measure" or not r.summary:
            continue
        vals = [f.stats[k] for v, f in tested if v.name in names and k in f.stats]
        if vals:
            lo, hi = min(e.value for e in vals), max(e.value for e in vals)
            span = f" {100 * lo:.0f}–{100 * hi:.0f} %" if lo != hi else f" {100 * lo:.0f} %"
            return r.summary.format(span=span)
    return ""


def _scope(n: int, configs: list[str] | None) -> str:
    """ "N models with attention", with the configurations and their seeds where a configuration
    of ``configs`` (one per model) has more than one seed (each seed is a model)."""
    scope = f"{n} model{'s' if n > 1 else ''} with attention"
    seeds = collections.Counter(configs or [])
    if seeds and max(seeds.values()) > 1:
        lo, hi = min(seeds.values()), max(seeds.values())
        each = f"{lo} seeds each" if lo == hi else f"{lo}–{hi} seeds each"
        k = len(seeds)
        scope += f" ({k} configuration{'s' if k > 1 else ''}, {each})"
    return scope


def _answer(used: bool, none_unique: bool) -> str:
    """The overall paragraph's closing sentence: the answer to the report's question."""
    if used and none_unique:
        return (
            " So the answer to this report's question is: the attention is causally used, but it "
            "is not the one explanation — other, very different weights would explain the same "
            "outputs — and its value as an explanation rests on its agreement with other "
            "importance measures and with alignments, reported per model below."
        )
    if used:
        return (
            " Attention is used; whether it explains the output depends on the model, as the "
            "per-model findings say."
        )
    return " Without a causal effect, attention cannot explain these models' outputs."


def across_seeds(verdicts: list[Verdict], configs: list[str]) -> str:
    """A sentence on whether the seeds of each configuration get the same answers to the four
    questions — the seed variance of the verdicts themselves (Wiegreffe & Pinter 2019, §3.2 ask
    it of the attention); empty when no configuration has more than one seed.

    Args:
        verdicts: one per model; configs: each one's configuration, in the same order.

    Raises:
        ValueError: ``verdicts`` and ``configs`` differ in length.
    """
    if len(verdicts) != len(configs):
        raise ValueError(f"{len(verdicts)} verdicts but {len(configs)} configurations")
    by_config: dict[str, list[Verdict]] = {}
    for v, c in zip(verdicts, configs):
        by_config.setdefault(c, []).append(v)
    seeded = {c: vs for c, vs in by_config.items() if len(vs) > 1}
    if not seeded:
        return ""
    differ = {
        c: [q for q in VERDICT_QUESTIONS if len({v.answers[q] for v in vs}) > 1]
        for c, vs in seeded.items()
    }
    same = [c for c, qs in differ.items() if not qs]
    n = len(seeded)
    text = (
        f" Across seeds: of the {n} configuration{'s' if n > 1 else ''} trained with more than "
        f"one seed, "
    )
    if len(same) == n:
        return text + f"every seed gets the same answers for {'all' if n > 1 else 'it'}."
    parts = [
        f"{c}'s seeds differ on "
        + " and ".join(
            f"whether it {QUESTION_VERB[q]} ({', '.join(v.answers[q] for v in seeded[c])})"
            for q in qs
        )
        for c, qs in differ.items()
        if qs
    ]
    return (
        text
        + f"every seed gets the same answers for {len(same)}; "
        + "; ".join(parts)
        + " — a single seed's verdict there is not the configuration's."
    )


QUESTION_VERB = {
    "used": "is used",
    "unique": "is close to unique",
    "agrees": "agrees with importance",
    "aligns": "aligns",
}
"""How :func:`across_seeds` names each of :data:`VERDICT_QUESTIONS`."""


def facts_from_metrics(
    name: str,
    attention: str,
    metrics: dict,
    *,
    stat_keys: list[str],
    params: dict | None = None,
    task_metrics: dict | None = None,
    task_keys: list[str] = (),
    labels: dict[str, str] | None = None,
    roles: dict[str, VerdictRole] | None = None,
) -> ModelFacts:
    """:class:`ModelFacts` from an ablation run's metrics and params (and the model run's).

    Args:
        name, attention: the model's name and attention score.
        metrics: the ablation run's metrics (``ablation/<name>/<stat>`` with ``_ci_low`` /
            ``_ci_high``).
        stat_keys: the statistics to read (the catalogue's,
            :func:`attnstudy.analysis.catalogue.stat_keys`).
        params: the ablation run's params.
        task_metrics: the model run's metrics; task_keys: the task metrics to read from them
            (the task registry's, :func:`attnstudy.data.tasks.task_metrics`).
        labels: metric key → the statistic's label (:func:`attnstudy.analysis.catalogue.
            stat_labels`), kept as :attr:`ModelFacts.labels`.
        roles: metric key → the statistic's verdict role (:func:`attnstudy.analysis.catalogue.
            verdict_roles`), kept as :attr:`ModelFacts.roles`: what :func:`verdict` reads.
    """
    params = params or {}
    stats = {k: e for k in stat_keys if (e := estimate(metrics, k)) is not None}
    n_steps = next(
        (int(metrics[k]) for k in sorted(metrics) if k.endswith("/n_steps") and metrics[k]), None
    )
    n_examples = metrics.get("ablation/n_examples") or metrics.get(
        "ablation/permutation_global/n_examples"
    )

    def num(key, cast):
        try:
            return cast(params[key])
        except (KeyError, TypeError, ValueError):
            return None

    return ModelFacts(
        name=name,
        attention=attention,
        stats=stats,
        n_examples=int(n_examples) if n_examples else num("ablation.n_examples", int),
        n_steps=n_steps,
        steps_of={
            k.split("/")[1]: int(v)
            for k, v in metrics.items()
            if k.startswith("ablation/") and k.count("/") == 2 and k.endswith("/n_steps") and v
        },
        stat_steps={k: c for k in stats if (c := steps_computed_on(metrics, k)) is not None},
        eps=num("ablation.adversarial.eps_eval", float),
        n_permutations=num("ablation.permutation.n", int),
        task_metrics={
            k: e for k in task_keys if (e := estimate(task_metrics or {}, k)) is not None
        },
        labels=dict(labels or {}),
        roles=dict(roles or {}),
    )
