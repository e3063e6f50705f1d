"""The post-mortem report's renderers: HTML (Jinja2 templates, inline SVG charts) and Markdown.

They format :func:`gpudash.analysis.report.report_view`, the facts the report shows; they decide
nothing about a run. May import ``analysis`` and ``store``, never torch, dash or plotly.
"""

from __future__ import annotations

from gpudash.report.markdown import markdown_text, render_markdown
from gpudash.report.page import html_page, render_html
from gpudash.report.svgchart import svg_chart
from gpudash.report.templating import md_text

__all__ = ["html_page", "markdown_text", "md_text", "render_html", "render_markdown", "svg_chart"]
