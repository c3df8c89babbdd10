"""The verdict's questions and what a statistic is to them: :class:`VerdictRole`, declared by the
statistic's entry in the ablation catalogue (``Stat(verdict=…)``), with the rules it takes
(:class:`Thresholds`, :class:`Drop`), and the sentences of the questions the thresholds decide
(:data:`WORDING`). :mod:`attnstudy.verdict.findings` reads the roles and holds the rules' code; this
module holds the declarations, so the catalogue's spec headers can use them.

This module imports only the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VERDICT_QUESTIONS = ("used", "unique", "agrees", "aligns")
"""The four questions a verdict answers, in the report's order."""
THRESHOLD_QUESTIONS = ("used", "unique", "aligns")
"""The questions decided by their measures' :class:`Thresholds`."""


@dataclass(frozen=True)
class Thresholds:
    """The rule of a ``measure`` of the used, unique and aligns questions: the statistic's 95 %
    interval against two thresholds.

    Direction ``higher`` (higher values answer yes): yes where the lower bound is at least
    ``yes``, no where the upper bound is below ``no``. Direction ``lower``: yes where the upper
    bound is below ``yes``, no where the lower bound is at least ``no``. Otherwise the question's
    middle answer (``unclear``, ``partly``). The statistic's value without an interval is read as
    both bounds.

    Attributes:
        yes, no: a field of :class:`~attnstudy.verdict.findings.VerdictThresholds` (configurable in
        ``[report.verdict]`` and
            printed in the report) or a number (a fixed threshold of the entry).
        at_most: the upper bound passes its threshold when at most it (≤), not only below (<).
    """

    yes: str | float
    no: str | float
    at_most: bool = False

    def value(self, which: str, t: Any) -> float:
        """The threshold ``which`` (``"yes"`` or ``"no"``) under the thresholds ``t``."""
        x = getattr(self, which)
        return float(getattr(t, x)) if isinstance(x, str) else float(x)


@dataclass(frozen=True)
class Drop:
    """The rule of a ``beside`` statistic that is the change between two others of its ablation
    (the global permutation's exact-match drop): its role's ``note`` is said only where all three
    were measured, with ``{original}`` and ``{changed}`` their values.

    Attributes:
        original, changed: the names of the two statistics in the same ablation's ``stats``.
    """

    original: str
    changed: str


ROLE_KINDS = ("measure", "yardstick", "beside", "ranking", "note")
"""What a statistic can be to a verdict question (:class:`VerdictRole`)."""


