"""The allocation timeline of a snapshot's trace: every allocation a band over time, stacked.

As PyTorch's memory_viz "Active Memory Timeline": x is the event index (one step per
allocation or free in the trace), each live allocation a band of its size; a new allocation
goes on top of the stack, and when one is freed every band above it drops down by its size,
so the top of the stack is always the live bytes. Allocations alive before the trace began
(freed in the trace without having been allocated in it, or still active in a segment at
the end) form the bottom of the stack, the longest-lived lowest.

The bands are bounded for the browser: ``max_bands`` allocations keep bands of their own (a
quarter the largest by size, the others those covering the most area, size x lifetime) and
every other one is merged into one "smaller allocations" band drawn on top of
them (its upper edge sampled at ``buckets`` minima and maxima of the live bytes, so peaks
survive); the number of bands is lowered until all polygons together hold at most
``max_points`` vertices. Every vertex is exact: at each sampled x the bands and the merged
band stack to the live bytes at that event. Sizes are the trace's (requested) bytes.

Pure numpy/pandas (no dash, no torch): figures are drawn by ``gpudash.layouts.snapshot_views``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["MAX_BANDS", "MAX_POINTS", "AllocTimeline", "Band", "allocation_timeline", "live_bytes"]

#: Allocations drawn as bands of their own (the rest are merged).
MAX_BANDS = 200
#: Vertices of all polygons and the merged band's edges together.
MAX_POINTS = 20_000
#: Buckets of the merged band's upper edge (a minimum and a maximum kept in each).
BUCKETS = 1_000

_ALLOC = frozenset({"alloc"})
_FREE = frozenset({"free_requested", "free"})
_FREE_DONE = "free_completed"


@dataclass
class Band:
    """One allocation drawn on its own: alive on x in ``[start, end)`` with ``size`` bytes; its
    lower edge is ``lows[i]`` from ``xs[i]`` on (a step function, ``xs[0] == start``)."""

    size: int
    start: int
    end: int
    address: int
    stack: str
    base: bool
    xs: list[int] = field(default_factory=list)
    lows: list[int] = field(default_factory=list)
    #: the trace's clock (µs) at the allocation and at the free (NaN where unknown)
    alloc_us: float = float("nan")
    free_us: float = float("nan")
    #: ``stack`` is where it was freed (an allocation older than the trace: its alloc is not in it)
    stack_of_free: bool = False

    def low_at(self, x: int) -> int | None:
        """The band's lower edge at ``x`` (None where it is not alive)."""
        if not self.start <= x < self.end:
            return None
        i = int(np.searchsorted(self.xs, x, side="right")) - 1
        return self.lows[i]

    def polygon(self) -> tuple[list[int], list[int]]:
        """Closed outline: the lower edge left to right, the upper edge back, drawn as vertical steps."""
        lx: list[int] = []
        ly: list[int] = []
        for i, (x, low) in enumerate(zip(self.xs, self.lows, strict=True)):
            if i:
                lx.append(x)
                ly.append(self.lows[i - 1])
            lx.append(x)
            ly.append(low)
        lx.append(self.end)
        ly.append(self.lows[-1])
        ux = lx[::-1]
        uy = [y + self.size for y in ly[::-1]]
        return lx + ux + [lx[0]], ly + uy + [ly[0]]

    @property
    def points(self) -> int:
        return 4 * len(self.xs) + 1


@dataclass
class AllocTimeline:
    """Bands, the merged band and what the chart should say about them.

    ``x``: the sampled event positions of the merged band (every change of the drawn bands'
    total, and a minimum and maximum of the live bytes per bucket); ``drawn`` and ``total``:
    the bands' total (the merged band's lower edge) and the live bytes there. ``time_us``: the
    trace's clock at each x (NaN where it has none). ``x`` runs from 0 (before the first event)
    to ``events``.
    """

    bands: list[Band]
    x: np.ndarray
    drawn: np.ndarray
    total: np.ndarray
    time_us: np.ndarray
    allocations: int
    merged: int
    base: int
    events: int
    device: int
    peak_bytes: int
    peak_x: int
    truncated: int = 0
    #: allocations freed in the trace but made before it: the history starts mid-run (a ring buffer)
    freed_before: int = 0
    ignored_actions: dict[str, int] = field(default_factory=dict)

    @property
    def points(self) -> int:
        return sum(b.points for b in self.bands) + 2 * len(self.x)


@dataclass
class _Alloc:
    size: int
    start: int
    end: int
    address: int
    stack: str
    base: bool
    stack_of_free: bool = False


