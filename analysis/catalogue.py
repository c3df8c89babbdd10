"""The ablation catalogue: every ablation is one registered :class:`AblationSpec`.

A spec names the ablation, its function, its own validated parameters (``[ablation.<name>]`` in an
experiment file), what it needs of the model, its unit (decoder step or example), its prefix
(the analysis prefix or the reference), the summary statistics with their reducers, the report
labels and its figure. Config validation, the suite, the report, the CLI help, the docs table and
the cross-cutting tests all read this catalogue; nothing else lists ablations.

**Adding an ablation** = one module in ``attnstudy.analysis.ablations`` (it defines ``SPEC``) plus
one test file; from a notebook, one :func:`register_ablation` call.

The modules of ``attnstudy.analysis.ablations`` are discovered *without importing them*: each
module's spec header — its ``SPEC = AblationSpec(…)`` assignment, the :class:`Params` subclasses it
uses and its imports from this module and pydantic — is read from the source and run alone, so
validating a config never imports torch. The rest of the module (the implementation) is imported
when the ablation runs. This module imports only the standard library and pydantic.
"""

from __future__ import annotations

import ast
import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from attnstudy.config import Device, _Strict
from attnstudy.verdict.roles import Drop as Drop
from attnstudy.verdict.roles import Thresholds as Thresholds
from attnstudy.verdict.roles import VerdictRole as VerdictRole

from .example_spec import Capture as Capture
from .example_spec import ExampleColumn as ExampleColumn
from .example_spec import MapView as MapView

CAPABILITIES = tuple(
    "attention local global gradients prefix_gradients values self_attention".split()
)
"""What an ablation may need of a model: the capabilities :mod:`attnstudy.analysis.contract`
defines (its docstring says what each asks of a model)."""


class UnknownAblationError(ValueError):
    """An ablation name that is not in the catalogue (the message lists the choices)."""


class AblationSpecError(ValueError):
    """An ablation module or spec that breaks the catalogue's rules (the message says which)."""


class Params(_Strict):
    """Base of an ablation's own parameters (``[ablation.<name>]``): strict, frozen, finite."""


class NoParams(Params):
    """An ablation without parameters of its own."""


