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

__all__ = ["register_runs_callbacks"]


def register_runs_callbacks(app: dash.Dash, runs_dir: Path) -> None:
    @app.callback(Output("runs-page-no", "data"), Input("runs-prev", "n_clicks"), Input("runs-next", "n_clicks"),
                  Input("runs-search", "value"), Input("runs-status", "value"), State("runs-page-no", "data"),
                  State("runs-shown", "data"), prevent_initial_call=True)
    def runs_page_no(_prev: Any, _next: Any, _query: Any, _status: Any, page: Any, shown: Any) -> int:
        # newer / older pages; a new search or status filter starts again at the newest runs
        page = as_int(page if page is not None else 0, "page", lo=0, hi=10**6)
        trig = dash.ctx.triggered_id
        if trig == "runs-prev":
            return max(0, page - 1)
        if trig == "runs-next":
            pages = shown[1] if isinstance(shown, list) and len(shown) > 1 and isinstance(shown[1], int) else page + 2
            return min(page + 1, max(0, pages - 1))  # the pager's count as last drawn; list_page clamps too
        return 0

    @app.callback(Output("runs-table-box", "children"), Output("runs-count", "children"), Output("runs-shown", "data"),
                  Output("runs-page-label", "children"), Output("runs-prev", "disabled"), Output("runs-next", "disabled"),
                  Input("runs-interval", "n_intervals"), Input("runs-search", "value"), Input("runs-status", "value"),
                  Input("runs-page-no", "data"),
                  State({"type": "compare-pick", "run": ALL}, "value"), State("runs-shown", "data"),
                  prevent_initial_call=True)
    def runs_refresh(_n: int | None, query: str | None, status: str | None, page: Any, picks: list[Any] | None,
                     shown: Any) -> Any:
        # the runs list is live: new runs appear, steps / status / duration move; ticked compare boxes stay
        # ticked. Only the page shown is summarised (runs.list_page); unchanged runs come from the cache.
        if not isinstance(query, str | None) or len(query or "") > 500:
            raise BadInput("the search must be a short string")
        if status not in (None, *(v for v, _ in runs.STATUS_FILTERS)):
            raise BadInput("unknown status filter")
        if not isinstance(picks, list | None) or not all(isinstance(v, list | None) for v in picks or []):
            raise BadInput("compare picks must be lists of run ids")
        page = as_int(page if page is not None else 0, "page", lo=0, hi=10**6)
        listing = runs.list_page(runs_dir, query, status, page)
        sig = runs.shown_signature(listing)
        if dash.ctx.triggered_id == "runs-interval" and sig == shown:
            raise PreventUpdate
        picked = {v for vals in picks or [] for v in (vals or []) if isinstance(v, str)}
        return (runs.runs_table(runs_dir, listing.rows, picked, listing.total),
                runs.runs_count(runs_dir, listing.matching, listing.total), sig, runs.page_label(listing),
                listing.page == 0, listing.page >= listing.pages - 1)

    @app.callback(Output("url", "search", allow_duplicate=True), Input("compare-baseline", "value"),
                  State("url", "search"), prevent_initial_call=True)
    def compare_baseline(baseline: Any, search: str | None) -> str:
        # the baseline in the address: the page redraws its table against it, and a link keeps it
        baseline = as_int(baseline, "baseline", lo=0, hi=64)
        if not isinstance(search, str | None):
            raise BadInput("search must be a string")
        query = {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items() if v}
        query["base"] = str(baseline)
        out = "?" + urlencode(query)
        if out == search:
            raise PreventUpdate
        return out

    @app.callback(Output("compare-link", "href"), Input({"type": "compare-pick", "run": ALL}, "value"))
    def compare_href(values: list[list[str]]) -> str:
        if not isinstance(values, list) or not all(isinstance(v, list | None) for v in values):
            raise BadInput("compare picks must be lists of run ids")
        picked = [v for vals in values for v in (vals or []) if isinstance(v, str)]
        return href("/compare?" + urlencode({"runs": ",".join(picked)}) if picked else "/compare")
