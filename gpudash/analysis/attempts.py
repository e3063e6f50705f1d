"""Attempts of a run: how many processes recorded it, and where each resumed (the ``resume`` events).

One fact, derived here once: the run page's markers, ``gpudash info``, the report and ``/api`` show these.
The rows a later attempt superseded are already out of every frame (:mod:`gpudash.store.attempts`); the
rules that read a run by steps (spikes, leak) use :func:`attempt_bounds` so a restart's warm-up and its
memory drop are never read as a finding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from gpudash.store.attempts import attempt_of
from gpudash.store.run import parse_json

if TYPE_CHECKING:
    from gpudash.store.run import Run

__all__ = ["Resume", "attempt_bounds", "attempt_count", "latest_attempt", "resumes", "resumes_text"]


@dataclass(frozen=True)
class Resume:
    """One attempt after the first: where and when it resumed."""

    rank: int
    attempt: int
    step: int | None
    time: float | None
    gap_s: float | None
    previous_end: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def resumes(events: pd.DataFrame) -> list[Resume]:
    """The run's ``resume`` events, in time order (one per rank that a new attempt resumed)."""
    if not len(events) or "kind" not in events:
        return []
    out = []
    for _, row in events[events["kind"] == "resume"].iterrows():
        data = parse_json(row.get("data"))
        step = _num(data.get("step", row.get("step")))
        attempt = _num(data.get("attempt"))
        out.append(Resume(rank=int(_num(row.get("rank")) or 0), attempt=int(attempt or 2),
                          step=None if step is None else int(step), time=_num(row.get("time")),
                          gap_s=_num(data.get("gap_s")), previous_end=str(data.get("previous_end") or "?"),
                          message=str(row.get("message") or "")[:500]))
    return sorted(out, key=lambda r: (r.time or 0.0, r.rank))


def attempt_count(run: Run) -> int:
    """How many attempts recorded the run (the most of any rank): 1 for a run no process resumed."""
    best = 1
    for m in run.rank_meta.values():
        a = _num(m.get("attempt"))
        if a is not None:
            best = max(best, int(a))
    for r in resumes(run.events):
        best = max(best, r.attempt)
    return best


def resumes_text(items: list[Resume], limit: int = 4) -> str:
    """``attempt 2 resumed at step 100 after 3 min 12 s (...)``; several ranks' resumes joined."""
    parts = [(f"rank {r.rank}: " if any(x.rank != 0 for x in items) else "") + r.message.split("; steps ")[0]
             for r in items[:limit]]
    return "; ".join(parts) + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def attempt_bounds(steps: pd.DataFrame) -> np.ndarray:
    """Row positions (in ``steps``' order by rank, then step) where a new attempt's rows begin: a rule that
    compares a step with those before it starts over there (warm-up and a freshly empty allocator are not a
    spike or a leak). Empty for a run no process resumed."""
    if "attempt" not in steps or not len(steps):
        return np.zeros(0, dtype=np.int64)
    att = pd.to_numeric(steps["attempt"], errors="coerce").fillna(1).to_numpy()
    change = np.flatnonzero(att[1:] != att[:-1]) + 1
    return change.astype(np.int64)


def latest_attempt(memory: pd.DataFrame, host: pd.DataFrame, steps: pd.DataFrame,
                   first_step: float | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, float | None]:
    """One rank's rows of its last attempt, and the step it began at (the frames as given, and ``first_step``,
    for a run no process resumed): what a rule that reads growth over steps judges."""
    if "attempt" not in steps or not len(steps):
        return memory, host, steps, first_step
    att = attempt_of(steps)
    last = int(att.max())
    if last <= 1:
        return memory, host, steps, first_step
    steps = steps[att == last]
    begun = pd.to_numeric(steps["step"], errors="coerce").min()
    mem = memory[attempt_of(memory) == last] if len(memory) else memory
    hst = host[attempt_of(host) == last] if len(host) else host
    return mem, hst, steps, float(begun) if np.isfinite(begun) else first_step
