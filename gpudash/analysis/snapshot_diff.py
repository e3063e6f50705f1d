"""Two allocator snapshots compared: what grew, and by which frames; and the largest live allocations of one.

The facts every surface shows about snapshots (the run page's diff view and largest-allocations table,
``gpudash diff-snapshots``, its ``--json``) are derived here once. Live allocations are the
``active_allocated`` blocks of each map, grouped by their stack (the few user frames that allocated them,
:data:`gpudash.store.snapshot_read.STACK_DEPTH` deep, innermost first, chosen when the snapshot was stored by
:func:`gpudash.store.snapshot_read.top_frames`: gpudash's own frames on top, such as ``gpudash run``'s wrapper
of the model's call, are not among them, so the named frame is the user's); a block allocated from C++ (no
Python frames) is grouped under :data:`NO_FRAMES`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

__all__ = ["NO_FRAMES", "FrameChange", "LiveAllocation", "MapTotals", "SnapshotDiff", "largest_live",
           "map_totals", "snapshot_diff"]

NO_FRAMES = "(no Python frames: allocated from C++, e.g. autograd's backward)"


@dataclass(frozen=True)
class MapTotals:
    """One snapshot's totals (bytes): what the allocator reserved, what is allocated in it, free, and the
    largest free block; ``live`` allocations (active blocks) and ``segments``."""

    step: int | None
    label: str
    reserved_bytes: int
    allocated_bytes: int
    free_bytes: int
    largest_free_bytes: int
    fragmentation_pct: float
    segments: int
    live: int


@dataclass(frozen=True)
class FrameChange:
    """Live bytes and allocations of one stack in snapshot A (before) and B (after)."""

    stack: str
    before_bytes: int
    after_bytes: int
    before_count: int
    after_count: int

    @property
    def delta_bytes(self) -> int:
        return self.after_bytes - self.before_bytes

    @property
    def top(self) -> str:
        """The innermost frame of the stack."""
        return self.stack.split("\n", 1)[0]


@dataclass
class SnapshotDiff:
    """A (before) against B (after): totals of each, and the stacks whose live bytes changed, most grown first
    (``rows``; at most ``top`` of them, ``more`` left out)."""

    before: MapTotals
    after: MapTotals
    rows: list[FrameChange] = field(default_factory=list)
    grown_bytes: int = 0
    shrunk_bytes: int = 0
    more: int = 0

    @property
    def allocated_delta(self) -> int:
        return self.after.allocated_bytes - self.before.allocated_bytes

    @property
    def reserved_delta(self) -> int:
        return self.after.reserved_bytes - self.before.reserved_bytes

    def as_dict(self) -> dict[str, Any]:
        return {"before": asdict(self.before), "after": asdict(self.after),
                "allocated_delta_bytes": self.allocated_delta, "reserved_delta_bytes": self.reserved_delta,
                "grown_bytes": self.grown_bytes, "shrunk_bytes": self.shrunk_bytes, "more_stacks": self.more,
                "stacks": [{"stack": r.stack.split("\n"), "before_bytes": r.before_bytes, "after_bytes": r.after_bytes,
                            "delta_bytes": r.delta_bytes, "before_count": r.before_count,
                            "after_count": r.after_count} for r in self.rows]}


@dataclass(frozen=True)
class LiveAllocation:
    size: int
    requested_size: int
    address: int
    stack: str


def _live_blocks(mm: Any) -> pd.DataFrame:
    blocks: pd.DataFrame = mm.blocks
    if not len(blocks) or "state" not in blocks:
        return pd.DataFrame({"size": pd.Series([], dtype="int64"), "stack": pd.Series([], dtype=object)})
    live = blocks[blocks["state"].astype(str) == "active_allocated"]
    stack = live["stack"] if "stack" in live else live.get("frame", pd.Series([""] * len(live), index=live.index))
    return pd.DataFrame({"size": live["size"].astype("int64"),
                         "requested_size": live.get("requested_size", live["size"]).astype("int64"),
                         "address": live["address"].astype("int64"),
                         "stack": stack.astype(str).where(stack.astype(str) != "", NO_FRAMES)})


def map_totals(mm: Any) -> MapTotals:
    step = getattr(mm, "step", None)
    return MapTotals(step=None if step is None else int(step), label=str(getattr(mm, "reason", "") or ""),
                     reserved_bytes=int(mm.reserved_bytes), allocated_bytes=int(mm.allocated_bytes),
                     free_bytes=int(mm.free_bytes), largest_free_bytes=int(mm.largest_free_bytes),
                     fragmentation_pct=float(mm.fragmentation_pct), segments=len(mm.segments),
                     live=len(_live_blocks(mm)))


def largest_live(mm: Any, n: int = 20) -> list[LiveAllocation]:
    """The ``n`` largest live allocations of a snapshot, largest first, with the frames that made them."""
    live = _live_blocks(mm).sort_values("size", ascending=False, kind="stable").head(n)
    return [LiveAllocation(int(r.size), int(r.requested_size), int(r.address), str(r.stack))
            for r in live.itertuples(index=False)]


def snapshot_diff(before: Any, after: Any, top: int = 50) -> SnapshotDiff:
    """What changed from snapshot ``before`` to ``after`` (two :class:`gpudash.store.snapshot.MemoryMap`)."""
    groups = []
    for mm in (before, after):
        live = _live_blocks(mm)
        groups.append(live.groupby("stack", sort=False)["size"].agg(["sum", "count"]))
    index = groups[0].index.union(groups[1].index)
    a, b = (g.reindex(index, fill_value=0).astype("int64") for g in groups)
    joined = pd.DataFrame({"sum_a": a["sum"], "count_a": a["count"], "sum_b": b["sum"], "count_b": b["count"]},
                          index=index)
    joined["delta"] = joined["sum_b"] - joined["sum_a"]
    changed = joined[(joined["delta"] != 0) | (joined["count_a"] != joined["count_b"])]
    changed = changed.assign(key=-changed["delta"].abs()).sort_values(["delta", "key"], ascending=[False, True],
                                                                        kind="stable")
    grown = changed[changed["delta"] > 0]
    shrunk = changed[changed["delta"] < 0].sort_values("delta", kind="stable")
    # the most grown first, then the most shrunk, within ``top``
    keep = pd.concat([grown.head(max(1, top - min(len(shrunk), top // 4))), shrunk]).head(top)
    rows = [FrameChange(stack=str(s), before_bytes=int(r["sum_a"]), after_bytes=int(r["sum_b"]),
                        before_count=int(r["count_a"]), after_count=int(r["count_b"])) for s, r in keep.iterrows()]
    return SnapshotDiff(before=map_totals(before), after=map_totals(after), rows=rows,
                        grown_bytes=int(grown["delta"].sum()), shrunk_bytes=int(-shrunk["delta"].sum()),
                        more=len(changed) - len(rows))
