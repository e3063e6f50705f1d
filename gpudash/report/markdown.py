"""The report as Markdown for a terminal, from ``templates/report.md.j2``: the same sections as the
page but the figures; every value passes through :func:`gpudash.report.templating.md_text`."""

from __future__ import annotations

from gpudash.analysis.cost import DEFAULT_PRICE_PER_HOUR
from gpudash.analysis.report import ReportView, report_view
from gpudash.analysis.verdict import Verdict
from gpudash.report.templating import markdown_env
from gpudash.store.run import Run

__all__ = ["markdown_text", "render_markdown"]

SEVERITY_MARK = {"bad": "[PROBLEM]", "warn": "[WARNING]", "ok": "[ok]"}


def markdown_text(view: ReportView) -> str:
    """The Markdown of a :class:`ReportView`."""
    return markdown_env().get_template("report.md.j2").render(view=view, severity_mark=SEVERITY_MARK)


def render_markdown(run: Run, verdicts: list[Verdict] | None = None,
                    price_per_hour: float = DEFAULT_PRICE_PER_HOUR) -> str:
    """A readable terminal summary of ``run`` (Markdown)."""
    return markdown_text(report_view(run, verdicts, price_per_hour, figures=False))
