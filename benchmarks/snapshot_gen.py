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


def grow_snapshot(n: int, real: Path = REAL, frames: int = 0) -> dict[str, Any]:
    """The real snapshot with a trace of ``n`` entries (its segments as recorded). ``frames``: each entry's
    stack padded to that many frames with shared native frames (``file.cpp``), as a snapshot recorded with
    ``_record_memory_history(stacks="all")`` holds: 53 make a 400,000-entry file of 137 MB."""
    with open(real, "rb") as f:
        snap = pickle.load(f)  # our own fixture, not a stranger's file
    entries = snap["device_traces"][0]
    span = max(e["time_us"] for e in entries) - min(e["time_us"] for e in entries) + 1
    native = [{"filename": f"/pytorch/c10/cuda/CUDACachingAllocator{i}.cpp", "line": i, "name": f"c10::alloc{i}()"}
              for i in range(400)]
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
            pad = max(0, frames - len(e["frames"]))
            k = (len(e["frames"]) * 7) % (len(native) - pad) if pad else 0
            d["frames"] = native[k:k + pad] + list(e["frames"])  # innermost (native) first, as torch orders them
            out.append(d)
        rep += 1
    snap["device_traces"] = [out]
    return snap


def write_snapshot(n: int, path: Path, frames: int = 0) -> Path:
    with open(path, "wb") as f:
        pickle.dump(grow_snapshot(n, frames=frames), f, protocol=4)
    return path
