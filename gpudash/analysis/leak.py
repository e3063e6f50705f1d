"""The leak fact of a run: :func:`leak_of` on one rank's recorded frames, :func:`run_leak` on a whole run.

The rule itself (block floors, the rate, since when, what grows, when the memory runs out) is
:func:`gpudash.analysis.leak_rule.judge`, on numbers: the live watch calls it on its in-process window, this
module on a run's frames. One judge, called on the trailing window while the run goes (the Monitor's leak watch
records a ``leak`` event, the alerts read it) and on the whole run afterwards (``run_facts(run).leak``: the run
page's header, the report, ``gpudash info``, ``gpudash check --no-leak``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.attempts import latest_attempt
from gpudash.analysis.frames import numeric
from gpudash.analysis.leak_rule import (
    BLOCKS,
    LEAK_EVENT,
    MIN_GROWTH_BYTES,
    MIN_GROWTH_SHARE,
    MIN_POINTS_PER_BLOCK,
    MIN_RISING,
    RULE_COLUMNS,
    TRAIL_STEPS,
    WARMUP_STEPS,
    Growth,
    Leak,
    LeakFrame,
    floor_growth,
    judge,
    leak_text,
)

__all__ = ["BLOCKS", "LEAK_EVENT", "MIN_GROWTH_BYTES", "MIN_GROWTH_SHARE", "MIN_POINTS_PER_BLOCK", "MIN_RISING",
           "TRAIL_STEPS", "WARMUP_STEPS", "Growth", "Leak", "LeakFrame", "floor_growth", "leak_of", "leak_text",
           "recorded_leaks", "run_leak"]


def _numbers(df: pd.DataFrame, table: str) -> dict[str, np.ndarray]:
    """The columns the rule reads, as numbers (text and damaged cells NaN; a column with no number left out)."""
    out = {}
    for c in RULE_COLUMNS[table]:
        v = numeric(df, c)
        if v is not None:
            out[c] = v.to_numpy(dtype=float)
    return out


def leak_of(memory: pd.DataFrame, host: pd.DataFrame, steps: pd.DataFrame, *, capacity: float | None = None,
            rank: int | None = None, first_step: float | None = None) -> Leak | None:
    """The leak rule (:func:`~gpudash.analysis.leak_rule.judge`) on one rank's frames (the whole run, or any
    part of it): its numbers, the category that grows, and when the memory runs out at this rate."""
    return judge(_numbers(memory, "memory"), _numbers(host, "host"), _numbers(steps, "steps"), capacity=capacity,
                 rank=rank, first_step=first_step)


def _host(run: Any) -> pd.DataFrame:
    """The run's host samples (:meth:`gpudash.store.run.Run.host_rows`)."""
    rows = getattr(run, "host_rows", None)
    host: pd.DataFrame = rows() if rows is not None else pd.DataFrame()
    return host


def _of_rank(df: pd.DataFrame, rank: int) -> pd.DataFrame:
    return df[df["rank"] == rank] if len(df) and "rank" in df else df


def run_leak(run: Any) -> Leak | None:
    """The run's leak: one judge for every surface. When the live watch recorded a ``leak`` event, that
    event is the leak (the fastest-growing one when several episodes or ranks recorded one): the alert said
    its line, so the run page, the report, ``gpudash info`` and ``gpudash check --no-leak`` say the same
    numbers from the same window. Otherwise (the watch was off, or the run ended before it looked again) the
    rule on the whole run, each rank on its own rows; the fastest-growing rank's leak."""
    live = recorded_leaks(run)
    if live:
        return max(reversed(live), key=lambda lk: lk.per_step_bytes)  # ties: the newest episode
    return _whole_run_leak(run)


def _whole_run_leak(run: Any) -> Leak | None:
    from gpudash.analysis.memory import capacity_bytes

    mem, steps = run.memory, run.steps
    if not len(steps) or "step" not in steps:
        return None
    # on GPU the allocator's rows say it all: the host table (the largest, read lazily) is read only on CPU
    host = _host(run) if numeric(mem, "allocated_bytes") is None else pd.DataFrame()
    cap = capacity_bytes(run)
    first = numeric(steps, "step")
    first_step = float(first.min()) if first is not None and first.notna().any() else None
    ranks = sorted(set(run.ranks) or {0})
    found = []
    for r in ranks:
        # a resumed run: the last attempt's rows, its warm-up counted from where it resumed (a restart's memory
        # drop and regrowth is no leak)
        m, h, st, first_r = latest_attempt(_of_rank(mem, r), _of_rank(host, r), _of_rank(steps, r), first_step)
        leak = leak_of(m, h, st, capacity=cap, rank=r if len(ranks) > 1 else None, first_step=first_r)
        if leak is not None:
            found.append(leak)
    if not found:
        return None
    return max(found, key=lambda lk: lk.per_step_bytes)


def recorded_leaks(run: Any) -> list[Leak]:
    """The ``leak`` events the live watch recorded, in time order."""
    ev = run.events
    if ev is None or not len(ev) or "kind" not in ev:
        return []
    from gpudash.store.run import parse_json

    rows = ev[ev["kind"].astype(str) == LEAK_EVENT]
    if "time" in rows:
        rows = rows.sort_values("time")
    out = []
    for d in rows["data"] if "data" in rows else []:
        leak = Leak.from_dict(d if isinstance(d, dict) else parse_json(d))
        if leak is not None:
            out.append(leak)
    return out