class OutputChangeParams(Params):
    """The settings of an ablation that reports an output change (permutation, uniform,
    erase_max, importance's leave-one-out, adversarial).

    Attributes:
        scores: registered step scores (:mod:`attnstudy.analysis.step_scores`) reported per step
            beside the ablation's own TVD, as column ``<ablation>_<score>`` and metric
            ``ablation/<ablation>/<score>`` (permutation: the median over a step's permutations,
            ``permutation_median_<score>``, as its TVD; importance: the Kendall τ-b of attention
            against each score's leave-one-out vector, ``importance_tau_attn_loo_<score>`` and
            ``importance_p_attn_loo_<score>``; adversarial: the chosen adversary's output, NaN
            where none was found). Empty by default, and then left out of the resolved settings:
            the keys and logged parameters of a battery without it do not change.
    """

    scores: tuple[str, ...] = Field((), max_length=32)

    @field_validator("scores", mode="before")
    @classmethod
    def _a_list(cls, value):
        if isinstance(value, str):  # pydantic's own line says "a valid tuple"
            raise ValueError(f'scores is a list of step score names, e.g. scores = ["{value}"]')
        return value

    @field_validator("scores")
    @classmethod
    def _known_scores(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        import sys

        if len(set(value)) != len(value):
            raise ValueError("a step score is named twice")
        if any(name in ("tvd", "flip") for name in value):
            raise ValueError("tvd and flip are reported already; name other step scores")
        if "skipped" in value:  # <ablation>_skipped is every ablation's own column
            raise ValueError(
                "a step score named 'skipped' would replace the ablation's own skipped column; "
                "register it under another name"
            )
        registry = sys.modules.get("attnstudy.analysis.step_scores")  # not imported: checked
        if registry is not None:  # when the ablation runs (validation never imports torch)
            for name in value:
                registry.get_step_score(name)
        return value

    @model_serializer(mode="wrap")
    def _omit_no_scores(self, handler):
        data = handler(self)
        if not self.scores:
            data.pop("scores", None)
        return data


KEY_CONTEXT = "key"
"""``model_dump(context={KEY_CONTEXT: True})``: the key form (:meth:`AblationConfig.resolved`),
which may leave out a value older runs lack; every other dump is read back and keeps it."""


@dataclass(frozen=True)
class Question:
    """A question the report answers: one table of numbers per model and one block of the summary
    figure, its statistics declared by :attr:`Stat.question`.

    Attributes:
        title: the table's heading.
        intro: the paragraph under it (what was measured, how to read it).
        order: position among the report's tables.
    """

    title: str
    intro: str = ""
    order: int = 100


QUESTIONS: dict[str, Question] = {
    "task": Question(
        "Task accuracy (test split, greedy decoding)",
        "Greedy decoding of the whole test split; 95 % intervals from a bootstrap over test "
        "examples. Token error rate: Σ edit distance to the closest reference / Σ its length (PER "
        "for G2P).",
        order=0,
    ),
    "used": Question(
        "Is attention used? Intervening on it",
        "Local interventions replace one step's attention row and recompute that step's output "
        "from its own prefix state; the global permutation permutes every step's row during "
        "free-running decoding, so the effect propagates. Flip: the predicted token changes.",
        order=10,
    ),
    "unique": Question(
        "Is it a unique explanation? Adversarial attention",
        "The adversarial search (Jain & Wallace 2019, §4.2) looks for attention rows as far as "
        "possible (JSD) from the model's whose output stays within ε (TVD); found: the share of "
        "steps with such a row, max JSD: the largest JSD among them (mean over steps where one was "
        "found).",
        order=20,
    ),
    "agrees": Question(
        "Does it agree with other importance measures? Kendall τ-b",
        "Kendall τ-b between the ranking of source tokens by attention and by importance, per "
        "step; τ gradient–LOO is how well the two non-attention measures agree with each other.",
        order=30,
    ),
    "aligns": Question(
        "Does it align with gold links?",
        "The attention argmax of every reference target token (teacher-forced on the reference) "
        "as a hard alignment against the gold links.",
        order=40,
    ),
    "erasure": Question(
        "Erase until the decision flips",
        "Source positions erased one at a time in a ranking order until the predicted token "
        "changes (Serrano & Smith 2019, §4); never flipped: the share of steps that kept their "
        "token with all but one position erased.",
        order=50,
    ),
}
"""The report's questions: ``task`` (the task registry's metrics) and those the ablations feed; an
ablation may add one of its own (:attr:`AblationSpec.questions`)."""

Direction = Literal["higher", "lower", ""]
"""Which values answer a statistic's question *yes* (attention used, unique, agreeing,
aligned…): ``"higher"``, ``"lower"``, or ``""`` where neither does."""


@dataclass(frozen=True)
class Stat:
    """One summary statistic of an ablation, reduced over the rows (steps or examples) of a model.

    Either a micro-average of ``column`` over the rows where it is defined (not NaN), or, with
    ``num`` and ``den``, the ratio Σ num / Σ den over the rows (a corpus-level ratio such as AER);
    ``complement`` reports 1 − that ratio. Bootstrap intervals resample examples either way.

    Attributes:
        column: the per-row column averaged.
        num, den: the per-row columns of a ratio of sums.
        complement: report 1 − ratio (AER = 1 − (|A∩S| + |A∩P|) / (|A| + |S|)).
        label: its name in the report's tables and figures, and in result tables.
        unit: what its numbers measure (the summary figure's scale).
        direction: which values answer its question yes (:data:`Direction`).
        question: the report table and figure block it belongs to (a key of :data:`QUESTIONS`
            or of its spec's :attr:`AblationSpec.questions`); None: logged, but not a column of
            the report.
        verdict: which verdict question it feeds and its role there
            (:class:`~attnstudy.verdict.roles.VerdictRole`, its rule a ``Thresholds`` or a ``Drop``
            of :mod:`attnstudy.verdict.roles`); None: the verdict does not read it. Independent of
            ``question`` (the report's table).
        order: its column's position in the question's table (default: its spec's ``order``).
        optional: a statistic the ablation's settings select (a faithfulness ranking): a column
            of the report only where some model of the study logged it (its value or its count
            of undefined steps), not a column of reasons where the study left it out.
        former_labels: labels it had in result tables written by earlier versions (``report
            --results``); reading such a table (:func:`attnstudy.report.results.read_rows`) renames
            them to ``label``, so a committed table need not be rebuilt when a label changes.
    """

    column: str | None = None
    num: str | None = None
    den: str | None = None
    complement: bool = False
    label: str = ""
    unit: str = "share of steps (0–1)"
    direction: Direction = ""
    question: str | None = None
    order: int | None = None
    optional: bool = False
    former_labels: tuple[str, ...] = ()
    verdict: VerdictRole | None = None

    def __post_init__(self) -> None:
        if (self.column is None) == (self.num is None or self.den is None):
            raise AblationSpecError("a Stat is either column=… or num=… with den=…")
        if self.question is not None and not self.label:
            raise AblationSpecError("a Stat shown in the report (question=…) needs a label")
        role = self.verdict
        if role is not None and not isinstance(role, VerdictRole):
            raise AblationSpecError("Stat(verdict=…) takes a VerdictRole")
        if (
            role is not None
            and isinstance(role.rule, Thresholds)
            and (role.direction or self.direction) not in ("higher", "lower")
        ):
            raise AblationSpecError(
                f"a statistic whose verdict role has Thresholds needs direction='higher' or "
                f"'lower' (which values answer {role.question!r} yes)"
            )

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.column,) if self.column is not None else (self.num, self.den)  # type: ignore[return-value]


