"""The report's findings: a short verdict per model, built only from the measured numbers with
their 95 % intervals and n, one overall paragraph, and the literature's findings cited once per
report (:data:`LITERATURE_CONTEXT`), not in every model's verdict.

Four questions, each answered by a rule on interval bounds whose thresholds are stated in the
report and configurable (``[report.verdict]`` of the experiment file, or ``attnstudy report
--verdict KEY=VALUE``):

* **used?** — does the output depend on the attention weights? Permutation flip rate (the
  share of random permutations of α_t that change the predicted token, averaged over steps),
  with uniform and erase-max flip rates and the global-permutation exact-match drop beside it;
* **unique?** — is there another attention distribution, far from α_t, with nearly the same
  output? Adversarial share of steps with an alternative within ε_eval (TVD) and its JSD;
* **agrees?** — does attention rank source tokens as gradient and leave-one-out importance do?
  Kendall τ attn–grad and attn–LOO, set against τ grad–LOO (how well the two non-attention
  measures agree with each other; unclear while that baseline is itself weak); the sentence
  also names attention's τ with any other measure measured (saliency, input × gradient,
  integrated gradients, occlusion, contrastive gradient, norm, rollout), which the answer does
  not read;
* **aligns?** — is the attention argmax a word alignment? AER and attention mass on gold links.

Where the opt-in ``faithfulness`` ablation ran, one more sentence names the ranking whose deletion
lowers p(y_t) most (comprehensiveness AOPC, DeYoung et al. 2020) with its interval, and whether
that interval is clear of the runner-up's (:func:`_faithful`; the rankings are those measured).

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

from .config import _Strict

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
            catalogue's :attr:`~attnstudy.analysis.catalogue.Stat.label`), for the sentences that
            name a statistic; a key without one is named by its statistic.
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

    def get(self, name: str, stat: str) -> Estimate | None:
        return self.stats.get(f"ablation/{name}/{stat}")


@dataclass
class Verdict:
    """The answers for one model: each question's category and its sentences.

    Attributes:
        used, unique, agrees, aligns: ``yes`` / ``no`` / ``unclear`` / ``n/a`` (not measured),
            and for ``agrees`` also ``weaker`` (less than gradient and LOO agree with each other;
            ``unclear`` there when those two hardly agree themselves); ``agrees`` is ``n/a``
            without the importance ablation even where its sentence names attention's τ with
            another measure (:data:`OTHER_ATTENTION_TAUS`).
        sentences: the generated text, one sentence per question (in that order), plus notes.
    """

    name: str
    used: str = "n/a"
    unique: str = "n/a"
    agrees: str = "n/a"
    aligns: str = "n/a"
    sentences: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return " ".join(self.sentences)

    @property
    def answers(self) -> dict[str, str]:
        """Each question of :data:`VERDICT_QUESTIONS` → its category, in that order."""
        return {q: getattr(self, q) for q in VERDICT_QUESTIONS}


VERDICT_QUESTIONS = ("used", "unique", "agrees", "aligns")
"""The four questions a :class:`Verdict` answers, in the report's order."""


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
        f: the model's facts.
        t: the thresholds (defaults: :class:`VerdictThresholds`).

    Returns:
        :class:`Verdict`; a model without attention gets one sentence saying there is nothing to test.
    """
    t = t or VerdictThresholds()
    v = Verdict(f.name)
    steps = f.stat_steps.get("ablation/permutation/flip_rate")  # the "used" sentence's statistic
    n = f" (n = {f.n_examples} examples, {steps} decoder steps)" if f.n_examples and steps else ""
    if f.attention == "none":
        em = f.task_metrics.get("test/exact_match")
        v.sentences.append(
            "No attention: this model is the bottleneck baseline, with nothing to test"
            + (f"; its test exact match is {em.fmt()}" if em else "")
            + ", the measure of what attention adds to the task."
        )
        return v
    _used(f, t, v, n)
    _unique(f, t, v)
    _agrees(f, t, v)
    _aligns(f, t, v)
    _faithful(f, v)
    return v


def _used(f: ModelFacts, t: VerdictThresholds, v: Verdict, n: str) -> None:
    perm = f.get("permutation", "flip_rate")
    if perm is None:
        v.sentences.append("Whether attention is used was not measured (permutation not run).")
        return
    p = f"P = {f.n_permutations} " if f.n_permutations else ""
    what = (
        f"of {p}random permutations of the attention row, {perm.pct()} change the predicted "
        "token (mean over decoder steps)"
    )
    extra = []
    uni = f.get("uniform", "flip_rate")
    if uni is not None:
        extra.append(f"uniform attention at {uni.pct()}")
    em = f.get("erase_max", "flip_rate")
    if em is not None:
        extra.append(f"erasing the largest weight at {em.pct()}")
    extra_text = f" ({'; '.join(extra)})" if extra else ""
    glob = f.get("permutation_global", "exact_match_drop")
    orig = f.get("permutation_global", "exact_match_original")
    perm_em = f.get("permutation_global", "exact_match_permuted")
    if _lo(perm) >= t.used_flip:
        v.used = "yes"
        s = f"Attention is used{n}: {what}{extra_text}; this model depends on its attention weights."
    elif _hi(perm) < t.unused_flip:
        v.used = "no"
        s = f"Attention is not used{n}: {what}{extra_text}."
        if f.attention == "uniform":
            s += " (The uniform baseline: its weights are fixed by construction, so nothing can depend on them.)"
    else:
        v.used = "unclear"
        # the rules read the interval's bounds, not the rounded value beside them
        s = (
            f"Attention is used weakly, if at all{n}: {what}{extra_text}; neither rule decides: "
            f"the upper bound {_pct_against(_hi(perm), t.unused_flip)} is not below the "
            f"{_pct_against(t.unused_flip, t.unused_flip)} threshold for 'not used', the lower "
            f"bound {_pct_against(_lo(perm), t.used_flip)} is below the "
            f"{_pct_against(t.used_flip, t.used_flip)} threshold for 'used'."
        )
    if uni is not None:
        keep = Estimate(1 - uni.value, 1 - uni.high, 1 - uni.low, uni.n)
        s += f" Under uniform attention the token stays the same at {keep.pct()} of steps."
    if glob is not None and orig is not None and perm_em is not None:
        s += (
            f" Permuting attention at every step of free-running decoding lowers exact match from "
            f"{orig.fmt()} to {perm_em.fmt()} (drop {glob.fmt()})."
        )
    v.sentences.append(s)


def _unique(f: ModelFacts, t: VerdictThresholds, v: Verdict) -> None:
    found = f.get("adversarial", "found_rate")
    jsd = f.get("adversarial", "max_jsd")
    if found is None:
        v.sentences.append("Uniqueness was not measured (adversarial attention not run).")
        return
    eps = f" ε = {f.eps:g}" if f.eps is not None else " ε"
    jsd_text = (
        f", on average {jsd.fmt()} nats JSD from the model's own (at most ln 2 ≈ 0.693)"
        if jsd is not None
        else ""
    )
    what = (
        f"for {found.pct()} of decoder steps an attention distribution keeps the output within"
        f"{eps} (TVD){jsd_text}"
    )
    if jsd is not None and _lo(found) >= t.unique_found and _lo(jsd) >= t.unique_jsd:
        v.unique = "no"
        s = f"It is not a unique explanation: {what}."
    elif _hi(found) < t.unique_found or (jsd is not None and _hi(jsd) < t.unique_jsd):
        v.unique = "yes"
        s = f"It is close to unique: {what}; few distant alternatives give the same output."
    else:
        v.unique = "unclear"
        s = f"Whether it is unique is unclear: {what}."
    v.sentences.append(s)


OTHER_ATTENTION_TAUS = (
    "ablation/saliency/tau_attn",
    "ablation/input_x_gradient/tau_attn",
    "ablation/integrated_gradients/tau_attn",
    "ablation/occlusion/tau_attn",
    "ablation/contrastive/tau_attn",
    "ablation/norm/tau_attn_norm",
    "ablation/rollout/tau_attn_rollout",
    "ablation/norm/tau_attn_loo",
    "ablation/rollout/tau_attn_loo",
)
"""Attention's Kendall τ against an importance measure, measured by an ablation other than
``importance`` (``norm`` and ``rollout`` also rank by leave-one-out): the agreement sentence names
each one measured, while the ``agrees`` answer reads the ``importance`` ablation alone (``n/a``
without it)."""
_ATTENTION_TAU_LABEL = "τ attention–"


def _measure_name(f: ModelFacts, key: str) -> str:
    """The measure of an :data:`OTHER_ATTENTION_TAUS` key as its label names it
    (``τ attention–integrated gradients``: ``integrated gradients``); ``leave-one-out`` for an
    unlabelled ``tau_attn_loo``; else its ablation (``integrated gradients``)."""
    label = f.labels.get(key, "")
    if label.startswith(_ATTENTION_TAU_LABEL):
        return label.removeprefix(_ATTENTION_TAU_LABEL)
    if key.endswith("/tau_attn_loo"):
        return "leave-one-out"
    return key.split("/")[1].replace("_", " ")


def _agrees(f: ModelFacts, t: VerdictThresholds, v: Verdict) -> None:
    ag = f.get("importance", "tau_attn_grad")
    al = f.get("importance", "tau_attn_loo")
    gl = f.get("importance", "tau_grad_loo")
    # each other measure once, by the first key measuring it (norm's and rollout's
    # leave-one-out is importance's when that ran)
    others: dict[str, Estimate] = {"leave-one-out": al} if al is not None else {}
    for key in OTHER_ATTENTION_TAUS:
        if (e := f.stats.get(key)) is not None:
            others.setdefault(_measure_name(f, key), e)
    if al is not None:
        del others["leave-one-out"]

    def strength(e: Estimate) -> str:
        return (
            "weakly"
            if e.value < t.tau_weak
            else ("strongly" if e.value >= t.tau_strong else "moderately")
        )

    def relation(name: str, e: Estimate) -> str:
        # the sign is read from the interval: below 0 is the opposite order, not weak agreement
        if _hi(e) < 0:
            return f"disagrees with {name} at τ = {e.fmt(2)} (ranks positions in opposite order)"
        if _lo(e) <= 0:
            return f"shows no evidence of agreement with {name} at τ = {e.fmt(2)} (contains 0)"
        return f"agrees with {name} at τ = {e.fmt(2)} ({strength(e)})"

    other_text = "; ".join(relation(name, e) for name, e in others.items())
    if ag is None and al is None:
        if not others:
            v.sentences.append("Agreement with other importance measures was not measured.")
            return
        # a τ measured is said, never "not measured" below it; the answer stays n/a: its rule
        # reads attention's τ with gradient × input and leave-one-out against theirs with each
        # other, which the importance ablation measures
        v.sentences.append(
            f"Attention {other_text}; the answer on agreement reads attention's τ with "
            "gradient × input and leave-one-out against theirs with each other (the importance "
            "ablation), which was not measured."
        )
        return

    parts = [
        relation(name, e)
        for name, e in (("gradient × input", ag), ("leave-one-out", al))
        if e is not None
    ]
    s = "Attention " + " and ".join(parts)
    if gl is not None:
        below = [e for e in (ag, al) if e is not None and _hi(e) < _lo(gl)]
        s += f", against τ = {gl.fmt(2)} between gradient and leave-one-out themselves"
        if below:
            v.agrees = "weaker"
            s += ": it agrees with them less than they agree with each other"
        elif _hi(gl) < t.tau_weak and not all(e.value >= t.tau_weak for e in (ag, al) if e):
            # two importance measures that hardly agree are no yardstick: "as well as they do"
            # was a "yes" for τ ≈ 0 against a baseline of τ ≈ 0
            v.agrees = "unclear"
            s += (
                f": gradient and leave-one-out hardly agree with each other (τ below "
                f"{t.tau_weak:g}), so the comparison says little"
            )
        else:
            v.agrees = "yes"
            s += ": about as well as they agree with each other, or better"
    else:
        v.agrees = "yes" if all(e.value >= t.tau_weak for e in (ag, al) if e) else "weaker"
    s += "." + (f" Attention also {other_text}." if others else "")
    v.sentences.append(s)


def _aligns(f: ModelFacts, t: VerdictThresholds, v: Verdict) -> None:
    aer = f.get("alignment", "aer")
    gold = f.get("alignment", "gold_mass")
    if aer is None:
        return  # no gold links: nothing to say (the table says why)
    mass = f" and puts {gold.pct()} of its mass on gold links" if gold is not None else ""
    what = f"its argmax has AER {aer.fmt()}{mass}"
    if _hi(aer) <= t.align_aer:
        v.aligns = "yes"
        s = f"It aligns with the gold alignment: {what}."
    elif _lo(aer) >= t.no_align_aer:
        v.aligns = "no"
        s = f"It does not align with the gold alignment: {what}."
    else:
        v.aligns = "partly"
        s = f"It aligns partly: {what}."
    if f.shift is not None:
        offset, moved, here = f.shift
        side = "after" if offset > 0 else "before"
        s += (
            f" Its attention sits {abs(offset)} source position{'s' if abs(offset) > 1 else ''} "
            f"{side} the gold links: gold mass {moved.fmt()} at offset {offset:+d} against "
            f"{here.fmt()} in place, a structured pattern AER does not credit (NMT attention need "
            f"not coincide with word alignment and can be shifted: {LITERATURE['kk']})."
        )
    v.sentences.append(s)


FAITHFULNESS_KEY = "ablation/faithfulness/comprehensiveness_"
"""The comprehensiveness statistics' key prefix; the ranking follows it (``…_attention``); the
``…_top1_<ranking>`` statistics (k = 1) are not AOPCs and are left out."""
FAITHFULNESS_LABEL = "comprehensiveness, "
"""The comprehensiveness statistics' label prefix; the ranking's label follows it."""


def _faithful(f: ModelFacts, v: Verdict) -> None:
    """Which ranking is most faithful: the highest comprehensiveness AOPC among the rankings
    measured, "clearly" when its interval lies above the runner-up's; nothing when not measured.
    Each ranking is named by its label (:attr:`ModelFacts.labels`)."""
    comp = {
        f.labels.get(key, key.removeprefix(FAITHFULNESS_KEY)).removeprefix(FAITHFULNESS_LABEL): e
        for key, e in f.stats.items()
        if key.startswith(FAITHFULNESS_KEY)
        and not key.removeprefix(FAITHFULNESS_KEY).startswith("top1_")
        and math.isfinite(e.value)
    }
    if len(comp) < 2:
        return
    ranked = sorted(comp.items(), key=lambda kv: -kv[1].value)
    (best, e), (second, e2) = ranked[0], ranked[1]
    what = (
        f"deleting the source tokens {best} ranks first lowers p(y_t) by {e.fmt()} "
        f"(comprehensiveness AOPC), against {e2.fmt()} for {second}"
    )
    random = comp.get("random")
    if random is not None and best != "random" and second != "random":
        what += f" and {random.fmt()} for random orders"
    if e.has_ci and e2.has_ci and e.low > e2.high:
        v.sentences.append(f"The most faithful ranking is {best}: {what}.")
    else:
        v.sentences.append(
            f"No ranking is clearly the most faithful: {what}, and the intervals overlap."
        )


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

    def span(stat: tuple[str, str], names: list[str]) -> str:
        vals = [f.get(*stat) for v, f in tested if v.name in names and f.get(*stat) is not None]
        if not vals:
            return ""
        lo, hi = min(e.value for e in vals), max(e.value for e in vals)
        return f" {100 * lo:.0f}–{100 * hi:.0f} %" if lo != hi else f" {100 * lo:.0f} %"

    used = [v.name for v, _ in tested if v.used == "yes"]
    not_unique = [v.name for v, _ in tested if v.unique == "no"]
    gold = [v for v, _ in tested if v.aligns != "n/a"]
    scope = f"{n} model{'s' if n > 1 else ''} with attention"
    tested_configs = None
    if configs is not None:
        tested_configs = [configs[i] for i in keep]
        seeds = collections.Counter(tested_configs)
        if max(seeds.values()) > 1:  # each seed is a model: say so where it matters
            lo, hi = min(seeds.values()), max(seeds.values())
            each = f"{lo} seeds each" if lo == hi else f"{lo}–{hi} seeds each"
            k = len(seeds)
            scope += f" ({k} configuration{'s' if k > 1 else ''}, {each})"
    if used:
        parts = [
            f"Of the {scope}, {len(used)} use{'s' if len(used) == 1 else ''} it: "
            f"random permutations change the predicted token at"
            f"{span(('permutation', 'flip_rate'), used)} of their decoder steps (mean share of "
            "permutations)"
        ]
    else:
        parts = [f"Of the {scope}, none is shown to use it"]
    if count("used", "no"):
        k = count("used", "no")
        parts.append(f"{k} do{'es' if k == 1 else ''} not use it")
    measured_u = [v for v, _ in tested if v.unique != "n/a"]
    if measured_u:
        parts.append(
            f"it is not a unique explanation for {len(not_unique)} of {len(measured_u)} "
            f"(an attention far from the model's gives the same output at"
            f"{span(('adversarial', 'found_rate'), not_unique) or ' most'} of steps)"
            if not_unique
            else f"it is close to unique for {count('unique', 'yes')} of {len(measured_u)}"
        )
    measured_a = [v for v, _ in tested if v.agrees != "n/a"]
    if measured_a:
        parts.append(
            f"it agrees with gradient and leave-one-out importance as well as they agree with each "
            f"other for {count('agrees', 'yes')} of {len(measured_a)}"
        )
    if gold:
        parts.append(
            f"and it aligns with gold links for {count('aligns', 'yes')} of the {len(gold)} with "
            "gold alignments"
        )
    text = "; ".join(parts) + "."
    if used and len(not_unique) == len(measured_u) and measured_u:
        text += (
            " So the answer to this report's question is: the attention is causally used, but it "
            "is not the one explanation — other, very different weights would explain the same "
            "outputs — and its value as an explanation rests on its agreement with other "
            "importance measures and with alignments, reported per model below."
        )
    elif used:
        text += (
            " Attention is used; whether it explains the output depends on the model, as the "
            "per-model findings say."
        )
    else:
        text += " Without a causal effect, attention cannot explain these models' outputs."
    if tested_configs is not None:
        text += across_seeds([v for v, _ in tested], tested_configs)
    return text


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
    )
