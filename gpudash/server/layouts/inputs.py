"""Callback inputs are untrusted JSON: parse them into what the pure functions expect, or refuse.

Anything a page of this dashboard never sends (a rank ``"abc"``, a cursor of
``1e308``, a live state whose series are not series) raises :class:`BadInput`,
which the app answers with a one-line 400 instead of a 500 and a traceback.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

from gpudash.server.layouts.series import FNS, STYLES, Series

__all__ = ["MAX_INT", "MAX_RANK", "BadInput", "as_float", "as_int", "live_state", "page_run", "rank_of"]

#: Steps, rows and counters beyond this are not from a page (2**53: the largest exact JavaScript integer).
MAX_INT = 2**53
MAX_RANK = 2**31 - 1
_SERIES_FIELDS = {f.name: f.type for f in fields(Series)}
_CHOICES = {"x": ("step", "elapsed", "relative", "wall"), "fn": FNS, "style": STYLES}


class BadInput(ValueError):
    """A callback input that no page of this dashboard sends."""


def as_int(value: Any, name: str, *, lo: int = -MAX_INT, hi: int = MAX_INT) -> int:
    """An integer in [lo, hi] from a JSON number or a string of ASCII digits (a URL query)."""
    if isinstance(value, bool):
        raise BadInput(f"{name} must be an integer")
    if isinstance(value, str) and value.strip().lstrip("-").isascii() and value.strip().lstrip("-").isdigit() \
            and len(value) <= 20:
        value = int(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) <= MAX_INT:
        value = int(value)
    if not isinstance(value, int) or not lo <= value <= hi:
        raise BadInput(f"{name} must be an integer between {lo} and {hi}")
    return value


def as_float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise BadInput(f"{name} must be a number")
    try:
        out = float(value)
    except ValueError:
        raise BadInput(f"{name} must be a number") from None
    if not math.isfinite(out) or abs(out) > 1e300:
        raise BadInput(f"{name} must be a finite number")
    return out


def rank_of(value: Any) -> int:
    return as_int(0 if value is None else value, "rank", lo=0, hi=MAX_RANK)


def page_run(page: Any) -> tuple[str, int]:
    """(run id, rank) of the ``page-run`` store."""
    if not isinstance(page, dict) or not isinstance(page.get("run"), str):
        raise BadInput("page-run must be {'run': RUN_ID, ...}")
    return page["run"], rank_of(page.get("rank"))


def _dict(value: Any, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise BadInput(f"{name} must be an object")
    return value


def _series(d: Any) -> dict[str, Any]:
    if not isinstance(d, dict) or set(d) - set(_SERIES_FIELDS) or not {"table", "col", "name"} <= set(d):
        raise BadInput("a live series must be a Series")
    for k, v in d.items():
        if k in ("rank", "gpu"):
            if not (k == "gpu" and v is None):
                as_int(v, f"series {k}", lo=0, hi=MAX_RANK)
        elif k == "scale":
            if as_float(v, "series scale") <= 0:
                raise BadInput("series scale must be positive")
        elif k == "origin":
            as_float(v, "series origin")
        elif k == "smooth":
            if not 0 <= as_float(v, "series smoothing") < 1:
                raise BadInput("series smoothing must be in [0, 1)")
        elif k == "color":
            if v is not None and not isinstance(v, str):
                raise BadInput("series color must be a string")
        elif not isinstance(v, str) or v not in _CHOICES.get(k, (v,)):
            raise BadInput(f"series {k} must be one of {_CHOICES.get(k, 'a string')}")
    Series.from_dict(d)
    return d


def live_state(state: Any) -> dict[str, Any]:
    """The ``live-state`` store, checked field by field (fields the server never reads pass through)."""
    s = dict(_dict(state, "live-state"))
    if not isinstance(s.get("run"), str):
        raise BadInput("live-state needs its run id")
    s["rank"] = rank_of(s.get("rank"))
    s["cursor"] = {k: as_int(v, "cursor", lo=0, hi=2**63 - 1) for k, v in _dict(s.get("cursor"), "cursor").items()}
    s["last"] = {k: -math.inf if v is None else _data(v) for k, v in _dict(s.get("last"), "last").items()}
    tails = {}
    for k, cols in _dict(s.get("tails"), "tails").items():
        tails[k] = {c: [_data(x) for x in _list(v)] for c, v in _dict(cols, "tails").items()}
    s["tails"] = tails
    s["specs"] = {g: [_series(d) for d in _list(v)] for g, v in _dict(s.get("specs"), "specs").items()}
    s["points"] = {g: as_int(v, "points", lo=0) for g, v in _dict(s.get("points"), "points").items()}
    if s.get("last_step") is not None:
        s["last_step"] = as_int(s["last_step"], "last_step")
    s["t0"] = as_float(s.get("t0") or 0.0, "t0")
    if not isinstance(s.get("status", ""), str):
        raise BadInput("status must be a string")
    return s


def _data(value: Any) -> float:
    """A recorded value echoed back by the page: any float (inf and NaN included; null is NaN)."""
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput("recorded values must be numbers")
    try:
        return float(value)
    except OverflowError:
        raise BadInput("recorded values must be floats") from None


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise BadInput("expected a list")
    return value
