"""Figures as plain dicts: what ``dcc.Graph`` takes, without plotly.py's validation.

A run page has a dozen figures and thousands of points; ``go.Figure``
validates every property and every list element (tens of ms per trace, most
of the page's build time). :class:`Fig` is a ``dict`` with the few
``go.Figure``-style helpers the views use, and attribute access for reading
back (``fig.data[0].uid``, ``fig.layout.annotations``) in tests.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AttrDict", "Fig"]


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
