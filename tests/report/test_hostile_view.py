"""Every value the report renders came from a run and is hostile: the templates escape each one.

A :class:`ReportView` whose every string field (name, path, headline rows, verdicts, alerts, figure
titles, series labels, markers, the capacity line) carries markup is rendered; the page's tags are
only the template's own, each value reads back as its text, and the Markdown holds no raw HTML.
"""

from __future__ import annotations

import dataclasses
import html.parser

import numpy as np
import pytest

from gpudash.analysis.alerts import Alert
from gpudash.analysis.report import Figure, Marker, ReportView, Series
from gpudash.analysis.verdict import Verdict
from gpudash.report import html_page, markdown_text

EVIL = """'"><script>alert(1)</script><img src=x onerror=alert(1)> &amp; {{ 7*7 }} {% if 1 %}x{% endif %}"""
TEMPLATE_TAGS = {"html", "head", "meta", "title", "style", "body", "main", "h1", "h2", "h3", "div", "p", "b", "table",
                 "tr", "td", "ol", "ul", "li", "span", "section", "figure", "figcaption", "i", "svg", "line", "text",
                 "polygon", "polyline", "footer"}


def _evil_view() -> ReportView:
    x = np.arange(10, dtype=float)
    v = Verdict(kind=EVIL, title=EVIL, severity="bad", evidence=[EVIL, EVIL], recommendation=EVIL, saving=EVIL,
                steps=(2, 4))
    figs = (Figure(EVIL, x, (Series(EVIL, x, 0), Series(EVIL, x[::-1].copy(), "rest")), EVIL, y_fmt="bytes",
                   stacked=True, hline=(5.0, EVIL)),
            Figure("Loss", x, (Series(EVIL, x, 1),), EVIL, legend=False))
    return ReportView(name=EVIL, path=EVIL, lead=EVIL, headline=((EVIL, EVIL),), actions=(v,),
                      alerts=(Alert(kind=EVIL, text=EVIL, step=3),), verdicts=(v,), on_gpu=True, price_per_hour=2.0,
                      generated_at=0.0, figures=figs, markers=(Marker(3.0, "oom", EVIL),))


class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs += attrs

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_every_value_is_escaped_in_the_page() -> None:
    page = html_page(_evil_view())
    parsed = _Page()
    parsed.feed(page)
    assert parsed.tags <= TEMPLATE_TAGS, parsed.tags - TEMPLATE_TAGS  # no <script>, no <img>
    assert not [a for a, _ in parsed.attrs if a.startswith("on") or a == "src"]
    assert ("data-kind", EVIL) in parsed.attrs  # an attribute value reads back whole, quotes and all
    text = "".join(parsed.text)
    # each value is shown as text: <title> and <h1>, path, lead, headline 2, action 3, alert 2, verdict 5 (its
    # kind is an attribute); figure 1: caption, legend 2, y title, bands 2, capacity, marker; figure 2: y title,
    # line, marker
    assert text.count(EVIL) == 1 + 1 + 1 + 1 + 2 + 3 + 2 + 5 + 8 + 3
    assert "49" not in text  # a value is never read as a template


def test_every_value_is_escaped_in_the_markdown() -> None:
    md = markdown_text(_evil_view())
    assert "<script" not in md and "<img" not in md
    assert "&lt;script>" in md and "&amp;amp;" in md and "{{ 7*7 }}" in md
    assert "# gpudash report: '\"&gt;" not in md  # a '>' is left alone: it opens nothing


def test_a_view_without_its_figures_is_no_page() -> None:
    """A Markdown view (figures not derived) would otherwise print "No steps recorded." for a run that has steps."""
    with pytest.raises(ValueError, match="figures"):
        html_page(dataclasses.replace(_evil_view(), figures=None))
    assert "No steps recorded." in html_page(dataclasses.replace(_evil_view(), figures=()))
