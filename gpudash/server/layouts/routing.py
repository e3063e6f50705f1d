"""The page router: the address (path and query) to the page it shows, the runs list, a run, the compare
page or "no such page".

:func:`route_page` is the routing callback's body, a pure function of the address and the page last drawn
(whether the path changed passed in, not read from Dash's context)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import dash
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from gpudash.errors import RunError
from gpudash.server.layouts import compare, runs
from gpudash.server.layouts.common import note
from gpudash.server.layouts.data import load_view
from gpudash.server.layouts.inputs import BadInput, as_int, rank_of
from gpudash.server.layouts.lazy import wire_tree
from gpudash.server.layouts.links import href
from gpudash.server.layouts.pages import build_run_page, facts_for
from gpudash.server.layouts.readers import ReaderCache
from gpudash.server.layouts.viewstate import view_params, xmode_of
from gpudash.store.bounded import damage
from gpudash.store.runid import InvalidRunId

__all__ = ["page_for", "register_route_callbacks", "route_page", "shown_key"]

#: Runs the compare page overlays at most.
COMPARE_MAX = 8


def _not_found(text: str, id_: str = "not-found") -> html.Div:
    return html.Div([dcc.Link("← all runs", href=href("/")), note(text)], id=id_)


def _run_page(run_id: str, query: dict[str, list[str]], runs_dir: Path, readers: ReaderCache) -> Any:
    try:
        reader, lock = readers.get(run_id)
    except (InvalidRunId, RunError):
        return _not_found(f"no run named {run_id!r} in {runs_dir}")
    try:  # a rank typed into the address: the first rank when it is not one
        rank = rank_of(query.get("rank", ["0"])[0])
    except BadInput:
        rank = 0
    cursor, xrange, smooth = view_params(query)
    try:
        with lock:
            return build_run_page(run_id, reader, rank, cursor=cursor, xrange=xrange, smooth=smooth,
                                  xmode=xmode_of(query))
    except Exception as exc:  # noqa: BLE001 - someone else's damaged run: one line, the other runs still served
        return _not_found(f"{run_id}: damaged, the page cannot be drawn ({damage(exc)})", "run-damaged")


def _compare_page(query: dict[str, list[str]], readers: ReaderCache) -> Any:
    wanted = [r for r in ",".join(query.get("runs", [])).split(",") if r]
    views, missing, facts = [], [], []
    for run_id in wanted[:COMPARE_MAX]:
        try:
            reader, lock = readers.get(run_id)
        except (InvalidRunId, RunError):
            missing.append(run_id)
            continue
        with lock:
            view = load_view(reader)
        views.append((str(view.meta.get("name") or run_id), view))
        facts.append(facts_for(reader.path))
    try:
        baseline = as_int(query.get("base", ["0"])[0], "baseline", lo=0, hi=len(views))
    except BadInput:
        baseline = 0
    return compare.compare_page(views, missing, facts, baseline)


def page_for(pathname: str, search: str, runs_dir: Path, readers: ReaderCache) -> Any:
    """The page at ``pathname`` (without the proxy prefix) for the query ``search``."""
    if not isinstance(pathname, str) or not isinstance(search, str):
        raise BadInput("the page address must be a string")
    if pathname in ("", "/"):
        listing = runs.list_page(runs_dir)
        return runs.runs_page(runs_dir, listing.rows, listing)
    if pathname.startswith("/run/"):
        return _run_page(pathname[len("/run/"):].strip("/"), parse_qs(search.lstrip("?")), runs_dir, readers)
    if pathname == "/compare":
        return _compare_page(parse_qs(search.lstrip("?")), readers)
    return _not_found(f"no page {pathname}")


def shown_key(pathname: str, query: dict[str, list[str]]) -> dict[str, Any]:
    """What the ``shown-page`` store keeps of the page drawn: its path and rank, and (not for a run page,
    whose own address changes with its cursor and zoom) its query without the theme."""
    here: dict[str, Any] = {"path": pathname, "rank": query.get("rank", ["0"])[0]}
    if not pathname.startswith("/run/"):  # other pages redraw for their query, not for the theme's
        here["query"] = [[k, v] for k, v in sorted(query.items()) if k != "theme"]  # as the store echoes it
    return here


def route_page(pathname: Any, search: Any, shown: Any, *, path_changed: bool, prefix: str, runs_dir: Path,
               readers: ReaderCache) -> tuple[Any, dict[str, Any]]:
    """The page's children (figures as typed arrays) and the new ``shown-page``. Inputs: the address's path
    and search, the ``shown-page`` store; ``path_changed``: the path fired (not only the search); ``prefix``:
    the proxy path the app is served under ("" when none). The view's own address changes (cursor, zoom)
    keep the page that wrote them."""
    pathname, search = pathname or "/", search or ""
    if not isinstance(pathname, str) or not isinstance(search, str):
        raise BadInput("the page address must be a string")
    if prefix and (pathname + "/").startswith(prefix + "/"):
        pathname = pathname[len(prefix):] or "/"
    here = shown_key(pathname, parse_qs(search.lstrip("?")))
    if not path_changed and shown == here:
        raise PreventUpdate
    return wire_tree(page_for(pathname, search, runs_dir, readers)), here


def register_route_callbacks(app: dash.Dash, runs_dir: Path, readers: ReaderCache) -> None:
    """The router (:func:`route_page`) under the app's proxy prefix."""
    prefix = str(app.config.requests_pathname_prefix).rstrip("/")  # a proxy's path (notebook), else ""

    @app.callback(Output("page", "children"), Output("shown-page", "data"), Input("url", "pathname"),
                  Input("url", "search"), State("shown-page", "data"))
    def route(pathname: Any, search: Any, shown: Any) -> Any:
        return route_page(pathname, search, shown, path_changed="url.pathname" in dash.ctx.triggered_prop_ids,
                          prefix=prefix, runs_dir=runs_dir, readers=readers)
