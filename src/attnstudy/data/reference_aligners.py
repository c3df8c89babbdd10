"""The reference aligners: per task with human gold links, the statistical aligner whose AER,
precision and recall a study's report shows beside attention's (on the same test examples,
against the same gold).

One registry, :data:`REFERENCE_ALIGNERS` (task name → :class:`ReferenceAligner`); a task without
an entry has no reference row. ``nt-greek-english``: eflomal (Östling & Tiedemann 2016), both
directions joined by grow-diag-final-and, learning unsupervised on the training verses plus the
test verses' text (:mod:`attnstudy.data.eflomal`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from attnstudy.config import DataConfig
from attnstudy.data import nt
from attnstudy.data.symmetrise import DEFAULT


@dataclass(frozen=True)
class ReferenceAligner:
    """A task's reference aligner.

    Attributes:
        name: its label in the report (``eflomal, grow-diag-final-and``).
        how: one sentence on what it learns from (shown under the report's table).
        align: ``(data config, n_scored) -> (scores, counts)``: ``scores`` maps ``aer``,
            ``precision``, ``recall`` to an estimate with ``value``, ``low``, ``high``; ``counts``
            has at least ``test_verses`` (the examples scored: the first ``n_scored`` test
            examples) and ``gold_links``. Raises the aligner's one-line error.
        check: raises the aligner's one-line error when it is not installed (called before a
            study trains anything).
        version: what identifies the aligner's results beside the data settings (its command and
            version, the symmetrisation): part of the cache key.
    """

    name: str
    how: str
    align: Callable[[DataConfig, int | None], tuple[dict[str, Any], dict[str, int]]]
    check: Callable[[], object]
    version: str


def _eflomal_align(cfg: DataConfig, n_scored: int | None):
    from attnstudy.data import eflomal

    return eflomal.nt_reference(None, cfg, n_scored=n_scored)


def _eflomal_check() -> object:
    from attnstudy.data import eflomal

    return eflomal.find_command()


REFERENCE_ALIGNERS: dict[str, ReferenceAligner] = {
    nt.TASK: ReferenceAligner(
        name=f"eflomal, {DEFAULT}",
        how="eflomal 2.0.0 (Östling & Tiedemann 2016) in both directions, joined by "
        f"{DEFAULT}; unsupervised, it learns on the training verses plus the test "
        "verses' text (never a gold link), as statistical aligners are run; scored on the same "
        "test verses as the battery, links to English punctuation left out.",
        align=_eflomal_align,
        check=_eflomal_check,
        version=f"eflomal==2.0.0 eflomal-align -f -r; {DEFAULT}",
    ),
}
"""Registry: task name → :class:`ReferenceAligner`."""


def reference_aligner(task: str) -> ReferenceAligner | None:
    """The reference aligner of ``task``, or None where it has none."""
    return REFERENCE_ALIGNERS.get(task)
