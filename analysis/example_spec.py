"""What an ablation shows per example in the example browser and ``ablations/examples.csv``: its
per-example columns (:class:`ExampleColumn`) and the maps it records while it runs
(:class:`Capture`, each map a :class:`MapView`).

Declared in the ablation's catalogue entry (``AblationSpec(examples=…, captures=…)``,
:mod:`attnstudy.analysis.catalogue`, which re-exports these names for the spec headers) and read by
:func:`attnstudy.analysis.per_example.per_example_summary`, :mod:`attnstudy.analysis.heatmaps`
and :mod:`attnstudy.pages.browser`; nothing else lists them. An entry without ``examples`` gets one
column per statistic the report shows that averages a per-step column
(:func:`attnstudy.analysis.catalogue.example_columns`). This module imports only the standard
library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class ExampleColumn:
    """One number per analysed example (and unit): a column of the browser's list and of
    ``examples.csv``, and optionally of an example's per-step table.

    Attributes:
        key: its name in ``examples.csv`` and the page's data.
        label: its heading in the browser.
        column: the per-row column it reads: its mean over the example's rows where it is defined
            (a step ablation's rows: the analysis prefix's, or the reference's for an entry with
            ``prefix = "reference"``), or the example's own value (an entry with
            ``unit = "example"``).
        num, den: instead of ``column``, the ratio of the example's sums Σ num / Σ den, each the
            sum of the columns named (``complement``: 1 − the ratio); NaN where Σ den = 0.
        unit: what its numbers measure (the heading's hover text).
        undefined: why an example can lack a value (the cell's hover text).
        step_label: also shown per decoder step in an example's step table, under this label
            (a step ablation's ``column``; empty: not shown there).
        listed: a column of the list and of ``examples.csv`` (False: the step table only).
        order: its place among the columns (default: its entry's ``order``).
    """

    key: str
    label: str
    column: str | None = None
    num: tuple[str, ...] = ()
    den: tuple[str, ...] = ()
    complement: bool = False
    unit: str = ""
    undefined: str = "no decoder step of this example defines it"
    step_label: str = ""
    listed: bool = True
    order: int | None = None

    def __post_init__(self) -> None:
        if (self.column is None) == (not self.num or not self.den):
            raise ValueError(f"ExampleColumn {self.key!r}: either column=… or num=… with den=…")
        if self.step_label and self.column is None:
            raise ValueError(f"ExampleColumn {self.key!r}: a step_label shows a column=…")

    @property
    def columns(self) -> tuple[str, ...]:
        """The per-row columns it needs."""
        return (self.column,) if self.column is not None else (*self.num, *self.den)


@dataclass(frozen=True)
class MapView:
    """A map an ablation records per example (one row per decoder step over the source tokens),
    as the browser draws it.

    Attributes:
        key: its key in the example's record (``ablations/heatmaps.json``).
        title: its heading.
        caption: what it shows; ``{eps}`` becomes `` = <ε_eval>`` where the run logged it.
        scale: ``"weights"`` (0–1 as they are, the attention colour scale) or ``"row"`` (a
            magnitude: each row scaled to its largest, the importance colour scale; the hover
            shows the value).
    """

    key: str
    title: str
    caption: str
    scale: Literal["weights", "row"] = "weights"


@dataclass(frozen=True)
class Capture:
    """The maps an ablation records while the suite runs it, so they are those behind its numbers
    and cost no second computation.

    Attributes:
        run: ``"module:function"`` or a callable ``fn(model, batch, params, ctx) -> (table,
            computed)``: the ablation's ``run`` that also returns what it computed on the way
            (a test holds its table equal to ``run``'s).
        record: ``"module:function"`` or a callable ``fn(batch, i, steps, n, computed) -> dict``:
            the maps of example ``i`` of the batch (its real decoder steps ``steps``, a (T,) long
            tensor, and its ``n`` source tokens) as nested lists, keyed by :attr:`MapView.key`.
        maps: the maps it records, in the order the browser draws them.
    """

    run: str | Callable[..., Any]
    record: str | Callable[..., Any]
    maps: tuple[MapView, ...] = ()
