"""Attempts: each process that writes into an existing run is a new attempt of it.

A preempted job that is requeued, a rank that an elastic launcher restarts, a script resumed from its
checkpoint into the same ``--run-dir``: the new process finds the rank's records (its ``rankN.db``, or
its published ``meta.json``) and records as attempt *k + 1*. Every row it writes carries ``attempt``
(rows of attempt 1 carry none, so a run that never restarts costs nothing and old runs read as attempt
1); its rowids continue the previous attempt's, locally and in the published segments, so nothing of
any attempt is overwritten (:mod:`gpudash.store.publish`).

What the previous attempt was is read from the rank's meta as that attempt left it (:func:`previous`):
*finished*, *crashed* (an exception, or a signal it said it got), or *killed* (it stopped writing
without a word: SIGKILL, an out-of-memory kill, a lost node); such an attempt is recorded as *ended*
when the next one starts, never live forever. A previous attempt that is still writing (its process
seen writing in the last half minute, and alive if on this host) is a mistake (two jobs given the same folder):
the second is refused with one line (:func:`racing`).

On the reading side a step recorded by one attempt and recorded again by a later one is *superseded*,
as TensorBoard's ``purge_step`` does: from the step a later attempt resumed at, the earlier attempt's
rows of the per-step tables are left out of every default view (:func:`supersede`); they stay in the
files and are read with ``load_run(path, attempts="all")``.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the reading side's; the writer (in the training process) never loads them
    import numpy as np
    import pandas as pd

__all__ = ["ATTEMPT_COLUMN", "PER_STEP_TABLES", "RACE_S", "Previous", "attempt_meta", "attempt_of", "attempt_starts",
           "carried_meta", "kept", "last_step", "previous", "racing", "supersede", "with_attempts"]

#: The column each row of attempt 2 and later carries (rows without it are attempt 1's).
ATTEMPT_COLUMN = "attempt"
#: Tables whose rows belong to a step, so a step redone by a later attempt supersedes them.
PER_STEP_TABLES = ("steps", "memory", "activations")
#: A previous attempt seen (heartbeat) this recently on another host, and not ended, is still writing.
RACE_S = 30.0
#: Meta keys that belong to one process, never carried over to the next attempt.
VOLATILE_META = frozenset({"pid", "host", "started_at", "status", "heartbeat", "end_reason", "ended_at",
                           "dropped_records", "dropped_values", "live_db", "published_at", "segments",
                           "attempt", "attempts", "last_step", "last_time", "no_steps_reason"})


@dataclass(frozen=True)
class Previous:
    """The attempt before this one, as it left the rank's records."""

    attempt: int
    end: str  # finished | crashed | killed
    status: str  # what it is recorded as now: finished | crashed | ended
    reason: str
    ended_at: float | None
    last_step: int | None
    history: list[dict[str, Any]]

    def record(self) -> dict[str, Any]:
        """The previous attempt as one entry of the rank's ``attempts`` meta list."""
        return {"attempt": self.attempt, "status": self.status, "end": self.end, "reason": self.reason,
                "ended_at": self.ended_at, "last_step": self.last_step}


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) < 2**62 else None


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def racing(meta: dict[str, Any], heartbeat: float | None, where: str, now: float | None = None) -> str | None:
    """One line saying a previous attempt is still writing ``where`` (None when it is not): its status is live,
    its heartbeat is under :data:`RACE_S` old and, on this host, its process is alive (and not this one)."""
    if meta.get("status") != "live":
        return None
    now = time.time() if now is None else now
    beat = max(_num(meta.get("heartbeat")) or 0.0, heartbeat or 0.0)
    pid, host = _int(meta.get("pid")), meta.get("host")
    if now - beat > RACE_S:  # silent for a while: gone (its pid may be someone else's by now)
        return None
    if host == socket.gethostname() and pid is not None and (pid == os.getpid() or not _alive(pid)):
        return None
    who = f"process {pid} on {host}" if pid is not None else f"a process on {host or 'another host'}"
    return (f"{where}: {who} is still recording this run (seen {max(0.0, now - beat):.0f} s ago); a second "
            "process would mix its steps with it: stop that one first, or record into another run directory")


