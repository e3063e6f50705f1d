"""The run page header's leak line: the run's leak fact (:func:`gpudash.analysis.leak.run_leak`) as one
line, what could be seen of its cause, and the stacks that grew between two snapshots where there are some."""

from __future__ import annotations

from typing import Any

from dash import html
from gpudash.analysis.leak import Leak, leak_text
from gpudash.units import human_bytes

__all__ = ["leak_line"]


def leak_line(leak: Leak | None) -> html.Div:
    """The line (hidden when the run has no leak)."""
    if leak is None:
        return html.Div(id="run-leak", style={"display": "none"})
    parts: list[Any] = [html.Strong("leak: "), html.Span(leak_text(leak), id="run-leak-text")]
    if leak.seen:
        parts.append(html.Div(leak.seen, className="muted"))
    if leak.frames:
        rows = [html.Li([html.Code(f.stack.split("\n", 1)[0]),
                         html.Span(f" +{human_bytes(f.delta_bytes)}", className="muted")])
                for f in leak.frames]
        steps = (leak.frames[0].before_step, leak.frames[0].after_step)
        parts += [html.Div(f"grown between the snapshots of steps {steps[0]} and {steps[1]}:", className="muted"),
                  html.Ul(rows, id="run-leak-frames")]
    return html.Div(parts, id="run-leak", className="run-leak note")
