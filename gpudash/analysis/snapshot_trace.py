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

Pure numpy/pandas (no dash, no torch): figures are drawn by ``gpudash.server.layouts.snapshot_views``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["MAX_BANDS", "MAX_PIECES", "MAX_POINTS", "AllocTimeline", "Band", "TraceModel", "allocation_timeline", "live_bytes",
           "trace_model"]

#: Allocations drawn as bands of their own (the rest are merged).
MAX_BANDS = 200
#: Vertices of all polygons and the merged band's edges together.
MAX_POINTS = 20_000
#: Stretches of all bands where their lower edge holds still (``len(Band.xs)`` summed): the dashboard draws one
#: bar each, and the browser's cost is per bar (~0.2 ms each on this project's shared 2-core machine), so a trace
#: whose drawn bands drop many times draws fewer of them on their own.
MAX_PIECES = 1_500
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
    #: the x range drawn (a zoom), None for the whole trace; ``peak_*`` are then the window's
    window: tuple[int, int] | None = None
    #: allocations alive in the window (all of them for the whole trace)
    in_window: int = 0

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


@dataclass
class TraceModel:
    """One device's trace as allocations (numpy columns, one row per allocation), computed once per map:
    the whole timeline and every zoomed window are drawn from it.

    Rows: allocations alive for the whole trace (active in the snapshot, never allocated in it; largest
    first), then those freed in the trace but made before it (freed latest first), then the trace's own
    allocations in order. ``total``: live bytes at every x in ``0..events``."""

    size: np.ndarray
    start: np.ndarray
    end: np.ndarray
    address: np.ndarray
    stack: np.ndarray
    base: np.ndarray
    stack_of_free: np.ndarray
    events: int
    x_time: np.ndarray
    total: np.ndarray
    device: int
    freed_before: int
    ignored: dict[str, int]

    def alloc(self, i: int) -> _Alloc:
        return _Alloc(int(self.size[i]), int(self.start[i]), int(self.end[i]), int(self.address[i]),
                      str(self.stack[i]), bool(self.base[i]), bool(self.stack_of_free[i]))


