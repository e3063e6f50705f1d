"""Callbacks of the runs page and the compare page: the live, paged runs list with search and status
filter, the compare link, and the compare baseline kept in the address."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import dash
from dash import ALL, Input, Output, State
from dash.exceptions import PreventUpdate
from gpudash.server.layouts import runs
from gpudash.server.layouts.inputs import BadInput, as_int
from gpudash.server.layouts.links import href

__all__ = ["compare_baseline", "compare_href", "register_runs_callbacks", "runs_page_no", "runs_refresh"]


def runs_page_no(page: Any, shown: Any, *, trigger: Any) -> int:
    """The page of the runs list: newer / older (``trigger``: ``runs-prev`` / ``runs-next``); a new search or
    status filter starts again at the newest runs. ``shown``: the ``runs-shown`` store (the pager as drawn)."""
    page = as_int(page if page is not None else 0, "page", lo=0, hi=10**6)
    if trigger == "runs-prev":
        return max(0, page - 1)
    if trigger == "runs-next":
        pages = shown[1] if isinstance(shown, list) and len(shown) > 1 and isinstance(shown[1], int) else page + 2
        return min(page + 1, max(0, pages - 1))  # the pager's count as last drawn; list_page clamps too
    return 0


def runs_refresh(query: Any, status: Any, page: Any, picks: Any, shown: Any, *, trigger: Any,
                 runs_dir: Path) -> tuple[Any, ...]:
    """The runs list is live: new runs appear, steps / status / duration move; ticked compare boxes stay
    ticked. Only the page shown is summarised (runs.list_page); unchanged runs come from the cache. A tick
    (``trigger`` ``runs-interval``) that would draw what ``shown`` says is drawn changes nothing."""
    if not isinstance(query, str | None) or len(query or "") > 500:
        raise BadInput("the search must be a short string")
    if status not in (None, *(v for v, _ in runs.STATUS_FILTERS)):
        raise BadInput("unknown status filter")
    if not isinstance(picks, list | None) or not all(isinstance(v, list | None) for v in picks or []):
        raise BadInput("compare picks must be lists of run ids")
    page = as_int(page if page is not None else 0, "page", lo=0, hi=10**6)
    listing = runs.list_page(runs_dir, query, status, page)
    sig = runs.shown_signature(listing)
    if trigger == "runs-interval" and sig == shown:
        raise PreventUpdate
    picked = {v for vals in picks or [] for v in (vals or []) if isinstance(v, str)}
    return (runs.runs_table(runs_dir, listing.rows, picked, listing.total),
            runs.runs_count(runs_dir, listing.matching, listing.total), sig, runs.page_label(listing),
            listing.page == 0, listing.page >= listing.pages - 1)


def compare_baseline(baseline: Any, search: Any) -> str:
    """The compare page's baseline in the address: the page redraws its table against it, and a link keeps it."""
    baseline = as_int(baseline, "baseline", lo=0, hi=64)
    if not isinstance(search, str | None):
        raise BadInput("search must be a string")
    query = {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items() if v}
    query["base"] = str(baseline)
    out = "?" + urlencode(query)
    if out == search:
        raise PreventUpdate
    return out


def compare_href(values: Any) -> str:
    """The compare link for the runs ticked (one checklist value per run)."""
    if not isinstance(values, list) or not all(isinstance(v, list | None) for v in values):
        raise BadInput("compare picks must be lists of run ids")
    picked = [v for vals in values for v in (vals or []) if isinstance(v, str)]
    return href("/compare?" + urlencode({"runs": ",".join(picked)}) if picked else "/compare")


def register_runs_callbacks(app: dash.Dash, runs_dir: Path) -> None:
    """The runs list's pager and live table, the compare link and the compare page's baseline."""

    @app.callback(Output("runs-page-no", "data"), Input("runs-prev", "n_clicks"), Input("runs-next", "n_clicks"),
                  Input("runs-search", "value"), Input("runs-status", "value"), State("runs-page-no", "data"),
                  State("runs-shown", "data"), prevent_initial_call=True)
    def pager(_prev: Any, _next: Any, _query: Any, _status: Any, page: Any, shown: Any) -> int:
        return runs_page_no(page, shown, trigger=dash.ctx.triggered_id)

    @app.callback(Output("runs-table-box", "children"), Output("runs-count", "children"), Output("runs-shown", "data"),
                  Output("runs-page-label", "children"), Output("runs-prev", "disabled"), Output("runs-next", "disabled"),
                  Input("runs-interval", "n_intervals"), Input("runs-search", "value"), Input("runs-status", "value"),
                  Input("runs-page-no", "data"),
                  State({"type": "compare-pick", "run": ALL}, "value"), State("runs-shown", "data"),
                  prevent_initial_call=True)
    def table(_n: Any, query: Any, status: Any, page: Any, picks: Any, shown: Any) -> tuple[Any, ...]:
        return runs_refresh(query, status, page, picks, shown, trigger=dash.ctx.triggered_id, runs_dir=runs_dir)

    @app.callback(Output("url", "search", allow_duplicate=True), Input("compare-baseline", "value"),
                  State("url", "search"), prevent_initial_call=True)
    def baseline(value: Any, search: Any) -> str:
        return compare_baseline(value, search)

    @app.callback(Output("compare-link", "href"), Input({"type": "compare-pick", "run": ALL}, "value"))
    def link(values: Any) -> str:
        return compare_href(values)