def _events(trace: pd.DataFrame) -> tuple[list[_Alloc], int, np.ndarray, dict[str, int]]:
    """Allocations (in order of allocation; those alive before the trace get ``base``), the number of
    events (x steps) and the time of each x, from one device's trace."""
    actions = trace["action"].astype(str).to_numpy()
    addrs = trace["address"].to_numpy(dtype=np.int64)
    sizes = trace["size"].to_numpy(dtype=np.int64)
    stacks = (trace["stack"] if "stack" in trace else trace.get("frame", pd.Series([""] * len(trace))))
    stack_list = stacks.astype(str).tolist()
    times = pd.to_numeric(trace["time_us"], errors="coerce").to_numpy(dtype=float) if "time_us" in trace \
        else np.full(len(trace), np.nan)
    allocs: list[_Alloc] = []
    base_freed: list[_Alloc] = []
    live: dict[int, _Alloc] = {}
    pending: set[int] = set()
    ignored: dict[str, int] = {}
    x_time = [times[0] if len(times) else np.nan]
    n = 0
    for i, action in enumerate(actions):
        addr = int(addrs[i])
        if action in _ALLOC:
            n += 1
            old = live.pop(addr, None)
            if old is not None:  # an address allocated twice: the trace lost its free
                old.end = n
            a = _Alloc(int(sizes[i]), n, -1, addr, stack_list[i], False)
            live[addr] = a
            allocs.append(a)
            pending.discard(addr)
        elif action in _FREE or action == _FREE_DONE:
            if action == _FREE_DONE and addr in pending:
                pending.discard(addr)  # its free_requested already ended it
                continue
            n += 1
            a_live = live.pop(addr, None)
            if a_live is None:  # freed without being allocated in the trace: alive before it began
                base_freed.append(_Alloc(int(sizes[i]), 0, n, addr, stack_list[i], True, True))
            else:
                a_live.end = n
            if action != _FREE_DONE:
                pending.add(addr)
        else:
            ignored[action] = ignored.get(action, 0) + 1
            continue
        x_time.append(times[i])
    for a in live.values():
        a.end = n + 1
    # the base layer: freed latest lowest, so the fewest bands drop when one ends (as memory_viz)
    base = sorted(base_freed, key=lambda a: -a.end)
    return base + allocs, n, np.asarray(x_time, dtype=float), ignored


def _still_active(mm: Any, device: int, live_addresses: set[int], end: int) -> list[_Alloc]:
    """Blocks active in the snapshot that the trace never allocated: alive for its whole length."""
    blocks: pd.DataFrame = getattr(mm, "blocks", pd.DataFrame())
    segs: pd.DataFrame = getattr(mm, "segments", pd.DataFrame())
    if not len(blocks) or "state" not in blocks:
        return []
    b = blocks[blocks["state"].astype(str) == "active_allocated"]
    if "device" in segs and "address" in segs and "segment_address" in b:
        on_device = set(segs.loc[segs["device"] == device, "address"].astype("int64").tolist())
        b = b[b["segment_address"].isin(on_device)]
    size_col = "requested_size" if "requested_size" in b else "size"
    stack_col = "stack" if "stack" in b else "frame" if "frame" in b else None
    out = []
    for row in zip(b["address"].astype("int64"), b[size_col].astype("int64"),
                   b[stack_col].astype(str) if stack_col else [""] * len(b), strict=True):
        addr, size, stack = int(row[0]), int(row[1]), row[2]
        if addr not in live_addresses and size > 0:
            out.append(_Alloc(size, 0, end, addr, stack, True))
    return sorted(out, key=lambda a: -a.size)


def live_bytes(allocs: list[Any], n: int) -> np.ndarray:
    """Live bytes at every x in ``0..n`` of allocations alive on ``[start, end)``."""
    delta = np.zeros(n + 2, dtype=np.int64)
    for a in allocs:
        delta[a.start] += a.size
        delta[min(a.end, n + 1)] -= a.size
    return np.cumsum(delta)[: n + 1]


def _stack(allocs: list[_Alloc], drawn: set[int]) -> list[Band]:
    """Offsets of the drawn allocations: each goes on top when allocated, those above drop when one ends."""
    order = sorted(drawn, key=lambda i: (allocs[i].start, i))
    ends: dict[int, list[int]] = {}
    for i in order:
        ends.setdefault(allocs[i].end, []).append(i)
    bands: dict[int, Band] = {}
    current: list[int] = []
    top = 0
    # events in x order: at one x, ends first (a band freed at x is gone at x), then starts
    starts: dict[int, list[int]] = {}
    for i in order:
        starts.setdefault(allocs[i].start, []).append(i)
    for x in sorted(set(starts) | set(ends)):
        for i in ends.get(x, []):
            if i not in bands:
                continue
            pos = current.index(i)
            size = allocs[i].size
            for j in current[pos + 1:]:
                bj = bands[j]
                bj.xs.append(x)
                bj.lows.append(bj.lows[-1] - size)
            current.pop(pos)
            top -= size
        for i in starts.get(x, []):
            a = allocs[i]
            if a.end <= a.start:
                continue
            bands[i] = Band(a.size, a.start, a.end, a.address, a.stack, a.base, [x], [top],
                            stack_of_free=a.stack_of_free)
            current.append(i)
            top += a.size
    for b in bands.values():  # two changes at one x (several frees): keep the last
        xs: list[int] = []
        lows: list[int] = []
        for x, low in zip(b.xs, b.lows, strict=True):
            if xs and xs[-1] == x:
                lows[-1] = low
            else:
                xs.append(x)
                lows.append(low)
        b.xs, b.lows = xs, lows
    return [bands[i] for i in sorted(bands, key=lambda i: (allocs[i].start, i))]