@dataclass(frozen=True)
class VerdictRole:
    """How a statistic feeds the verdict: declared by the statistic's catalogue entry
    (:attr:`attnstudy.analysis.catalogue.Stat.verdict`), read by
    :func:`attnstudy.verdict.findings.verdict` and
    :func:`~attnstudy.verdict.findings.overall`; nothing in this module names an ablation.

    The questions and what each role does there:

    * ``used``, ``unique``, ``aligns`` — a ``measure`` (with its :class:`Thresholds`) decides:
      yes where any measure says yes, no where every measure of the ablations that ran says no,
      else the middle answer. Its ``phrase`` says the number in the question's sentence (the
      measures' phrases joined by commas). A ``beside`` statistic is named in the sentence by its
      ``phrase`` and may add a sentence of its own (``note``; with :class:`Drop`, the change
      between two statistics); the rule does not read it.
    * ``agrees`` — attention's Kendall τ with an importance measure (``measure``, named by
      ``measure``; the first statistic of a measure counts), read against the **yardstick**: the
      median τ between pairs of importance measures that do not read attention (``yardstick``,
      ``measure`` naming the pair: ``"gradient and leave-one-out"``). A ``beside`` τ (attention
      against a measure built from attention itself: norm, rollout) is named, not read.
    * ``faithful`` — each ``ranking`` (named by ``measure``) competes; the highest is the most
      faithful, clearly so where its interval lies above the runner-up's; a ranking with a
      ``phrase`` (random orders) is named beside the two best. Rankings compete within their
      ``criterion`` (hard deletion, soft erasure…): the first criterion declared gives that
      sentence, and each other one a sentence of the order it puts the rankings in and where it
      differs from the first's, or from the criterion it names in ``versus`` (soft sufficiency
      against deletion's sufficiency); a criterion only named by another's ``versus`` gives no
      sentence of its own. The statistic's ``direction`` says which values are more faithful
      (hard sufficiency: lower).
    * any other key — a ``note``: a sentence of its own after the four questions.

    Phrases and notes are :meth:`str.format` templates: ``{fmt}`` (``value [low, high]``),
    ``{pct}`` (as percentages), ``{keep}`` (1 − value, as percentages), ``{relation}`` (for a τ:
    "agrees with <measure> at τ = …"), ``{P}`` (``P = <permutations> `` or nothing), ``{eps}``
    (`` ε = <ε_eval>`` or `` ε``), and for a :class:`Drop` ``{original}`` and ``{changed}``.

    Attributes:
        question: one of :data:`VERDICT_QUESTIONS`, ``faithful``, or a key of its own (a note).
        role: one of :data:`ROLE_KINDS`.
        rule: :class:`Thresholds` (a measure of used, unique, aligns) or :class:`Drop`.
        phrase: how the question's sentence says the number.
        note: a sentence of its own (``beside`` and ``note`` roles).
        measure: the importance measure (``agrees``), the pair (``yardstick``), the ranking
            (``faithful``).
        summary: how the overall paragraph says the measure over the models that get the
            answer, ``{span}`` the range of their values as percentages (``used`` and ``unique``
            measures).
        criterion: what a ``faithful`` ranking's number measures faithfulness by (``"deletion"``,
            ``"soft erasure"``); its rankings are compared with each other, not with another
            criterion's.
        versus: the criterion whose order of the rankings this one's is compared with (empty:
            the first criterion declared).
        direction: which values answer yes (the statistic's
            :attr:`~attnstudy.analysis.catalogue.Stat.direction`, filled in by the catalogue).
    """

    question: str
    role: str = "measure"
    rule: Thresholds | Drop | None = None
    phrase: str = ""
    note: str = ""
    measure: str = ""
    summary: str = ""
    direction: str = ""
    criterion: str = ""
    versus: str = ""

    def __post_init__(self) -> None:
        q, r = self.question, self.role
        if r not in ROLE_KINDS:
            raise ValueError(f"verdict role {r!r}: one of {', '.join(ROLE_KINDS)}")
        if q in THRESHOLD_QUESTIONS:
            allowed = ("measure", "beside")
        elif q == "agrees":
            allowed = ("measure", "yardstick", "beside")
        elif q == "faithful":
            allowed = ("ranking",)
        else:
            allowed = ("note",)
        if r not in allowed:
            raise ValueError(
                f"verdict role {r!r} of question {q!r}: that question takes {', '.join(allowed)} "
                f"(a sentence of its own: role='note' with a question key of its own)"
            )
        if q in THRESHOLD_QUESTIONS and r == "measure" and not isinstance(self.rule, Thresholds):
            raise ValueError(f"a measure of {q!r} needs rule=Thresholds(yes=…, no=…)")
        if q in THRESHOLD_QUESTIONS and not (self.phrase or self.note):
            raise ValueError(f"a statistic of {q!r} needs a phrase (or, beside, a note)")
        if (q == "agrees" or q == "faithful") and not self.measure:
            raise ValueError(f"a statistic of {q!r} needs measure=… (what it names)")
        if r == "note" and not self.note:
            raise ValueError("a note role needs note=… (its sentence)")
        if isinstance(self.rule, Drop) and r != "beside":
            raise ValueError("rule=Drop is a beside statistic's")


