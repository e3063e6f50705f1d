"""The step graphs' x axis: step, relative time (h:mm:ss since the run's first step) or wall time.
(Its callbacks: :mod:`gpudash.server.layouts.xaxis_callbacks`.)

The choice is a control in the run page's header and ``x=step|relative|wall``
in the address. Time modes draw each row at its recorded ``time`` on a date
axis: relative time as milliseconds since 1970-01-01 00:00 plus the seconds
since the first step began (so ticks read ``0:05:00``; a run over a day reads
``day 2 …``), wall time as the server's local time. The series carry the
mode and its origin (:class:`gpudash.server.layouts.series.Series` ``x`` /
``origin``), so the live tick appends points in the same units a rebuild draws.

Zoom in the address stays in steps whatever the axis (``x0``/``x1``): a time
range zoomed to is turned into the steps recorded in it, and a step range
from a link is drawn as the time range those steps took. Lines at a step (the
replay cursor, an OOM) move to the time of that step.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.inputs import BadInput, as_float
from gpudash.server.layouts.series import Series
from gpudash.server.layouts.viewstate import XMODES, mode_of, relayout_range, zoom_range
from gpudash.store.reader import RunReader

__all__ = ["XMODES", "XAxis", "axis_range", "cursor_ms", "mode_of", "steps_in", "style_figure",
           "time_range_of", "with_x", "x_of", "x_origin", "zoom_steps"]

_DAY_MS = 86_400_000.0


@dataclass(frozen=True)
class XAxis:
    """The x axis of the step graphs: ``mode`` and the ``origin`` (seconds) subtracted from a row's time."""

    mode: str = "step"
    origin: float = 0.0

    @property
    def timed(self) -> bool:
        return self.mode != "step"

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "origin": self.origin}


def x_of(state: Any) -> XAxis:
    """The x axis a ``live-state`` carries (``{"x": {"mode", "origin"}}``); step when it has none."""
    x = state.get("x") if isinstance(state, dict) else None
    if not isinstance(x, dict):
        return XAxis()
    mode = x.get("mode")
    if mode not in dict(XMODES):
        raise BadInput("the x axis must be step, relative or wall")
    return XAxis(str(mode), as_float(x.get("origin") or 0.0, "x origin"))


def x_origin(mode: str, steps: pd.DataFrame) -> float:
    """The origin of ``mode``: the start of the run's first step (relative), the local time's offset (wall)."""
    if mode == "step" or not len(steps) or "time" not in steps:
        return 0.0
    t = pd.to_numeric(steps["time"], errors="coerce")
    if mode == "relative":
        d = pd.to_numeric(steps["duration_s"], errors="coerce").fillna(0.0) if "duration_s" in steps else 0.0
        start = (t - d).min()
        return float(start) if math.isfinite(start) else 0.0
    first = float(t.min()) if t.notna().any() else time.time()
    return -float(time.localtime(first).tm_gmtoff)  # wall: draw the server's local clock


def with_x(specs: list[Series], x: XAxis | None) -> list[Series]:
    """``specs`` drawn against ``x`` (the step series only; those against elapsed seconds stay)."""
    if x is None or not x.timed:
        return specs
    return [replace(s, x=x.mode, origin=x.origin) if s.x == "step" else s for s in specs]


def _step_to_ms(steps: pd.DataFrame, x: XAxis) -> Any:
    """A function from steps to the x of ``x`` (ms on the date axis), from the steps' end times."""
    if not len(steps) or "step" not in steps or "time" not in steps:
        return None
    s = pd.to_numeric(steps["step"], errors="coerce").to_numpy(dtype=float)
    t = pd.to_numeric(steps["time"], errors="coerce").to_numpy(dtype=float)
    ok = np.isfinite(s) & np.isfinite(t)
    if not ok.any():
        return None
    s, t = s[ok], t[ok]
    order = np.argsort(s, kind="stable")
    s, t = s[order], t[order]
    return lambda v: float((np.interp(float(v), s, t) - x.origin) * 1000.0)