def previous(meta: dict[str, Any], heartbeat: float | None) -> Previous | None:
    """The previous attempt from the rank's meta as it left it; None when the rank holds no attempt yet."""
    if not meta or "started_at" not in meta:
        return None
    attempt = _int(meta.get("attempt")) or 1
    status = str(meta.get("status") or "live")
    reason = str(meta.get("end_reason") or "")
    ended = _num(meta.get("ended_at"))
    if status == "finished":
        end = "finished"
    elif status == "live":  # no word: killed (SIGKILL, the OOM killer, a lost node)
        end, status, reason = "killed", "ended", "stopped without a word (killed, or its node lost)"
        ended = max(_num(meta.get("heartbeat")) or 0.0, heartbeat or 0.0) or None
    elif "SIG" in reason or "signal" in reason.lower() or "KeyboardInterrupt" in reason:
        end = "killed"
    else:
        end = "crashed"
    history = [h for h in meta.get("attempts") or [] if isinstance(h, dict)]
    return Previous(attempt=attempt, end=end, status=status, reason=reason, ended_at=ended,
                    last_step=_int(meta.get("last_step")), history=history)


def last_step(conn: sqlite3.Connection) -> int | None:
    """The step of the rank's newest steps row (the last one recorded, whatever attempt), or None."""
    try:
        row = conn.execute("SELECT step FROM steps ORDER BY rowid DESC LIMIT 1").fetchone()
    except sqlite3.Error:
        return None
    return _int(row[0]) if row else None


def carried_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """What the next attempt keeps of the rank's meta (the run's facts, not the process's)."""
    return {k: v for k, v in meta.items() if k not in VOLATILE_META}


def attempt_meta(own: dict[str, Any], prev: Previous | None, before: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The meta an attempt starts with: ``own`` (the process's facts and the caller's) over the run's facts the
    attempt before left in ``before``, with the list of attempts; and the previous process's keys this one does
    not set (to delete from the rank's meta table)."""
    if prev is None:
        return own, []
    start = {**carried_meta(before), **own, "attempt": prev.attempt + 1, "attempts": [*prev.history, prev.record()]}
    return start, [k for k in VOLATILE_META if k in before and k not in start]


# ---- reading side -------------------------------------------------------------------------------
def attempt_of(df: pd.DataFrame) -> np.ndarray:
    """Each row's attempt (1 where the column is absent or empty)."""
    import numpy as np
    import pandas as pd

    if ATTEMPT_COLUMN not in df:
        return np.ones(len(df), dtype=np.int64)
    v = pd.to_numeric(df[ATTEMPT_COLUMN], errors="coerce").to_numpy(dtype=float)
    return np.where(np.isfinite(v) & (v >= 1), v, 1).astype(np.int64)


def with_attempts(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with an ``attempt`` column of whole numbers (1 for rows written before any restart)."""
    if not len(df) and ATTEMPT_COLUMN in df:
        return df
    df = df.copy() if ATTEMPT_COLUMN in df else df
    df[ATTEMPT_COLUMN] = attempt_of(df)
    return df


def attempt_starts(steps: pd.DataFrame) -> dict[tuple[int, int], int]:
    """``{(rank, attempt): first step it recorded}`` from a steps frame (rank 0 when it has no rank column)."""
    import numpy as np
    import pandas as pd

    if not len(steps) or "step" not in steps or ATTEMPT_COLUMN not in steps:
        return {}
    rank = steps["rank"].to_numpy() if "rank" in steps else np.zeros(len(steps), dtype=np.int64)
    step = pd.to_numeric(steps["step"], errors="coerce").to_numpy(dtype=float)
    att = attempt_of(steps)
    frame = pd.DataFrame({"rank": rank, "attempt": att, "step": step}).dropna()
    return {(int(r), int(a)): int(s) for (r, a), s in frame.groupby(["rank", "attempt"])["step"].min().items()}


def kept(df: pd.DataFrame, starts: dict[tuple[int, int], int]) -> np.ndarray:
    """Which rows of a per-step table no later attempt redid (a bool mask): a row of attempt *a* at step *s* is
    left out when a later attempt of its rank started at a step <= *s* (``starts`` from :func:`attempt_starts`;
    rank 0 when ``df`` has no rank column, attempt 1 when it has no attempt column)."""
    import numpy as np
    import pandas as pd

    if not len(df) or not starts or "step" not in df:
        return np.ones(len(df), dtype=bool)
    att = attempt_of(df)
    rank = df["rank"].to_numpy() if "rank" in df else np.zeros(len(df), dtype=np.int64)
    step = pd.to_numeric(df["step"], errors="coerce").to_numpy(dtype=float)
    # per row: the lowest step any later attempt of its rank started at (inf when none)
    limit = np.full(len(df), np.inf)
    for (r, a), s in starts.items():
        later = (rank == r) & (att < a)
        if later.any():
            limit[later] = np.minimum(limit[later], s)
    return ~(step >= limit)


def supersede(df: pd.DataFrame, starts: dict[tuple[int, int], int]) -> pd.DataFrame:
    """The rows of a per-step table that no later attempt redid (see :func:`kept`)."""
    keep = kept(df, starts)
    if keep.all():
        return df
    return df[keep].reset_index(drop=True)
