"""Graphs below the fold, drawn when they come into view.

The run page comes with its first screen's charts (:data:`EAGER`: memory, step
time and the loss with its spikes); the other live charts (:data:`LAZY`) come
as empty frames of the same size, and the tables (events, hot spots: dash_table's
scripts) as a line saying how many rows they hold, their rows in a store beside. A script in the page watches them
(``IntersectionObserver``): when one is scrolled to, or its folded section is
opened, its id goes into the ``lazy-seen`` store and :func:`fill` builds it (a table is built from its rows)
from the run as it is now, with the cursor, zoom, smoothing and rank the page
shows (the address's zoom included), through the same :func:`page_graph` the
first screen uses (:mod:`gpudash.server.layouts.run_page`). The live tick appends only to charts it has drawn: a chart
filled while a run is live is rebuilt once by the tick, then extended.

:func:`wire_tree` is where the page's figures leave the server: their numeric
arrays go as typed arrays (:func:`gpudash.server.layouts.fig.wire`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import dash
from dash import Input, Output, State, dcc, no_update
from dash.exceptions import PreventUpdate
from gpudash.server.layouts.fig import Fig, wire
from gpudash.server.layouts.inputs import BadInput, as_int, page_run
from gpudash.server.layouts.run_page import EAGER, LAZY, PLACEHOLDER, TABLES, build_table, page_graph, placeholder

__all__ = ["EAGER", "LAZY", "OBSERVE_JS", "PLACEHOLDER", "fill", "lazy_outputs", "page_graph", "placeholder", "register_lazy_callbacks",
           "wire_tree"]  # EAGER, LAZY, PLACEHOLDER, page_graph and placeholder live in run_page (the page builds them)

#: Runs when the run page mounts and after each fill: watches the charts not drawn yet and names those in
#: view (or within 300 px of it) in ``lazy-seen``. A chart in a folded section has no box, so it is named
#: when the section is opened.
OBSERVE_JS = """function (drawn) {
  var want = LAZY_IDS.filter(function (id) { return (drawn || []).indexOf(id) < 0; });
  if (window.__gpudashLazy) { window.__gpudashLazy.disconnect(); window.__gpudashLazy = null; }
  if (!want.length) { return window.dash_clientside.no_update; }
  var seen = [];
  function tell() { window.dash_clientside.set_props('lazy-seen', {data: seen.slice()}); }
  if (!window.IntersectionObserver) { seen = want; setTimeout(tell, 0); return window.dash_clientside.no_update; }
  var obs = new IntersectionObserver(function (entries) {
    var added = false;
    entries.forEach(function (e) {
      if (e.isIntersecting && seen.indexOf(e.target.id) < 0) {
        seen.push(e.target.id); obs.unobserve(e.target); added = true;
      }
    });
    if (added) { tell(); }
  }, {rootMargin: '300px 0px'});
  window.__gpudashLazy = obs;
  var tries = 0;
  (function attach() {  // once its empty frame and the first screen's charts are drawn (the page has its height)
    var first = EAGER_IDS.every(function (id) {
      var el = document.getElementById(id);
      return !el || el.querySelector('.main-svg') || !el.getClientRects().length;  // absent or folded away
    });
    if (!first) { if (tries++ < 600) { setTimeout(attach, 100); } return; }
    var left = want.filter(function (id) {
      var el = document.getElementById(id);
      var ready = el && (TABLE_BOXES.indexOf(id) >= 0 || el.querySelector('.main-svg'));
      if (ready) { obs.observe(el); }
      return !ready;
    });
    want = left;
    if (left.length && tries++ < 600) { setTimeout(attach, 100); }
  })();
  return window.dash_clientside.no_update;
}""".replace("LAZY_IDS", repr([*LAZY, *(box for box, _ in TABLES)])).replace(
    "TABLE_BOXES", repr([box for box, _ in TABLES])).replace("EAGER_IDS", repr(list(EAGER)))


def wire_tree(node: Any) -> Any:
    """Each graph of a page about to be sent gets its figure as sent (typed arrays); the figures built are
    not changed (each graph holds a copy)."""
    figure = getattr(node, "figure", None)
    if isinstance(node, dcc.Graph) and isinstance(figure, dict):
        node.figure = wire(figure)  # type: ignore[attr-defined]
    children = getattr(node, "children", None)
    for child in children if isinstance(children, list | tuple) else [children]:
        if child is not None and not isinstance(child, str | int | float):
            wire_tree(child)
    return node


def fill(readers: Any, wanted: list[str], page: Any, search: str, cursor: int | None, follow: bool,
         smooth: float) -> dict[str, Fig]:
    """The lazy charts in ``wanted``, drawn from the run as it is now, as the page shows it."""
    from gpudash.server.layouts.data import load_view
    from gpudash.server.layouts.pages import facts_for, known_tables, range_view
    from gpudash.server.layouts.viewstate import view_params, xmode_of
    from gpudash.server.layouts.xaxis import XAxis, x_origin

    run_id, rank = page_run(page)
    reader, lock = readers.get_or_skip(run_id)
    query = parse_qs(search.lstrip("?"))
    _, xrange, _ = view_params(query)
    xmode = xmode_of(query)
    facts = facts_for(reader.path)
    spikes = list(facts.loss_spike_steps) if facts is not None else None
    with lock:
        view = load_view(reader, known=known_tables(reader.path))
        zoomed = range_view(reader, view, xrange[0], xrange[1]) if xrange is not None else view
    if rank not in view.ranks:
        rank = view.ranks[0]
    at = None if follow else cursor
    x = XAxis(xmode, x_origin(xmode, view.full.get("steps", view.frame("steps"))))  # as build_run_page's
    return {g: page_graph(g, view, zoomed, rank, at, xrange, spikes, smooth, x)[0] for g in wanted}


def lazy_outputs(seen: Any, drawn: Any, page: Any, search: Any, cursor: Any, follow: Any, smooth: Any,
                 table_rows: tuple[Any, ...], *, readers: Any) -> list[Any]:
    """The charts and tables the page has scrolled to (``lazy-seen``) and not drawn yet (``lazy-drawn``), drawn as
    the page shows the run (address, cursor, smoothing), to :data:`LAZY`'s figures, the tables' boxes and the new
    ``lazy-drawn``; ``table_rows``: the rows each table box has."""
    from gpudash.server.layouts.viewstate import smoothing_of

    boxes = [box for box, _ in TABLES]
    if not isinstance(seen, list | None) or not isinstance(drawn, list | None) \
            or not isinstance(search, str | None) or not isinstance(follow, dict | None):
        raise BadInput("lazy-seen and lazy-drawn must be lists, the search a string, cursor-follow an object")
    if not all(isinstance(r, list | None) and all(isinstance(x, dict) for x in r or []) for r in table_rows):
        raise BadInput("table rows must be lists of objects")
    lazy = [*LAZY, *boxes]
    done = [g for g in lazy if g in (drawn or [])]
    wanted = [g for g in lazy if g in (seen or []) and g not in done]
    if not wanted or not page:
        raise PreventUpdate
    graphs = [g for g in wanted if g in LAZY]
    figs = fill(readers, graphs, page, search or "", None if cursor is None else as_int(cursor, "cursor"),
                bool((follow or {}).get("follow")), smoothing_of(smooth)) if graphs else {}
    tables = {box: build_table(box, rows or []) for box, rows in zip(boxes, table_rows, strict=True)
              if box in wanted}
    return [*(wire(figs[g]) if g in figs else no_update for g in LAZY),
            *(no_update if tables.get(box) is None else tables[box] for box in boxes),
            [g for g in (drawn or []) if g not in lazy] + done + wanted]


def register_lazy_callbacks(app: dash.Dash, readers: Any) -> None:
    app.clientside_callback(OBSERVE_JS, Output("lazy-seen", "data"), Input("lazy-drawn", "data"))

    @app.callback([*(Output(g, "figure", allow_duplicate=True) for g in LAZY),
                   *(Output(box, "children") for box, _ in TABLES), Output("lazy-drawn", "data")],
                  Input("lazy-seen", "data"), State("lazy-drawn", "data"), State("page-run", "data"),
                  State("url", "search"), State("cursor-slider", "value"), State("cursor-follow", "data"),
                  State("smoothing", "value"), *(State(rows, "data") for _, rows in TABLES),
                  prevent_initial_call=True)
    def draw_lazy(seen: Any, drawn: Any, page: Any, search: Any, cursor: Any, follow: Any, smooth: Any,
                  *table_rows: Any) -> list[Any]:
        return lazy_outputs(seen, drawn, page, search, cursor, follow, smooth, table_rows, readers=readers)