@dataclass(frozen=True)
class Wording:
    """A threshold question's sentences: ``{what}`` the measures' phrases (and those beside),
    ``{n}`` the sample, ``{why}`` which bound misses which threshold."""

    yes: str
    no: str
    middle: str
    middle_answer: str = "unclear"
    missing: str | None = None
    beside: tuple[str, str, str] = (" (", "; ", ")")
    names: tuple[str, str] = ("yes", "no")


WORDING: dict[str, Wording] = {
    "used": Wording(
        yes="Attention is used{n}: {what}; this model depends on its attention weights.",
        no="Attention is not used{n}: {what}.",
        middle="Attention is used weakly, if at all{n}: {what}; neither rule decides: {why}.",
        missing="Whether attention is used was not measured ({ablations} not run).",
        names=("used", "not used"),
    ),
    "unique": Wording(
        yes="It is close to unique: {what}; few distant alternatives give the same output.",
        no="It is not a unique explanation: {what}.",
        middle="Whether it is unique is unclear: {what}.",
        missing="Uniqueness was not measured ({ablations} not run).",
        names=("unique", "not unique"),
    ),
    "aligns": Wording(
        yes="It aligns with the gold alignment: {what}.",
        no="It does not align with the gold alignment: {what}.",
        middle="It aligns partly: {what}.",
        middle_answer="partly",
        beside=(" and ", " and ", ""),
        names=("aligns", "does not align"),
    ),
}
"""The sentences of the questions decided by :class:`Thresholds`
(:func:`attnstudy.verdict.findings.verdict`;
aligns says nothing where it was not measured: without gold links the table says why)."""


def criterion_sentence(
    name: str,
    values: dict,
    first: str,
    first_values: dict,
    *,
    lower: bool = False,
    first_lower: bool = False,
) -> str:
    """The verdict's sentence for a faithfulness criterion after the first (:class:`VerdictRole`'s
    ``criterion``): the order it puts its rankings in, most faithful first, each with its value
    and interval, and every pair of rankings both criteria measured that ``first`` orders the
    other way, saying whether the two values' intervals are apart in both criteria or overlap.

    Args:
        name, first: the two criteria (``"soft erasure"``, ``"deletion"``).
        values, first_values: ranking → its estimate under each (``value``, ``low``, ``high``,
            ``has_ci``, ``fmt()``: :class:`attnstudy.verdict.findings.Estimate`).
        lower, first_lower: lower values are the more faithful under ``name`` / ``first``
            (hard sufficiency); else higher. A ``first`` where lower is more faithful is said
            to "rank" a ranking "as more faithful" rather than to "put it higher".
    """

    def above(x, y, low_first: bool) -> bool:  # x more faithful than y
        return x.value < y.value if low_first else x.value > y.value

    def apart(x, y, low_first: bool) -> bool:  # x clearly more faithful than y
        return x.high < y.low if low_first else x.low > y.high

    ranked = sorted(values, key=lambda m: values[m].value if lower else -values[m].value)
    listing = ", ".join(f"{m} {values[m].fmt()}" for m in ranked)
    s = f"By {name or 'its second criterion'}, the rankings' order is {listing}"
    first = first or "the first criterion"
    common = [m for m in ranked if m in first_values]
    if len(common) < 2:
        return s + "."
    flips = []
    for i, a in enumerate(common):
        for b in common[i + 1 :]:  # a above b here
            ea, eb, fa, fb = values[a], values[b], first_values[a], first_values[b]
            if above(fb, fa, first_lower):
                both = all(x.has_ci for x in (ea, eb, fa, fb)) and (
                    apart(ea, eb, lower) and apart(fb, fa, first_lower)
                )
                where = "the intervals are apart in both" if both else "the intervals overlap"
                puts = f"ranks {b} as more faithful" if first_lower else f"puts {b} higher"
                flips.append(f"{a} and {b} ({first} {puts}; {where})")
    if not flips:
        return s + f", the same order as by {first}."
    return s + f"; the order by {first} differs for " + "; ".join(flips) + "."
