"""Jinja2 templates of the report and the example browser (``attnstudy/templates/``)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


@lru_cache(maxsize=1)
def _env():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=jinja2.select_autoescape(["html.j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["script_json"] = script_json
    env.filters["md_cell"] = md_cell
    return env


def render(name: str, **context) -> str:
    """Render ``templates/<name>`` (HTML templates autoescape; Markdown ones do not)."""
    return _env().get_template(name).render(**context)


def script_json(value) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</script>``, no ``<!--``)."""
    from markupsafe import Markup

    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return Markup(text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def md_cell(value) -> str:
    """A Markdown table cell: pipes escaped, newlines as spaces."""
    return str(value).replace("|", "\\|").replace("\n", " ")