@dataclass(frozen=True)
class Figure:
    """An ablation's figure in the report.

    Attributes:
        kind: how it is drawn: a figure of its own in :data:`attnstudy.analysis.figures.FIGURE_KINDS`
            (``"permutation"``, ``"erasure"``…), or ``"stat_distributions"``, the generic kind
            drawn from the spec's per-step statistics (a box per model and statistic).
        title: the figure's heading in the report.
        caption: what it shows and how to read it.
        order: its position among the ablations' figures (default: its spec's ``order``).
    """

    kind: str
    title: str
    caption: str
    order: int | None = None


TERMS: dict[str, str] = {
    "decoder step": "one target position t of one example: one attention row α_t over the source "
    "and one output distribution p_t; the step that emits <eos> is included.",
    "prefix": "the target tokens fed to the decoder before step t. Greedy (the default): the "
    "model's own greedy output, so every step is one the model really takes; reference: the gold "
    "target (teacher forcing). Alignment always uses the reference, because gold links index it.",
    "TVD": "total variation distance between two output distributions, ½ Σ_v |p(v) − q(v)| over "
    "the full vocabulary; 0 = identical, 1 = disjoint.",
    "JSD": "Jensen–Shannon divergence between two attention distributions, natural log: 0 = "
    "identical, at most ln 2 ≈ 0.693 (disjoint).",
    "flip": "the predicted token (argmax of p_t) changes under the intervention; a flip rate is "
    "the share of interventions (permutations) or steps that flip, averaged over steps.",
    "Kendall τ-b": "rank correlation of two importance vectors over a step's source positions "
    "(−1 … 1), with ties.",
    "95 % interval": "percentile bootstrap over examples (not steps): the examples are resampled "
    "with replacement, so steps of one example stay together.",
}
"""Terms several ablations use, defined once: the report opens its definitions with
:data:`OPENING_TERMS`, adds each ablation's own definitions and the shared terms it names
(:attr:`AblationSpec.terms`), and closes with :data:`CLOSING_TERMS`."""
OPENING_TERMS = ("decoder step", "prefix", "TVD", "JSD", "flip")
CLOSING_TERMS = ("95 % interval",)


