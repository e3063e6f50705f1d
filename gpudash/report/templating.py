"""The report's Jinja2 environments (templates are package data in ``templates/``).

HTML autoescapes every value (names, messages and evidence come from the run: hostile input);
Markdown passes every value through :func:`md_text`, so a run's text carries no raw HTML into a
renderer that would show it.
"""

from __future__ import annotations

import re
import time
from functools import cache

from jinja2 import Environment, PackageLoader, StrictUndefined

__all__ = ["html_env", "markdown_env", "md_text"]


def md_text(value: object) -> str:
    """Markdown with no raw HTML: a ``<`` that would open a tag and a ``&`` that would start an entity are
    escaped; a plain ``loss < 2`` stays readable in the terminal."""
    return re.sub(r"<(?=[A-Za-z/!?])", "&lt;", re.sub(r"&(?=#?\w+;)", "&amp;", str(value)))


def _utc_minute(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds))


def _env(**options: object) -> Environment:
    env = Environment(loader=PackageLoader("gpudash.report", "templates"), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, **options)  # type: ignore[arg-type]
    env.filters["utc_minute"] = _utc_minute
    return env


@cache
def html_env() -> Environment:
    """HTML and SVG templates, autoescaped."""
    return _env(autoescape=True)


@cache
def markdown_env() -> Environment:
    """Markdown templates: no HTML escaping (a terminal shows ``&amp;`` as is), :func:`md_text` on every value."""
    return _env(autoescape=False, finalize=md_text)