def style_figure(fig: Fig, x: XAxis | None, steps: pd.DataFrame) -> None:
    """Date axes for a time mode (ticks, hover, title; the zoom resets when the mode changes), and every line
    or label placed at a step (cursor, OOM) moved to that step's time."""
    if x is None:
        return
    if not x.timed:  # said outright: plotly keeps a date axis' type when a redraw leaves it out
        for name in [k for k in fig.layout if k.startswith("xaxis")] or ["xaxis"]:
            fig.update_layout({name: {"type": "linear"}})
        return
    if x.mode == "relative":
        t = pd.to_numeric(steps["time"], errors="coerce") if "time" in steps else pd.Series(dtype=float)
        span_ms = (float(t.max()) - x.origin) * 1000.0 if t.notna().any() else 0.0
        hms = "day %-j, %-H:%M:%S" if span_ms > _DAY_MS else "%-H:%M:%S"
        stops = [{"dtickrange": [None, 1000], "value": hms + ".%L"},  # sub-second ticks of a short run or a zoom
                 {"dtickrange": [1000, _DAY_MS], "value": hms},
                 {"dtickrange": [_DAY_MS, None], "value": "day %-j"}]
        axis = {"type": "date", "tickformatstops": stops, "hoverformat": hms + ".%L", "uirevision": "relative",
                "title": {"text": "time since the first step"}}
    else:
        axis = {"type": "date", "hoverformat": "%Y-%m-%d %H:%M:%S.%L", "uirevision": "wall",
                "title": {"text": "wall time"}}
    for name in [k for k in fig.layout if k.startswith("xaxis")] or ["xaxis"]:
        old = fig.layout.get(name) or {}
        title = old.get("title") if isinstance(old, dict) else None
        fig.update_layout({name: dict(axis, title=axis["title"] if (title or {}).get("text") else {"text": ""})})
    to_x = _step_to_ms(steps, x)
    for item in [*(fig.layout.get("shapes") or ()), *(fig.layout.get("annotations") or ())]:
        if item.get("xref") != "x":
            continue
        for k in ("x0", "x1", "x"):
            if k in item and item[k] is not None and to_x is not None:
                item[k] = to_x(item[k])


def _ms(value: Any) -> float:
    """A date axis' value as plotly sends it ("1970-01-01 00:01:30.5" or ms) in ms since 1970 (UTC)."""
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip().replace(" ", "T"))
        except ValueError:
            return as_float(value, "x range")
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        return when.timestamp() * 1000.0
    return as_float(value, "x range")


def axis_range(relayout: Any, x: XAxis | None) -> tuple[float, float] | bool | None:
    """The range a ``relayoutData`` zoomed to, in the axis' units (steps, or ms on a date axis);
    True for a reset, None when x did not change."""
    if x is None or not x.timed:
        return zoom_range(relayout)
    rng = relayout_range(relayout)
    return (_ms(rng[0]), _ms(rng[1])) if isinstance(rng, tuple) else rng


def steps_in(reader: RunReader, lock: threading.Lock, ms: tuple[float, float], x: XAxis) -> tuple[float, float] | None:
    """The steps (first, last) whose end times fall in the date axis range ``ms``; None when none does."""
    t0, t1 = ms[0] / 1000.0 + x.origin - 1e-6, ms[1] / 1000.0 + x.origin + 1e-6  # float error of the ms
    with lock:
        return reader.step_span(t0, t1)


def zoom_steps(relayout: Any, state: Any, readers: Any) -> tuple[float, float] | bool | None:
    """The step range a zoom of a step graph covers, whatever its x axis (the address keeps zoom in steps);
    True for a reset, None when x did not change. ``readers``: the callbacks' ReaderCache."""
    x = x_of(state)
    rng = axis_range(relayout, x)
    if not isinstance(rng, tuple) or not x.timed or not isinstance(state, dict):
        return rng
    reader, lock = readers.get_or_skip(str(state.get("run")))
    return steps_in(reader, lock, rng, x)


def time_range_of(steps: pd.DataFrame, x: XAxis, s0: float, s1: float) -> list[float] | None:
    """The date axis range (ms) the steps ``s0``..``s1`` took: a zoom in steps from the address, drawn in time."""
    to_x = _step_to_ms(steps, x)
    return None if to_x is None else [to_x(s0), to_x(s1)]


def cursor_ms(reader: RunReader, lock: threading.Lock, rank: int, step: int, x: XAxis) -> float | None:
    r = reader.ranks.get(rank) or next(iter(reader.ranks.values()), None)
    if r is None:
        return None
    with lock:
        at = r.time_at_step(step)  # a damaged table: None, the line stays where it is
    return None if at is None else (at - x.origin) * 1000.0