@dataclass(frozen=True)
class AblationSpec:
    """One ablation.

    Attributes:
        name: its name in configs, metrics (``ablation/<name>/<stat>``) and columns (``<name>_…``).
        run: ``"module:function"`` (imported when it runs) or a callable
            ``fn(model, batch, params, ctx) -> DataFrame`` with one row per real step (``example_id``,
            ``step`` and its own columns), or per example (``example_id``) when ``unit = "example"``.
        params: its parameter model (a :class:`Params` subclass).
        unit: ``"step"`` or ``"example"``.
        prefix: ``"analysis"`` (the configured prefix) or ``"reference"`` (the reference target,
            e.g. for gold alignments).
        requires: capabilities of :data:`CAPABILITIES` the model must have; a model without one
            skips the ablation, with the reason.
        stats: summary statistic name → :class:`Stat`.
        counts: per-row count columns summed into ``ablation/<name>/<count>``.
        derive: optional ``fn(rows) -> rows`` adding derived columns before the statistics
            (e.g. an exact-match drop, the AER's numerator and denominator).
        more_stats: optional ``fn(columns) -> {stat: Stat}`` for statistics whose number depends
            on the model (one per attention head).
        skip_column: the bool column marking rows the ablation could not analyse (default
            ``<name>_skipped``).
        figure: its figure in the report (:class:`Figure`), or None.
        definitions: ``(term, definition)`` pairs for the report's definitions section.
        terms: shared terms of :data:`TERMS` its statistics use, defined after its own.
        examples: its columns in the example browser and ``examples.csv``
            (:class:`~attnstudy.analysis.example_spec.ExampleColumn`); None: one per statistic
            with a ``question`` that averages a ``column`` (:func:`example_columns`).
        captures: the maps it records per example for the browser
            (:class:`~attnstudy.analysis.example_spec.Capture`), or None.
        questions: questions of its own (key → :class:`Question`) that its statistics feed,
            beside those of :data:`QUESTIONS`.
        default: part of the default battery (``ablation.ablations`` left out).
        order: position in the battery and in tables.
        description: one line for the docs and ``--help``.
        reference: the paper (and section) it follows.
    """

    name: str
    run: str | Callable[..., Any]
    params: type[Params] = NoParams
    unit: Literal["step", "example"] = "step"
    prefix: Literal["analysis", "reference"] = "analysis"
    requires: tuple[str, ...] = ("attention", "local")
    stats: Mapping[str, Stat] = field(default_factory=dict)
    counts: tuple[str, ...] = ()
    derive: str | Callable[[Any], Any] | None = None
    more_stats: str | Callable[[Any], Mapping[str, Stat]] | None = None
    skip_column: str | None = None
    figure: Figure | None = None
    definitions: tuple[tuple[str, str], ...] = ()
    terms: tuple[str, ...] = ()
    questions: Mapping[str, Question] = field(default_factory=dict)
    examples: tuple[ExampleColumn, ...] | None = None
    captures: Capture | None = None
    default: bool = True
    order: int = 100
    description: str = ""
    reference: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or not self.name.islower():
            raise AblationSpecError(f"ablation name {self.name!r} must be a lower-case identifier")
        unknown = [c for c in self.requires if c not in CAPABILITIES]
        if unknown:
            raise AblationSpecError(
                f"ablation {self.name!r} requires unknown capabilities {unknown}; "
                f"known: {', '.join(CAPABILITIES)}"
            )
        if not (isinstance(self.params, type) and issubclass(self.params, Params)):
            raise AblationSpecError(f"ablation {self.name!r}: params must be a Params subclass")
        unknown_terms = [t for t in self.terms if t not in TERMS]
        if unknown_terms:
            raise AblationSpecError(
                f"ablation {self.name!r}: unknown shared terms {unknown_terms}; known: "
                f"{', '.join(TERMS)} (define a term of its own in definitions=…)"
            )
        known = set(QUESTIONS) | set(self.questions)
        for key, stat in self.stats.items():
            drop = stat.verdict.rule if stat.verdict is not None else None
            if isinstance(drop, Drop) and not {drop.original, drop.changed} <= set(self.stats):
                raise AblationSpecError(
                    f"ablation {self.name!r}: statistic {key!r}'s Drop names statistics it does "
                    f"not have ({drop.original!r}, {drop.changed!r})"
                )
            if stat.question is not None and stat.question not in known:
                raise AblationSpecError(
                    f"ablation {self.name!r}: statistic {key!r} feeds unknown question "
                    f"{stat.question!r}; known: {', '.join(sorted(known))} (declare a new one in "
                    "questions=…)"
                )

    @property
    def skipped(self) -> str:
        """The column marking rows the ablation could not analyse."""
        return self.skip_column or f"{self.name}_skipped"

    def function(self) -> Callable[..., Any]:
        """The run function (its module imported now).

        Raises:
            AblationSpecError: the module or function does not exist (never a silent skip).
        """
        return _resolve(self.run, self.name, "run")

    def derive_function(self) -> Callable[[Any], Any] | None:
        return None if self.derive is None else _resolve(self.derive, self.name, "derive")

    def all_stats(self, columns) -> dict[str, Stat]:
        """:attr:`stats` plus those :attr:`more_stats` finds among ``columns``."""
        extra = (
            {}
            if self.more_stats is None
            else _resolve(self.more_stats, self.name, "more_stats")(columns)
        )
        return {**self.stats, **extra}


def _resolve(target: str | Callable[..., Any], name: str, what: str) -> Callable[..., Any]:
    if callable(target):
        return target
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise AblationSpecError(
            f"ablation {name!r}: its {what} function {target!r} cannot be loaded ({err})"
        ) from err