def _samples(drawn_total: np.ndarray, total: np.ndarray, buckets: int) -> np.ndarray:
    """x positions kept for the merged band: both ends, every change of the bands' total, and the
    first minimum and maximum of the live bytes in each of ``buckets`` equal spans."""
    n = len(total)
    keep = [np.array([0, n - 1])]
    keep.append(np.flatnonzero(np.diff(drawn_total)) + 1)
    if n <= 2 * buckets:
        keep.append(np.arange(n))
    else:
        edges = np.linspace(0, n, buckets + 1).astype(np.int64)
        idx = np.arange(n)
        bucket = np.searchsorted(edges, idx, side="right") - 1
        # argmax/argmin per bucket through sorting by (bucket, value)
        order_max = np.lexsort((-total, bucket))
        order_min = np.lexsort((total, bucket))
        first = np.flatnonzero(np.r_[True, np.diff(bucket[order_max]) != 0])
        keep.append(order_max[first])
        keep.append(order_min[np.flatnonzero(np.r_[True, np.diff(bucket[order_min]) != 0])])
    return np.unique(np.concatenate(keep))


def allocation_timeline(mm: Any, *, max_bands: int = MAX_BANDS, max_points: int = MAX_POINTS,
                        buckets: int = BUCKETS, device: int | None = None) -> AllocTimeline | None:
    """The timeline of ``mm``'s trace (a :class:`gpudash.store.snapshot.MemoryMap`), None if it has none.

    ``device``: the trace's device to draw (default: the one with the most entries)."""
    trace: pd.DataFrame | None = getattr(mm, "trace", None)
    if trace is None or not len(trace) or "action" not in trace:
        return None
    if device is None:
        device = int(trace["device"].astype("int64").value_counts().index[0]) if "device" in trace else 0
    if "device" in trace:
        trace = trace[trace["device"] == device]
    allocs, n, x_time, ignored = _events(trace.reset_index(drop=True))
    if n == 0:
        return None
    live_at_end = {a.address for a in allocs if a.end == n + 1}
    allocs = _still_active(mm, device, live_at_end, n + 1) + allocs
    total = live_bytes(allocs, n)
    # bands for the allocations covering the most area (size x lifetime), and a quarter of them for the
    # largest by size (a brief spike); the rest are merged
    by_size = sorted(range(len(allocs)), key=lambda i: (-allocs[i].size, -(allocs[i].end - allocs[i].start), i))
    by_area = sorted(range(len(allocs)), key=lambda i: (-allocs[i].size * (allocs[i].end - allocs[i].start), i))
    budget = max(1, max_points - 2 * (2 * buckets + 2))
    k = min(max_bands, len(allocs))
    while True:
        drawn = set(by_size[:max(1, k // 4)])
        for i in by_area:
            if len(drawn) >= k:
                break
            drawn.add(i)
        bands = _stack(allocs, drawn)
        used = sum(b.points for b in bands) + 2 * 2 * k  # the merged band's lower edge changes at most 2k times
        if used <= budget or k <= 1:
            break
        k = max(1, int(k * min(0.8, budget / used)))
    for b in bands:
        b.alloc_us = float(x_time[b.start]) if not b.base else float("nan")
        b.free_us = float(x_time[b.end]) if b.end <= n else float("nan")
    drawn_total = live_bytes([allocs[i] for i in drawn], n)
    xs = _samples(drawn_total, total, buckets)
    peak_x = int(np.argmax(total))
    return AllocTimeline(
        bands=bands, x=xs, drawn=drawn_total[xs], total=total[xs], time_us=x_time[np.minimum(xs, len(x_time) - 1)],
        allocations=len(allocs), merged=len(allocs) - len(bands), base=sum(a.base for a in allocs), events=n,
        device=device, peak_bytes=int(total[peak_x]), peak_x=peak_x,
        truncated=int(getattr(mm, "truncated_trace", 0) or 0), ignored_actions=ignored,
        freed_before=sum(a.base and a.end <= n for a in allocs))