def _events(trace: pd.DataFrame) -> tuple[dict[str, np.ndarray], int, np.ndarray, dict[str, int]]:
    """Allocations of one device's trace as columns (those freed but made before it first, freed latest
    first, then the trace's in order of allocation), the number of events (x steps) and the time of each x.

    An event is an alloc or a free; a ``free_completed`` right after the same address's ``free_requested``
    (or ``free``) is the same free and no second event. An address allocated twice ends the first (the trace
    lost its free); a free without an alloc before it in the trace frees an allocation older than the trace."""
    act_codes, act_names = _labels(trace["action"])
    addrs = trace["address"].to_numpy(dtype=np.int64)
    sizes = trace["size"].to_numpy(dtype=np.int64)
    stacks = (trace["stack"] if "stack" in trace else trace.get("frame", pd.Series([""] * len(trace))))
    stack_codes, stack_names = _labels(stacks)
    times = pd.to_numeric(trace["time_us"], errors="coerce").to_numpy(dtype=float) if "time_us" in trace \
        else np.full(len(trace), np.nan)
    def of(*names: str) -> np.ndarray:
        return np.array([a in names for a in act_names], dtype=bool)[act_codes]

    is_alloc = of("alloc")
    is_free = of("free_requested", "free")
    is_done = of("free_completed")
    kept = is_alloc | is_free | is_done
    ignored: dict[str, int] = {}
    if not kept.all():
        codes, counts = np.unique(act_codes[~kept], return_counts=True)
        ignored = {str(act_names[k]): int(v) for k, v in zip(codes, counts, strict=True)}
    pos = np.flatnonzero(kept)
    by_addr = pos[np.argsort(addrs[pos], kind="stable")]  # by address, then in trace order
    same = np.r_[False, addrs[by_addr][1:] == addrs[by_addr][:-1]]
    prev_free = np.r_[False, is_free[by_addr][:-1]]
    skip = np.zeros(len(act_codes), dtype=bool)
    skip[by_addr[same & prev_free & is_done[by_addr]]] = True
    ev = np.flatnonzero(kept & ~skip)  # the events, in trace order; event k is at x = k + 1
    n = len(ev)
    x_of = np.zeros(len(act_codes), dtype=np.int64)
    x_of[ev] = np.arange(1, n + 1)
    x_time = np.r_[times[0] if len(times) else np.nan, times[ev]]
    order = by_addr[~skip[by_addr]]  # the events by address, then in trace order (a stable sort's subsequence)
    same_next = np.r_[addrs[order][1:] == addrs[order][:-1], False]
    same_prev = np.r_[False, same_next[:-1]]
    a_sorted = is_alloc[order]
    # an allocation ends at the next event of its address (its free, or an alloc that found it still there)
    end_sorted = np.where(same_next, np.r_[x_of[order][1:], 0], n + 1)
    alloc_rows = order[a_sorted]
    alloc_end = end_sorted[a_sorted]
    # in x order: each x holds one event, so a slot per x places them without a sort
    slot = np.full(n + 1, -1, dtype=np.int64)
    slot[x_of[alloc_rows]] = np.arange(len(alloc_rows))
    by_x = slot[slot >= 0]
    alloc_rows, alloc_end = alloc_rows[by_x], alloc_end[by_x]
    # a free whose address had no alloc before it in the trace: alive before the trace began
    orphan = ~a_sorted & ~(same_prev & np.r_[False, a_sorted[:-1]])
    base_rows = order[orphan]
    base_rows = base_rows[np.argsort(-x_of[base_rows], kind="stable")]
    nb, na = len(base_rows), len(alloc_rows)
    cols = {
        "size": np.r_[sizes[base_rows], sizes[alloc_rows]],
        "start": np.r_[np.zeros(nb, np.int64), x_of[alloc_rows]],
        "end": np.r_[x_of[base_rows], alloc_end].astype(np.int64),
        "address": np.r_[addrs[base_rows], addrs[alloc_rows]],
        "stack": stack_names[np.r_[stack_codes[base_rows], stack_codes[alloc_rows]]],
        "base": np.r_[np.ones(nb, bool), np.zeros(na, bool)],
        "stack_of_free": np.r_[np.ones(nb, bool), np.zeros(na, bool)],
    }
    return cols, n, np.asarray(x_time, dtype=float), ignored