_REGISTRY: dict[str, AblationSpec] = {}
_DISCOVERED = False
ABLATIONS_PACKAGE = "attnstudy.analysis.ablations"
ABLATIONS_DIR = Path(__file__).with_name("ablations")


def register_ablation(spec: AblationSpec, overwrite: bool = False) -> AblationSpec:
    """Add an ablation to the catalogue (inseq's ``register_step_function``, for ablations).

    Raises:
        AblationSpecError: the name is taken (unless ``overwrite``).
    """
    _discover()
    if spec.name in _REGISTRY and not overwrite:
        raise AblationSpecError(
            f"an ablation named {spec.name!r} is already registered; pass overwrite=True"
        )
    _REGISTRY[spec.name] = spec
    return spec


def unregister_ablation(name: str) -> None:
    """Remove an ablation registered with :func:`register_ablation` (tests, notebooks)."""
    _REGISTRY.pop(name, None)


def list_ablations(default_only: bool = False) -> list[str]:
    """Every ablation's name in battery order (``default_only``: the default battery)."""
    _discover()
    specs = sorted(_REGISTRY.values(), key=lambda s: (s.order, s.name))
    return [s.name for s in specs if s.default or not default_only]


def get_ablation(name: str) -> AblationSpec:
    """The spec of an ablation.

    Raises:
        UnknownAblationError: not in the catalogue (the message lists the choices).
    """
    _discover()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownAblationError(
            f"unknown ablation {name!r}; valid: {', '.join(list_ablations())}"
        ) from None


@dataclass(frozen=True)
class ShownStat:
    """A statistic as the report shows it: ``key`` is its metric, ``ablation/<ablation>/<name>``."""

    key: str
    ablation: str
    name: str
    stat: Stat


def _names(names: Iterable[str] | None) -> list[str]:
    known = list_ablations()
    return known if names is None else [n for n in known if n in set(names)]


def questions(names: Iterable[str] | None = None) -> dict[str, Question]:
    """:data:`QUESTIONS` and the questions the ablations ``names`` (default: all) declare, in
    report order."""
    found = dict(QUESTIONS)
    for n in _names(names):
        found.update(get_ablation(n).questions)
    return dict(sorted(found.items(), key=lambda kv: kv[1].order))


def shown_stats(names: Iterable[str] | None = None) -> list[ShownStat]:
    """The statistics of the ablations ``names`` (default: all) that have a question, in the
    report's column order: by question, then each statistic's ``order`` (default its spec's),
    then the battery order and the order they are declared in."""
    order = {q: i for i, q in enumerate(questions(names))}
    rows = []
    for n in _names(names):
        spec = get_ablation(n)
        for i, (stat_name, st) in enumerate(spec.stats.items()):
            if st.question is not None:
                shown = ShownStat(f"ablation/{n}/{stat_name}", n, stat_name, st)
                rank = st.order if st.order is not None else spec.order
                rows.append(((order[st.question], rank, spec.order, i), shown))
    return [r for _, r in sorted(rows, key=lambda x: x[0])]


def stat_keys(names: Iterable[str] | None = None) -> list[str]:
    """Every statistic's metric key (``ablation/<name>/<stat>``) of the ablations ``names``
    (default: all), shown in the report or not: what the verdict reads."""
    return [f"ablation/{n}/{k}" for n in _names(names) for k in get_ablation(n).stats]


def verdict_roles(names: Iterable[str] | None = None) -> dict[str, VerdictRole]:
    """Every statistic with a verdict role of the ablations ``names`` (default: all): its metric
    key (``ablation/<name>/<stat>``) → its :class:`~attnstudy.verdict.findings.VerdictRole`, the
    statistic's direction filled in, in the report's column order (each statistic's ``order``,
    default its spec's, then the battery order and the order they are declared in): what
    :func:`attnstudy.verdict.findings.verdict` reads (``ModelFacts.roles``)."""
    from dataclasses import replace

    rows = []
    for n in _names(names):
        spec = get_ablation(n)
        for i, (stat_name, st) in enumerate(spec.stats.items()):
            if st.verdict is not None:
                role = st.verdict
                if not role.direction and st.direction:
                    role = replace(role, direction=st.direction)
                rank = st.order if st.order is not None else spec.order
                rows.append(((rank, spec.order, n, i), f"ablation/{n}/{stat_name}", role))
    return {key: role for _, key, role in sorted(rows, key=lambda x: x[0])}


