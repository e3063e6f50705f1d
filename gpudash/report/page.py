"""The report as one self-contained HTML page, from ``templates/report.html.j2``.

The page opens offline: CSS is inline and the figures are SVG drawn from the run's numbers
(:mod:`gpudash.report.svgchart`; no JavaScript, no CDN, no external references). Every value
comes from :func:`gpudash.analysis.report.report_view` and is autoescaped by the template.
"""

from __future__ import annotations

from dataclasses import dataclass

from markupsafe import Markup

from gpudash.analysis.cost import DEFAULT_PRICE_PER_HOUR
from gpudash.analysis.report import Figure, Marker, ReportView, report_view
from gpudash.analysis.verdict import Verdict
from gpudash.report.svgchart import svg_chart
from gpudash.report.templating import html_env
from gpudash.store.run import Run

__all__ = ["html_page", "render_html"]

SEVERITY_COLOR = {"bad": "#c62828", "warn": "#ef6c00", "ok": "#2e7d32"}
SEVERITY_LABEL = {"bad": "problem", "warn": "warning", "ok": "ok"}
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
#: Colours of the named tones of :class:`gpudash.analysis.report.Series`.
TONES = {"rest": "#bab0ac", "frozen": "#aec7e8"}
MARKER_COLOR = {"loss-spike": "#ef6c00", "oom": "#c62828", "precision_fallback": "#6a1b9a", "nan": "#ad1457",
                "alert": "#b71c1c"}


@dataclass(frozen=True)
class _Drawn:
    title: str
    legend: tuple[tuple[str, str], ...]
    svg: Markup


def _color(tone: int | str) -> str:
    return PALETTE[tone % len(PALETTE)] if isinstance(tone, int) else TONES[tone]


def _draw(fig: Figure, markers: tuple[Marker, ...]) -> _Drawn:
    series = [(s.label, s.values, _color(s.tone)) for s in fig.series]
    svg = svg_chart(fig.x, series, stacked=fig.stacked, markers=[(m.step, MARKER_COLOR[m.kind], m.label)
                                                                 for m in markers],
                    hline=fig.hline, y_fmt=fig.y_fmt, y_title=fig.y_title, y_zero=fig.y_zero)
    return _Drawn(fig.title, tuple((s[0], s[2]) for s in series) if fig.legend else (), svg)


def html_page(view: ReportView) -> str:
    """The page of a :class:`ReportView` made with its figures."""
    if view.figures is None:
        raise ValueError("html_page needs a view with its figures: report_view(run, figures=True)")
    return html_env().get_template("report.html.j2").render(
        view=view, figures=[_draw(f, view.markers) for f in view.figures],
        severity_color=SEVERITY_COLOR, severity_label=SEVERITY_LABEL)


def render_html(run: Run, verdicts: list[Verdict] | None = None,
                price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> str:
    """The whole report of ``run`` as one HTML string with no external references."""
    return html_page(report_view(run, verdicts, price_per_hour))
