"""Large allocator snapshots grown from the real fixture's frames (for benchmarks/snapshots.py and tests).

The real snapshot (tests/fixtures/real-snapshot/, MIT, recorded by torch on a GPU) holds 5,163 trace entries
(1,721 allocations, each freed by a free_requested and a free_completed). :func:`grow_snapshot` repeats its
trace until it holds ``n`` entries: each repetition shifts addresses (so allocations do not collide) and times
(so the clock keeps running), and every entry gets a list of its own holding the real, shared frame dicts, as
torch's pickles do (83 frame dicts referenced from every entry's list).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

REAL = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "real-snapshot" / \
    "cs336_assignment2_memory_snapshot.pickle"

__all__ = ["REAL", "grow_snapshot", "write_snapshot"]


def grow_snapshot(n: int, real: Path = REAL) -> dict[str, Any]:
    """The real snapshot with a trace of ``n`` entries (its segments as recorded)."""
    with open(real, "rb") as f:
        snap = pickle.load(f)  # our own fixture, not a stranger's file
    entries = snap["device_traces"][0]
    span = max(e["time_us"] for e in entries) - min(e["time_us"] for e in entries) + 1
    out: list[dict[str, Any]] = []
    rep = 0
    while len(out) < n:
        shift = rep * (1 << 36)
        for e in entries:
            if len(out) >= n:
                break
            d = dict(e)
            d["addr"] = e["addr"] + shift
            d["time_us"] = e["time_us"] + rep * span
            d["frames"] = list(e["frames"])
            out.append(d)
        rep += 1
    snap["device_traces"] = [out]
    return snap


def write_snapshot(n: int, path: Path) -> Path:
    with open(path, "wb") as f:
        pickle.dump(grow_snapshot(n), f, protocol=4)
    return path
