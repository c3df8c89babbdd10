"""The report's prose that the code places, read from ``templates/report.toml`` (the prose lives
with the templates): the titles and captions of the figures of the whole study and the title and
intro of the trained adversaries' table."""

from __future__ import annotations

import tomllib

from attnstudy.pages.templating import TEMPLATES

PROSE: dict = tomllib.loads((TEMPLATES / "report.toml").read_text(encoding="utf-8"))
"""``templates/report.toml`` as read: ``figures.<key>.title``/``caption``,
``tables.<key>.title``/``intro``."""

STUDY_FIGURES: dict[str, tuple[str, str]] = {
    key: (figure["title"], figure["caption"]) for key, figure in PROSE["figures"].items()
}
"""Title and caption of the figures of the whole study (the ablations' own figures, with theirs,
are in the catalogue: :func:`attnstudy.analysis.catalogue.figures`)."""

ADVERSARY_TABLE: tuple[str, str] = (
    PROSE["tables"]["adversaries"]["title"],
    PROSE["tables"]["adversaries"]["intro"],
)
"""Title and intro of the report's table of trained adversaries."""
