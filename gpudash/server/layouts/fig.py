"""Figures as plain dicts: what ``dcc.Graph`` takes, without plotly.py's validation.

A run page has a dozen figures and thousands of points; ``go.Figure``
validates every property and every list element (tens of ms per trace, most
of the page's build time). :class:`Fig` is a ``dict`` with the few
``go.Figure``-style helpers the views use, and attribute access for reading
back (``fig.data[0].uid``, ``fig.layout.annotations``) in tests.

Figures keep plain lists while the server builds, reads and extends them;
:func:`wire` is applied when one leaves the server: its numeric x/y become
plotly typed arrays (``{"dtype": "f4", "bdata": base64}``), a quarter of the
JSON of a list of floats, float32 only where that moves no point by more than
a ten-thousandth of the trace's span (steps go as int32, wall-clock seconds
stay float64). The page's script turns them back into arrays before plotting
(:data:`gpudash.server.layouts.style.TYPED_JS`), so live ``extendData`` appends to
them as before.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

__all__ = ["AttrDict", "Fig", "decode_array", "encode_array", "wire"]

#: Trace keys sent as typed arrays, and the shortest list worth it (a spike marker stays a list).
WIRE_KEYS = ("x", "y")
WIRE_MIN = 16
#: float32 when it moves no value by more than this fraction of the values' span (far below a pixel).
F4_TOLERANCE = 1e-4
_I4_MIN, _I4_MAX = -(2**31), 2**31 - 1  # int32 (plain ints: importing this module reads nothing from numpy)


class AttrDict(dict):  # type: ignore[type-arg]
    """A dict whose keys read as attributes (missing keys read as None)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self.get(name)


class Fig(dict):  # type: ignore[type-arg]
    def __init__(self, layout: dict[str, Any] | None = None) -> None:
        super().__init__(data=[], layout=AttrDict(layout or {}))

    @property
    def data(self) -> list[AttrDict]:
        return self["data"]  # type: ignore[no-any-return]

    @property
    def layout(self) -> AttrDict:
        return self["layout"]  # type: ignore[no-any-return]

    def add_trace(self, trace: dict[str, Any]) -> None:
        self["data"].append(AttrDict(trace))

    def update_layout(self, items: dict[str, Any] | None = None, **kw: Any) -> None:
        for key, value in {**(items or {}), **kw}.items():
            old = self.layout.get(key)
            if isinstance(old, dict) and isinstance(value, dict):
                old.update(value)
            else:
                self.layout[key] = AttrDict(value) if isinstance(value, dict) else value

    def _axes(self, prefix: str, kw: dict[str, Any]) -> None:
        names = [k for k in self.layout if k.startswith(prefix) and k[len(prefix):].isdigit()]
        for name in [prefix, *names]:
            self.layout.setdefault(name, AttrDict()).update(kw)

    def update_xaxes(self, **kw: Any) -> None:
        self._axes("xaxis", kw)

    def update_yaxes(self, **kw: Any) -> None:
        self._axes("yaxis", kw)

    def add_annotation(self, **kw: Any) -> None:
        self.layout.setdefault("annotations", []).append(AttrDict(kw))

    def add_shape(self, **kw: Any) -> None:
        self.layout.setdefault("shapes", []).append(AttrDict(kw))

    def add_hline(self, y: float, *, color: str = "#444", dash: str = "solid", text: str = "") -> None:
        self.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=y, y1=y,
                       line={"color": color, "dash": dash, "width": 1})
        if text:
            self.add_annotation(xref="paper", x=0, yref="y", y=y, text=text, showarrow=False, xanchor="left",
                                yanchor="bottom", font={"size": 11, "color": color})

    def add_vline(self, x: float, *, color: str = "#444", dash: str = "solid", text: str = "") -> None:
        self.add_shape(type="line", xref="x", x0=x, x1=x, yref="paper", y0=0, y1=1,
                       line={"color": color, "dash": dash, "width": 1})
        if text:
            self.add_annotation(xref="x", x=x, yref="paper", y=1, text=text, showarrow=False, yanchor="bottom",
                                font={"size": 11, "color": color})


def encode_array(values: Any) -> Any:
    """``values`` as a plotly typed array (int32, float32 or float64), or unchanged when not all numbers."""
    if isinstance(values, dict) or not hasattr(values, "__len__") or len(values) < WIRE_MIN:
        return values
    try:
        a = np.asarray(values)
    except (ValueError, TypeError):
        return values
    if a.ndim != 1:
        return values
    if a.dtype.kind in "iu":
        if len(a) and (a.min() < _I4_MIN or a.max() > _I4_MAX):
            a, dtype = a.astype("<f8"), "f8"
        else:
            a, dtype = a.astype("<i4"), "i4"
    elif a.dtype.kind == "f":
        a = a.astype("<f8")
        f4 = a.astype("<f4")
        finite = np.isfinite(a)
        ok = bool(np.array_equal(np.isfinite(f4), finite))
        if ok and finite.any():
            v = a[finite]
            span = float(v.max() - v.min()) or abs(float(v.max()))
            ok = float(np.max(np.abs(f4[finite].astype("<f8") - v))) <= F4_TOLERANCE * span
        a, dtype = (f4, "f4") if ok else (a, "f8")
    else:  # None (a gap), text, booleans: a plain list
        return values
    return {"dtype": dtype, "bdata": base64.b64encode(a.tobytes()).decode("ascii")}


def decode_array(spec: Any) -> Any:
    """The values of a typed array (what plotly.js and the page's script read); anything else unchanged."""
    if not (isinstance(spec, dict) and "bdata" in spec and "dtype" in spec):
        return spec
    return np.frombuffer(base64.b64decode(spec["bdata"]), dtype="<" + str(spec["dtype"])).tolist()


def wire(fig: Any) -> Any:
    """The figure as it is sent: a copy whose numeric x/y are typed arrays (the figure is not changed)."""
    if not isinstance(fig, dict) or not isinstance(fig.get("data"), list):
        return fig
    data = [{k: encode_array(v) if k in WIRE_KEYS else v for k, v in t.items()} if isinstance(t, dict) else t
            for t in fig["data"]]
    return {**fig, "data": data}
