"""The docs' tables generated from the ablation catalogue (``make docs``): the ablations
(:func:`markdown_table`, in docs/design.md and README.md) and the statistics the report shows
(:func:`stats_markdown_table`), written between their markers by :func:`update_docs`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .catalogue import Params, get_ablation, list_ablations, questions, shown_stats


def _default_text(key: str, field_info: Any) -> str:
    """A parameter's default as the docs table writes it; a nested table of another entry's
    :class:`Params` (``attribution_agreement.saliency``) defaults to that entry's defaults."""
    default = field_info.get_default(call_default_factory=True)
    return f"`[ablation.{key}]`'s defaults" if isinstance(default, Params) else str(default)


def markdown_table() -> str:
    """The table of ablations in docs/design.md and README.md, generated from the catalogue."""
    rows = [
        "| ablation | what it does | unit | prefix | needs | parameters | statistics | reference |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in list_ablations():
        s = get_ablation(name)
        params = (
            ", ".join(f"`{k}` = {_default_text(k, f)}" for k, f in s.params.model_fields.items())
            or "–"
        )
        names = list(s.stats)
        stats = (
            ", ".join(f"`{k}`" for k in names)
            if len(names) <= 6
            else ", ".join(f"`{k}`" for k in names[:3]) + f", … ({len(names)} in all)"
        )
        default = "" if s.default else " (opt-in)"
        rows.append(
            f"| `{name}`{default} | {s.description} | {s.unit} | {s.prefix} | {', '.join(s.requires) or '–'} "
            f"| {params} | {stats} | {s.reference} |"
        )
    return "\n".join(rows)


def stats_markdown_table() -> str:
    """The table of the statistics the report shows (docs/design.md), generated from the catalogue
    in the report's order: question, column label, metric, unit, which values answer yes."""
    titles = {q: x.title for q, x in questions().items()}
    rows = [
        "| question | column | metric | unit | yes when |",
        "|---|---|---|---|---|",
    ]
    for st in shown_stats():
        yes = {"higher": "higher", "lower": "lower"}.get(st.stat.direction, "–")
        rows.append(
            f"| {titles[st.stat.question]} | {st.stat.label} | `{st.key}` | {st.stat.unit} | {yes} |"
        )
    return "\n".join(rows)


BEGIN, END = (
    "<!-- ablation-catalogue:begin (generated: make docs) -->",
    "<!-- ablation-catalogue:end -->",
)
STATS_BEGIN, STATS_END = (
    "<!-- statistics-catalogue:begin (generated: make docs) -->",
    "<!-- statistics-catalogue:end -->",
)
GENERATED = ((BEGIN, END, markdown_table), (STATS_BEGIN, STATS_END, stats_markdown_table))
"""The generated blocks of the docs: markers and the function writing what is between them."""


def update_docs(*paths: Path) -> list[Path]:
    """Rewrite the generated tables (:data:`GENERATED`) between their markers in each file that has
    them; returns the files changed."""
    changed = []
    for path in paths:
        text = new = path.read_text(encoding="utf-8")
        for begin, end, table in GENERATED:
            if begin not in new:
                continue
            head, _, rest = new.partition(begin)
            _, _, tail = rest.partition(end)
            new = f"{head}{begin}\n{table()}\n{end}{tail}"
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


if __name__ == "__main__":  # make docs; run through the importable module, not this __main__ copy
    import sys

    from attnstudy.analysis import catalogue_docs

    for p in catalogue_docs.update_docs(*(Path(a) for a in sys.argv[1:])):
        print(f"updated {p}")
