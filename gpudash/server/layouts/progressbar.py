"""The run's progress where its total steps are known: the run page header's bar (kept moving by the live
tick) and the runs list's cell. Both render :class:`gpudash.analysis.progress.Progress` from the run's facts."""

from __future__ import annotations

from typing import Any

import dash
from dash import Input, Output, State, html
from dash.exceptions import PreventUpdate
from gpudash.analysis.progress import Progress, eta_text, progress_text
from gpudash.server.layouts.inputs import page_run

__all__ = ["progress_bar", "progress_cell", "progress_refresh", "register_progress_callbacks"]


def progress_bar(p: Progress | None) -> list[Any]:
    """The header's bar and ``step 1,234 of 5,000 · ETA 3 min`` (nothing when the total is unknown)."""
    if p is None:
        return []
    pct = f"{100 * p.fraction:.1f}%"
    return [html.Div(html.Div(className="progress-fill", style={"width": pct}), className="progress-track",
                     title=f"{pct} done"),
            html.Span(progress_text(p), id="progress-text", className="progress-text")]


def progress_cell(p: Progress | None, status: str | None) -> str:
    """The runs list's cell: ``42 % · ETA 3 min`` for a live run, ``100 %`` for a finished one, else empty."""
    if p is None:
        return ""
    eta = eta_text(p)
    return f"{100 * p.fraction:.0f} %" + (f" · {eta}" if eta and status == "live" else "")


def progress_refresh(page: Any, *, facts_of: Any) -> list[Any]:
    """The header's progress bar again, after a live tick moved the step and once when the run ends (the ETA
    goes); ``facts_of(run_id)``: the run's facts (the one run cache), None when it cannot be read."""
    if not page:
        raise PreventUpdate
    facts = facts_of(page_run(page)[0])
    if facts is None:
        raise PreventUpdate
    return progress_bar(facts.progress)


def register_progress_callbacks(app: dash.Dash, facts_of: Any) -> None:
    @app.callback(Output("run-progress", "children"), Input("last-step", "children"),
                  Input("run-status", "children"), State("page-run", "data"), prevent_initial_call=True)
    def progress_update(_step: Any, _status: Any, page: Any) -> list[Any]:
        return progress_refresh(page, facts_of=facts_of)
