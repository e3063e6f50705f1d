"""Progress and ETA of a run whose total steps are known: derived here once, for every surface.

The run page's header, the runs list and ``gpudash train``'s terminal line
all show :func:`progress_text` / :func:`eta_text` of a :class:`Progress`; the
dashboard gets it from :class:`gpudash.analysis.facts.Facts` (``progress``),
the trainer calls :func:`progress` with the end times of the steps it ran.

The ETA is the steps left times the recent step period: the median gap
between the end times of the last :data:`RECENT_STEPS` steps. Gaps include
what runs between two steps (data loading, logging); the median ignores an
occasional evaluation or checkpoint pause, and a slow first step (compilation,
warm-up, cache allocation) has no gap before it, so it never counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.ranks import lowest_rank
from gpudash.store.run import Run

__all__ = ["RECENT_STEPS", "Progress", "fmt_eta", "eta_text", "progress", "progress_text", "run_progress",
           "step_period"]

#: Steps whose gaps give the recent step period.
RECENT_STEPS = 50


@dataclass(frozen=True)
class Progress:
    """How far a run with a known total is; ``eta_s`` only while it is live and its step rate is known."""

    done: int
    """Steps recorded (the last step index + 1)."""
    total: int
    """Steps the run will take (``Monitor(total_steps=...)``, the trainer's ``--steps``, HF / Lightning)."""
    fraction: float
    """done / total, at most 1."""
    steps_left: int
    step_s: float | None
    """Recent seconds per step (median of the last :data:`RECENT_STEPS` gaps)."""
    eta_s: float | None
    """Seconds to the last step: steps_left * step_s; None when the run is not live or the rate is unknown."""

    @classmethod
    def from_json(cls, d: Any) -> Progress | None:
        """The progress of a ``Facts.to_json()`` (a stored runs-list summary); None when it holds none."""
        if not isinstance(d, dict):
            return None
        def opt(v: Any) -> float | None:
            return None if v is None else float(v)

        try:
            return cls(done=int(d["done"]), total=int(d["total"]), fraction=float(d["fraction"]),
                       steps_left=int(d["steps_left"]), step_s=opt(d.get("step_s")), eta_s=opt(d.get("eta_s")))
        except (KeyError, TypeError, ValueError, OverflowError):
            return None


def step_period(steps: Sequence[float], times: Sequence[float], durations: Sequence[float] | None = None,
                window: int = RECENT_STEPS) -> float | None:
    """Median seconds per step of the last ``window`` steps (``steps``, their end ``times``, in any order):
    the gaps between consecutive step ends, each divided by the steps it spans (rows the writer dropped).
    With a single step its ``duration``; None without a positive one."""
    s = np.asarray(steps, dtype=float)
    t = np.asarray(times, dtype=float)
    ok = np.isfinite(s) & np.isfinite(t)
    s, t = s[ok], t[ok]
    if len(s) >= 2:
        order = np.argsort(s, kind="stable")
        s, t = s[order][-(window + 1):], t[order][-(window + 1):]
        ds, dt = np.diff(s), np.diff(t)
        good = (ds > 0) & (dt > 0)
        if good.any():
            return float(np.median(dt[good] / ds[good]))
    d = np.asarray(durations if durations is not None else [], dtype=float)
    d = d[np.isfinite(d) & (d > 0)][-window:]
    return float(np.median(d)) if len(d) else None


def progress(done: int, total: int | None, steps: Sequence[float] = (), times: Sequence[float] = (),
             durations: Sequence[float] | None = None, live: bool = True) -> Progress | None:
    """The progress of a run that has recorded ``done`` steps of ``total`` (None when the total is unknown);
    ``steps`` / ``times`` / ``durations``: its recent steps, their end times and durations (the rate)."""
    if total is None or isinstance(total, bool) or not isinstance(total, int | float) or not total >= 1:
        return None
    total = int(total)
    done = max(int(done), 0)
    left = max(total - done, 0)
    period = step_period(steps, times, durations)
    eta = None if not live or period is None else left * period
    return Progress(done=done, total=total, fraction=min(done / total, 1.0), steps_left=left, step_s=period,
                    eta_s=eta)


def run_progress(run: Run, done: int) -> Progress | None:
    """:func:`progress` of a loaded run: its ``total_steps`` meta and the recent steps of its lowest rank."""
    total = run.meta.get("total_steps")
    if total is None:
        return None
    steps = run.steps
    cols: dict[str, Any] = {"steps": (), "times": (), "durations": None}
    if len(steps) and "step" in steps and "time" in steps:
        rows = lowest_rank(steps)
        step = pd.to_numeric(rows["step"], errors="coerce")
        rows = rows.assign(_s=step).dropna(subset=["_s"]).sort_values("_s", kind="stable").tail(RECENT_STEPS + 1)
        cols = {"steps": rows["_s"].to_numpy(dtype=float),
                "times": pd.to_numeric(rows["time"], errors="coerce").to_numpy(dtype=float),
                "durations": pd.to_numeric(rows["duration_s"], errors="coerce").to_numpy(dtype=float)
                if "duration_s" in rows else None}
    return progress(done, total, live=run.status == "live", **cols)


def fmt_eta(seconds: float | None) -> str:
    """A duration as people say it: ``45 s``, ``3 min``, ``2 h 05 min``, ``3 d 4 h``."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = max(float(seconds), 0.0)
    if s < 1:
        return "< 1 s"
    if s < 90:
        return f"{round(s)} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    minutes = round(s / 60)
    if minutes < 48 * 60:
        return f"{minutes // 60} h {minutes % 60:02d} min"
    hours = round(s / 3600)
    return f"{hours // 24} d {hours % 24} h"


def eta_text(p: Progress | None) -> str:
    """``ETA 3 min`` (empty when there is no ETA: unknown total, a run that is not live, no rate yet)."""
    if p is None or p.eta_s is None:
        return ""
    return f"ETA {fmt_eta(p.eta_s)}"


def progress_text(p: Progress | None) -> str:
    """``step 1,234 of 5,000 · ETA 3 min`` (the ETA only while live); empty when the total is unknown."""
    if p is None:
        return ""
    eta = eta_text(p)
    return f"step {p.done:,} of {p.total:,}" + (f" · {eta}" if eta else "")