def example_columns(names: Iterable[str] | None = None) -> list[tuple[AblationSpec, ExampleColumn]]:
    """The per-example columns of the ablations ``names`` (default: all), in the browser's
    order (each column's ``order``, default its spec's, then the battery order and the order they
    are declared in): each spec's :attr:`AblationSpec.examples`, or, where it declares none, one
    per statistic with a ``question`` that averages a ``column`` (key ``<name>_<stat>``, the
    statistic's label and unit)."""
    rows = []
    for n in _names(names):
        spec = get_ablation(n)
        declared = spec.examples
        if declared is None:
            declared = tuple(
                ExampleColumn(f"{n}_{k}", st.label, st.column, unit=st.unit)
                for k, st in spec.stats.items()
                if st.question is not None and st.column is not None
            )
        for i, c in enumerate(declared):
            rank = c.order if c.order is not None else spec.order
            rows.append(((rank, spec.order, n, i), spec, c))
    keys = [c.key for _, _, c in rows]
    if len(set(keys)) != len(keys):
        twice = sorted({k for k in keys if keys.count(k) > 1})
        raise AblationSpecError(f"example columns declared twice: {', '.join(twice)}")
    return [(s, c) for _, s, c in sorted(rows, key=lambda x: x[0])]


def captures(names: Iterable[str] | None = None) -> dict[str, Capture]:
    """The ablations ``names`` (default: all) that record maps for the browser → their
    :class:`~attnstudy.analysis.example_spec.Capture`, in battery order."""
    return {n: c for n in _names(names) if (c := get_ablation(n).captures) is not None}