def _labels(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A string column as (codes, names): a categorical's own (a stored trace), else factorized."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        names = np.asarray(col.cat.categories.astype(str), dtype=object)
        codes = col.cat.codes.to_numpy(dtype=np.int64)
        if (codes < 0).any():  # a missing value: ""
            names = np.r_[names, np.array([""], dtype=object)]
            codes = np.where(codes < 0, len(names) - 1, codes)
        return codes, names
    codes, uniques = pd.factorize(col.astype(str), sort=False)
    return codes.astype(np.int64), np.asarray(uniques, dtype=object)


def _still_active(mm: Any, device: int, live_addresses: np.ndarray, end: int) -> dict[str, np.ndarray]:
    """Blocks active in the snapshot that the trace never allocated: alive for its whole length (largest first)."""
    blocks: pd.DataFrame = getattr(mm, "blocks", pd.DataFrame())
    segs: pd.DataFrame = getattr(mm, "segments", pd.DataFrame())
    empty = {"size": np.zeros(0, np.int64), "address": np.zeros(0, np.int64), "stack": np.zeros(0, object)}
    if not len(blocks) or "state" not in blocks:
        return empty
    b = blocks[blocks["state"].astype(str) == "active_allocated"]
    if "device" in segs and "address" in segs and "segment_address" in b:
        on_device = segs.loc[segs["device"] == device, "address"].astype("int64")
        b = b[b["segment_address"].isin(on_device)]
    size_col = "requested_size" if "requested_size" in b else "size"
    stack_col = "stack" if "stack" in b else "frame" if "frame" in b else None
    addr = b["address"].astype("int64").to_numpy()
    size = b[size_col].astype("int64").to_numpy()
    stack = b[stack_col].astype(str).to_numpy(dtype=object) if stack_col else np.full(len(b), "", dtype=object)
    keep = ~np.isin(addr, live_addresses) & (size > 0)
    addr, size, stack = addr[keep], size[keep], stack[keep]
    order = np.argsort(-size, kind="stable")
    return {"size": size[order], "address": addr[order], "stack": stack[order]}


def live_bytes(allocs: Any, n: int) -> np.ndarray:
    """Live bytes at every x in ``0..n`` of allocations alive on ``[start, end)`` (a list of allocations,
    or a :class:`TraceModel`)."""
    if isinstance(allocs, TraceModel):
        start, end, size = allocs.start, allocs.end, allocs.size
    else:
        start = np.array([a.start for a in allocs], dtype=np.int64)
        end = np.array([a.end for a in allocs], dtype=np.int64)
        size = np.array([a.size for a in allocs], dtype=np.int64)
    return _live(start, end, size, n)


def _live(start: np.ndarray, end: np.ndarray, size: np.ndarray, n: int) -> np.ndarray:
    delta = np.zeros(n + 2, dtype=np.int64)
    np.add.at(delta, start, size)
    np.add.at(delta, np.minimum(end, n + 1), -size)
    return np.cumsum(delta)[: n + 1]


def trace_model(mm: Any, device: int | None = None) -> TraceModel | None:
    """The allocations of ``mm``'s trace on ``device`` (default: the device with the most entries), None if
    it has no trace or no alloc or free in it."""
    trace: pd.DataFrame | None = getattr(mm, "trace", None)
    if trace is None or not len(trace) or "action" not in trace:
        return None
    if device is None:
        device = int(trace["device"].astype("int64").value_counts().index[0]) if "device" in trace else 0
    if "device" in trace:
        trace = trace[trace["device"] == device]
    cols, n, x_time, ignored = _events(trace.reset_index(drop=True))
    if n == 0:
        return None
    live_at_end = cols["address"][cols["end"] == n + 1]
    old = _still_active(mm, device, live_at_end, n + 1)
    k = len(old["size"])
    freed_before = int(cols["base"].sum())
    model = TraceModel(
        size=np.r_[old["size"], cols["size"]], start=np.r_[np.zeros(k, np.int64), cols["start"]],
        end=np.r_[np.full(k, n + 1, np.int64), cols["end"]], address=np.r_[old["address"], cols["address"]],
        stack=np.r_[old["stack"], cols["stack"]], base=np.r_[np.ones(k, bool), cols["base"]],
        stack_of_free=np.r_[np.zeros(k, bool), cols["stack_of_free"]], events=n, x_time=x_time,
        total=np.zeros(0, np.int64), device=device, freed_before=freed_before, ignored=ignored)
    model.total = live_bytes(model, n)
    return model


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


def _samples(drawn_total: np.ndarray, total: np.ndarray, buckets: int, lo: int = 0) -> np.ndarray:
    """x positions kept for the merged band (offsets into ``total``, plus ``lo``): both ends, every change of
    the bands' total, and the first minimum and maximum of the live bytes in each of ``buckets`` equal spans."""
    n = len(total)
    keep = [np.array([0, n - 1])]
    keep.append(np.flatnonzero(np.diff(drawn_total)) + 1)
    if n <= 2 * buckets:
        keep.append(np.arange(n))
    else:
        edges = np.linspace(0, n, buckets + 1).astype(np.int64)
        bucket = np.repeat(np.arange(buckets), np.diff(edges))
        # the first maximum and minimum of each bucket: its extreme (reduceat), then the first x holding it
        for extreme in (np.maximum.reduceat(total, edges[:-1]), np.minimum.reduceat(total, edges[:-1])):
            hit = np.flatnonzero(total == extreme[bucket])
            keep.append(hit[np.r_[True, np.diff(bucket[hit]) != 0]])
    return np.unique(np.concatenate(keep)) + lo


def _first(k: int, keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Positions of the first ``k`` rows in ``np.lexsort(keys)`` order (the last key primary), sorting only
    the rows that can be among them (those at or under the k-th smallest primary key)."""
    primary = keys[-1]
    if len(primary) > 4 * k > 0:
        cut = np.partition(primary, k - 1)[k - 1]
        rows = np.flatnonzero(primary <= cut)
    else:
        rows = np.arange(len(primary))
    return rows[np.lexsort(tuple(key[rows] for key in keys))][:k]


def allocation_timeline(mm: Any, *, max_bands: int = MAX_BANDS, max_points: int = MAX_POINTS,
                        max_pieces: int = MAX_PIECES, buckets: int = BUCKETS, device: int | None = None, window: tuple[float, float] | None = None,
                        model: TraceModel | None = None) -> AllocTimeline | None:
    """The timeline of ``mm``'s trace (a :class:`gpudash.store.snapshot.MemoryMap`), None if it has none.

    ``device``: the trace's device to draw (default: the one with the most entries). ``window``: the x range
    to draw (a zoom): bands go to the allocations covering the most of it, the merged band is sampled within
    it (every event when it holds at most ``2 * buckets``). Fewer bands than ``max_bands`` when theirs would
    exceed ``max_points`` vertices or ``max_pieces`` stretches. ``model``: :func:`trace_model` of ``mm``, if made."""
    model = model if model is not None else trace_model(mm, device)
    if model is None:
        return None
    n = model.events
    lo, hi = 0, n
    if window is not None:
        lo = int(np.clip(np.floor(min(window)), 0, n))
        hi = int(np.clip(np.ceil(max(window)), lo, n))
    total_all = model.total
    alive = np.flatnonzero((model.start <= hi) & (model.end > lo))
    start, end, size = model.start[alive], model.end[alive], model.size[alive]
    life = np.minimum(end, hi + 1) - np.maximum(start, lo)
    # bands for the allocations covering the most area (size x lifetime, within the window), and a quarter of
    # them for the largest by size (a brief spike); the rest are merged
    k0 = min(max_bands, len(alive))
    by_size = alive[_first(max(1, k0 // 4), (alive, -life, -size))]
    by_area = alive[_first(k0 + k0 // 4 + 1, (alive, -(size * life)))]
    budget = max(1, max_points - 2 * (2 * buckets + 2))

    def attempt(k: int) -> tuple[bool, set[int], list[Band], float]:
        drawn = set(by_size[:max(1, k // 4)].tolist())
        for i in by_area[:k + k // 4 + 1].tolist():  # k distinct ones whatever the largest took
            if len(drawn) >= k:
                break
            drawn.add(i)
        allocs = {i: model.alloc(i) for i in drawn}
        order = sorted(drawn)
        bands = _stack([allocs[i] for i in order], set(range(len(order))))
        used = sum(b.points for b in bands) + 2 * 2 * k  # the merged band's lower edge changes at most 2k times
        pieces = sum(len(b.xs) for b in bands)
        fits = (used <= budget and pieces <= max_pieces) or k <= 1
        return fits, drawn, bands, min(0.8, budget / used, max_pieces / max(pieces, 1))

    # the most bands that fit: shrink until some fit, then halve the gap to the fewest that did not
    k = min(max_bands, len(alive))
    best: tuple[int, set[int], list[Band]] | None = None
    over: int | None = None
    while True:
        fits, drawn, bands, shrink = attempt(k)
        if fits:
            best = (k, drawn, bands)
        else:
            over = k
        if best is not None and (over is None or over - best[0] <= max(1, best[0] // 20)):
            break
        k = max(1, int(k * shrink)) if best is None or over is None else (best[0] + over) // 2
    _, drawn, bands = best
    x_time = model.x_time
    for b in bands:
        b.alloc_us = float(x_time[b.start]) if not b.base else float("nan")
        b.free_us = float(x_time[b.end]) if b.end <= n else float("nan")
    idx = np.fromiter(drawn, dtype=np.int64, count=len(drawn))
    drawn_total = _live(model.start[idx], model.end[idx], model.size[idx], n)
    xs = _samples(drawn_total[lo:hi + 1], total_all[lo:hi + 1], buckets, lo)
    peak_x = lo + int(np.argmax(total_all[lo:hi + 1]))
    return AllocTimeline(
        bands=bands, x=xs, drawn=drawn_total[xs], total=total_all[xs], time_us=x_time[np.minimum(xs, len(x_time) - 1)],
        allocations=len(model.size), merged=len(model.size) - len(bands), base=int(model.base.sum()), events=n,
        device=model.device, peak_bytes=int(total_all[peak_x]), peak_x=peak_x,
        truncated=int(getattr(mm, "truncated_trace", 0) or 0), ignored_actions=model.ignored,
        freed_before=model.freed_before, window=None if window is None else (lo, hi),
        in_window=len(alive))
