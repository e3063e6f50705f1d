"""The view's state in the address: replay cursor, zoomed step range, smoothing and the step graphs' x axis
(``x=step|relative|wall``; the zoom stays in steps whatever the axis) read from and written into the page's
query string (so a copied link reopens the same view), and the x range a zoom sent."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlencode

from gpudash.server.layouts.inputs import BadInput, as_float, as_int
from gpudash.server.layouts.series import SMOOTHING

__all__ = ["XMODES", "ZOOM_JS", "zoom_store", "mode_of", "smoothing_of", "view_params", "view_search", "with_xmode", "relayout_range", "xmode_of", "zoom_range"]


#: The step graphs' x axis choices: (value, label) (drawn by :mod:`gpudash.server.layouts.xaxis`).
XMODES = (("step", "step"), ("relative", "relative time"), ("wall", "wall time"))


def mode_of(value: Any) -> str:
    """One of the x axis modes (anything else: ``step``, as a link with a mistyped ``x=`` opens)."""
    return value if isinstance(value, str) and value in dict(XMODES) else "step"


def smoothing_of(value: Any) -> float:
    """One of the smoothing control's choices (anything else: off)."""
    try:
        v = as_float(value, "smoothing") if value is not None else 0.0
    except BadInput:
        return 0.0
    return v if v in SMOOTHING else 0.0


def view_params(query: dict[str, list[str]]) -> tuple[int | None, tuple[float, float] | None, float]:
    """The replay cursor, the step range zoomed to and the smoothing, from the address
    (``?cursor=N&x0=A&x1=B&smooth=0.9``); a value that is not one is ignored (the page opens as if it were absent)."""
    cursor: int | None = None
    xrange: tuple[float, float] | None = None
    try:
        cursor = as_int(query["cursor"][0], "cursor", lo=0) if "cursor" in query else None
    except BadInput:
        cursor = None
    try:
        if "x0" in query and "x1" in query:
            a, b = as_float(query["x0"][0], "x0"), as_float(query["x1"][0], "x1")
            xrange = (a, b) if a < b else None
    except BadInput:
        xrange = None
    return cursor, xrange, smoothing_of(query.get("smooth", [None])[0])


def xmode_of(query: dict[str, list[str]]) -> str:
    """The x axis of the step graphs from the address (``?x=relative``); step when absent or not a mode."""
    return mode_of(query.get("x", ["step"])[0])


def with_xmode(search: str, mode: str) -> str:
    """``search`` with ``x=mode`` written in (step, the default: removed)."""
    query = {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items() if v}
    if mode_of(mode) == "step":
        query.pop("x", None)
    else:
        query["x"] = mode_of(mode)
    return "?" + urlencode(query) if query else ""


def view_search(search: str, cursor: int | None, zoom: tuple[float, float] | bool | None, smooth: float = 0.0) -> str:
    """``search`` with the cursor (None: removed), the zoom (a range; True: reset; None: unchanged) and the
    smoothing (0: removed) written in."""
    query = {k: v[0] for k, v in parse_qs((search or "").lstrip("?")).items() if v}
    if smooth:
        query["smooth"] = f"{smooth:g}"
    else:
        query.pop("smooth", None)
    if cursor is None:
        query.pop("cursor", None)
    else:
        query["cursor"] = str(cursor)
    if zoom is True:
        query.pop("x0", None)
        query.pop("x1", None)
    elif isinstance(zoom, tuple):
        query["x0"], query["x1"] = (f"{v:.6g}" for v in zoom)
    return "?" + urlencode(query) if query else ""


def relayout_range(relayout: dict[str, Any] | None) -> tuple[Any, Any] | bool | None:
    """The x range a ``relayoutData`` payload zoomed to, as sent (numbers, or dates on a date axis); True for
    a reset; None when x did not change (``{"autosize": true}``, sent by every chart when first drawn, is not
    a zoom)."""
    if not relayout:
        return None
    if not isinstance(relayout, dict):
        raise BadInput("relayoutData must be an object")
    if relayout.get("xaxis.autorange"):  # a reset ({"autosize": true} alone is a resize, not a zoom)
        return True
    if "xaxis.range[0]" in relayout and "xaxis.range[1]" in relayout:
        return relayout["xaxis.range[0]"], relayout["xaxis.range[1]"]
    rng = relayout.get("xaxis.range")
    if isinstance(rng, list) and len(rng) == 2:
        return rng[0], rng[1]
    return None


#: A chart's ``relayoutData`` to its zoom store (:func:`zoom_store`), in the browser: only an x change (a zoom, a
#: pan, a reset: the payloads :func:`relayout_range` reads) goes on to the server. Dash drops the answer of a
#: callback whose input changed while it was being answered, and every chart sends ``{"autosize": true}``
#: about 100 ms after its first draw (later on a busy page) and on each resize: passed on, that resize
#: superseded a zoom made just before it and the zoomed figure never came.
ZOOM_JS = """function (relayout) {
  var r = relayout || {};
  if (r['xaxis.autorange'] || ('xaxis.range[0]' in r && 'xaxis.range[1]' in r)
      || (Array.isArray(r['xaxis.range']) && r['xaxis.range'].length === 2)) { return r; }
  return window.dash_clientside.no_update;
}"""


def zoom_store(graph_id: str) -> str:
    """The id of the store a chart's zooms reach the server through (:data:`ZOOM_JS`)."""
    return f"{graph_id}-zoom"


def zoom_range(relayout: dict[str, Any] | None) -> tuple[float, float] | bool | None:
    """:func:`relayout_range` on a step axis: the range as numbers."""
    rng = relayout_range(relayout)
    if isinstance(rng, tuple):
        return as_float(rng[0], "x range"), as_float(rng[1], "x range")
    return rng