def capture_functions(name: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The ``run`` and ``record`` functions of ablation ``name``'s capture (imported now).

    Raises:
        AblationSpecError: it has no capture, or a function cannot be loaded.
    """
    c = get_ablation(name).captures
    if c is None:
        raise AblationSpecError(f"ablation {name!r} records no maps (no captures=…)")
    return _resolve(c.run, name, "capture"), _resolve(c.record, name, "record")


def stat_labels(names: Iterable[str] | None = None) -> dict[str, str]:
    """Every labelled statistic's metric key (``ablation/<name>/<stat>``) of the ablations
    ``names`` (default: all) → its label (what the verdict names a statistic by)."""
    return {
        f"ablation/{n}/{k}": st.label
        for n in _names(names)
        for k, st in get_ablation(n).stats.items()
        if st.label
    }


def definitions(names: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """The report's definitions for the ablations ``names`` (default: all): the opening shared
    terms, each ablation's own definitions and the shared terms it names, the closing terms;
    a term defined twice is kept where it first appears."""
    out: dict[str, str] = {t: TERMS[t] for t in OPENING_TERMS}
    for n in _names(names):
        spec = get_ablation(n)
        for term, text in spec.definitions:
            out.setdefault(term, text)
        for term in spec.terms:
            out.setdefault(term, TERMS[term])
    for t in CLOSING_TERMS:
        out.setdefault(t, TERMS[t])
    return list(out.items())


def figures(names: Iterable[str] | None = None) -> list[tuple[AblationSpec, Figure]]:
    """The figures of the ablations ``names`` (default: all), in the report's order (each
    figure's ``order``, default its spec's)."""
    specs = [get_ablation(n) for n in _names(names)]
    found = [(s, s.figure) for s in specs if s.figure is not None]
    return sorted(found, key=lambda sf: sf[1].order if sf[1].order is not None else sf[0].order)


# ----------------------------------------------------------------------------- discovery


# attribution_params: the attribution methods' Params, shared by several entries (pydantic only)
_HEADER_IMPORTS = (
    "attnstudy.analysis.catalogue",
    "attnstudy.analysis.attribution_params",
    "pydantic",
    "typing",
    "__future__",
)


def read_spec(path: Path, package: str | None = ABLATIONS_PACKAGE) -> AblationSpec:
    """The ``SPEC`` of an ablation module, read from its source without importing the module.

    Runs only the module's imports from this module, pydantic and typing, its :class:`Params`
    subclasses, and the ``SPEC = …`` assignment.

    Raises:
        AblationSpecError: no ``SPEC`` assignment, or the header uses anything else.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    header: list[ast.stmt] = []
    found = False
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "") in _HEADER_IMPORTS:
            header.append(node)
        elif isinstance(node, ast.ClassDef) and any(
            isinstance(b, ast.Name) and b.id.endswith("Params") for b in node.bases
        ):
            header.append(node)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SPEC" for t in node.targets
        ):
            header.append(node)
            found = True
    if not found:
        raise AblationSpecError(f"{path}: an ablation module must assign SPEC = AblationSpec(...)")
    namespace: dict[str, Any] = {"__name__": f"{package}.{path.stem}" if package else path.stem}
    try:
        exec(compile(ast.Module(body=header, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
    except NameError as err:
        raise AblationSpecError(
            f"{path}: its SPEC may use only the catalogue, pydantic, typing and the "
            f"module's own Params classes ({err})"
        ) from None
    spec = namespace["SPEC"]
    if not isinstance(spec, AblationSpec):
        raise AblationSpecError(f"{path}: SPEC is not an AblationSpec")
    return spec


SEARCH_PATH_ENV = "ATTNSTUDY_ABLATION_PATH"
"""Folders (separated by ``os.pathsep``) of a user's own ablation modules, discovered like the
built-in ones: each ``*.py`` file defines ``SPEC``; its ``run`` names ``module:function`` with the
module's file name (the folder is put on ``sys.path`` when the ablation runs)."""
_SEARCHED: list[Path] = []


def add_search_path(folder: str | Path) -> list[str]:
    """Register every ablation module of ``folder`` (a catalogue search path; see
    :data:`SEARCH_PATH_ENV`), without importing them.

    Returns:
        The names registered.

    Raises:
        AblationSpecError: not a folder, a module without a valid ``SPEC``, or a name that is
            taken.
    """
    import sys

    _discover()
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise AblationSpecError(f"ablation search path {folder}: no such folder")
    if path in _SEARCHED:
        return []
    names = _register_folder(path, package=None)
    _SEARCHED.append(path)
    if str(path) not in sys.path:
        sys.path.append(str(path))
    return names


def remove_search_path(folder: str | Path) -> None:
    """Undo :func:`add_search_path`: its ablations leave the catalogue (tests, notebooks)."""
    import sys

    path = Path(folder).expanduser().resolve()
    if path not in _SEARCHED:
        return
    for module in sorted(path.glob("*.py")):
        for name, spec in list(_REGISTRY.items()):
            if isinstance(spec.run, str) and spec.run.partition(":")[0] == module.stem:
                del _REGISTRY[name]
        sys.modules.pop(module.stem, None)
    _SEARCHED.remove(path)
    if str(path) in sys.path:
        sys.path.remove(str(path))


def _register_folder(folder: Path, package: str | None) -> list[str]:
    names = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = read_spec(path, package)
        if spec.name in _REGISTRY:
            raise AblationSpecError(f"{path}: ablation {spec.name!r} is defined twice")
        _REGISTRY[spec.name] = spec
        names.append(spec.name)
    return names


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    _DISCOVERED = True
    _register_folder(ABLATIONS_DIR, ABLATIONS_PACKAGE)
    for folder in filter(None, os.environ.get(SEARCH_PATH_ENV, "").split(os.pathsep)):
        add_search_path(folder)


# ----------------------------------------------------------------------------- configuration


NOT_RESULT_SETTINGS = ("device",)
"""General ablation settings that decide where the work runs, not what it computes."""


class AblationConfig(_Strict):
    """Which ablations run, on how many test examples, from which prefix, with which settings.

    The general settings are fields; each ablation's own settings are a table named after it
    (``[ablation.permutation] n = 100``), validated by that ablation's :class:`Params`. Keys of
    earlier versions (``n_permutations``, ``n_random_orders``) are read as their new tables.
    """

    model_config = ConfigDict(extra="allow")  # each ablation's table; frozen and finite as _Strict

    ablations: list[str] = Field(
        default_factory=lambda: list_ablations(default_only=True), min_length=1
    )
    n_examples: int = Field(200, ge=1, le=2_000_000)
    prefix: Literal["greedy", "reference"] = "greedy"
    seed: int = Field(0, ge=0, lt=2**63)
    # how the random draws are made (docs/design.md §4): "counter-1", counter-based Philox streams
    # (attnstudy.analysis.random_streams), or "legacy", a torch generator reseeded per step, the
    # scheme of every run stored before this setting existed (left out of resolved(): its key and
    # params stay those runs')
    rng: Literal["counter-1", "legacy"] = "counter-1"
    bootstrap_resamples: int = Field(1000, ge=10, le=1_000_000)
    chunk_rows: int = Field(4096, ge=1, le=10_000_000)
    # the analysed units of a multi-layer, multi-head model: layer indices (negative from the top),
    # "each" layer in turn, or "all" layers at once; all heads jointly or "each" head alone
    layers: Literal["all", "each"] | list[int] = Field(
        default_factory=lambda: [-1], min_length=1, max_length=64
    )
    heads: Literal["all", "each"] = "all"
    # where the analysis runs ("auto", "cpu", "cuda", "cuda:N"; resolved where it runs); not a
    # setting of the results: left out of resolved() and the ablation key, logged as a tag
    device: Device = "auto"

    @model_validator(mode="after")
    def _units(self) -> AblationConfig:
        if self.layers == "all" and self.heads == "each":
            raise ValueError(
                "ablation.heads = 'each' needs single layers, but ablation.layers = 'all' "
                "analyses all layers at once; use ablation.layers = 'each' or a list of layers"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _tables(cls, data: Any) -> Any:
        return _prepare(data) if isinstance(data, dict) else data

    def params_for(self, name: str) -> Params:
        """The validated parameters of one ablation (its defaults when its table is absent)."""
        spec = get_ablation(name)
        given = (self.model_extra or {}).get(name)
        return given if isinstance(given, spec.params) else spec.params()

    def resolved(self) -> dict[str, Any]:
        """Every setting that determines the results, defaults filled in: the general fields and the
        parameters of each selected ablation (for logging and the ablation key).

        ``rng`` is left out when it is ``"legacy"``: a run stored before the setting existed has
        no ``ablation.rng`` and was made with the legacy streams, so a legacy config keeps that
        run's key and params (and reuses it); ``"counter-1"`` is a new key."""
        out: dict[str, Any] = {
            k: getattr(self, k)
            for k in type(self).model_fields
            if k not in NOT_RESULT_SETTINGS and not (k == "rng" and self.rng == "legacy")
        }
        for name in self.ablations:
            out[name] = self.params_for(name).model_dump(mode="json", context={KEY_CONTEXT: True})
        return out

    def flat(self) -> dict[str, str]:
        """:meth:`resolved` as MLflow params ``ablation.<key>`` (lists as JSON)."""
        import json

        out: dict[str, str] = {}
        for key, value in self.resolved().items():
            if isinstance(value, dict):
                out.update({f"ablation.{key}.{k}": str(v) for k, v in value.items()})
            else:
                out[f"ablation.{key}"] = (
                    json.dumps(value) if isinstance(value, list) else str(value)
                )
        return out


_OLD_KEYS = {
    "n_permutations": ("permutation", "n"),
    "n_random_orders": ("erase_until_flip", "n_random_orders"),
}


def _prepare(data: dict[str, Any]) -> dict[str, Any]:
    """Validate ablation names and per-ablation tables; read earlier keys as their new tables.

    Raises:
        ValueError: an unknown ablation name or table key, or an invalid per-ablation value (one
            line naming ``ablation.<name>.<key>``).
    """
    data = dict(data)
    for old, (name, key) in _OLD_KEYS.items():
        if old in data:
            table = dict(data.get(name) or {})
            if key in table:
                raise ValueError(
                    f"ablation.{old} is replaced by ablation.{name}.{key}; give only one of them"
                )
            table[key] = data.pop(old)
            data[name] = table
    fields = set(AblationConfig.model_fields)
    if "ablations" in data and isinstance(data["ablations"], list | tuple):
        for n in data["ablations"]:
            if isinstance(n, str):
                get_ablation(n)  # UnknownAblationError (a ValueError) lists the choices
    for key in list(data):
        if key in fields:
            continue
        if key not in list_ablations():
            valid = ", ".join([*sorted(fields), *list_ablations()])
            raise ValueError(f"unknown key 'ablation.{key}' (valid keys: {valid})")
        spec = get_ablation(key)
        value = data[key]
        if isinstance(value, spec.params):
            continue
        if not isinstance(value, dict):
            raise ValueError(
                f"ablation.{key} must be a table of {spec.name}'s settings, got {value!r}"
            )
        try:
            data[key] = spec.params.model_validate(value)
        except ValidationError as err:
            e = err.errors()[0]
            loc = ".".join(str(p) for p in e["loc"])
            if e["type"] == "extra_forbidden":
                valid = ", ".join(sorted(spec.params.model_fields)) or "none"
                raise ValueError(
                    f"unknown key 'ablation.{key}.{loc}' (valid keys: {valid})"
                ) from None
            msg = e["msg"].removeprefix("Value error, ")
            raise ValueError(f"ablation.{key}.{loc}: {msg} (got {e.get('input')!r})") from None
    return data
