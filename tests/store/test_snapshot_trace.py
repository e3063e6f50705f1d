"""The allocation timeline (gpudash.analysis.snapshot_trace): stacking, the base layer, downsampling,
and totals that match the live bytes replayed independently from the trace."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudash.analysis.snapshot_trace import AllocTimeline, allocation_timeline
from gpudash.store.snapshot import load_snapshot, memory_map_from_summary, summarize

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real-snapshot" / "cs336_assignment2_memory_snapshot.pickle"
FRAME = {"filename": "/home/me/train.py", "line": 12, "name": "forward"}


def _entry(action: str, addr: int, size: int, t: int = 0, frames: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames or [FRAME]}


def _snap(trace: list[dict[str, Any]], blocks: list[dict[str, Any]] | None = None) -> Any:
    segments = [{"device": 0, "address": 1 << 30, "total_size": 1 << 20, "stream": 0, "blocks": blocks or []}]
    return memory_map_from_summary(summarize({"segments": segments, "device_traces": [trace]}))


def _stacked_ok(tl: AllocTimeline, x: int) -> int:
    """The bands alive at ``x`` touch end to end from 0 (no gap, no overlap); returns their top."""
    alive = sorted((b.low_at(x), b.size) for b in tl.bands if b.low_at(x) is not None)
    top = 0
    for low, size in alive:
        assert low == top, (x, alive)
        top += size
    return top


def test_a_freed_allocation_lets_the_ones_above_drop() -> None:
    tl = allocation_timeline(_snap([_entry("alloc", 100, 1000), _entry("alloc", 200, 300),
                                    _entry("free_requested", 100, 1000), _entry("free_completed", 100, 1000)]))
    assert tl is not None and tl.events == 3  # free_completed after free_requested is not a second free
    a, b = tl.bands
    assert (a.size, a.start, a.end, a.lows) == (1000, 1, 3, [0])
    assert (b.size, b.start, b.xs, b.lows) == (300, 2, [2, 3], [1000, 0])  # B drops when A goes
    assert b.end == 4  # still alive at the end
    assert list(tl.total) == [0, 1000, 1300, 300]
    assert "train.py:12 forward" in b.stack
    xs, ys = b.polygon()
    assert (xs[0], ys[0]) == (2, 1000) and (xs[-1], ys[-1]) == (2, 1000)  # closed
    assert max(ys) == 1300 and min(ys) == 0


def test_allocations_from_before_the_trace_are_the_base_layer() -> None:
    # block 7000 is active at the snapshot and never in the trace; 500 is freed without being allocated in it
    block = {"address": 7000, "size": 4096, "requested_size": 4000, "state": "active_allocated",
             "frames": [{"filename": "/home/me/model.py", "line": 3, "name": "__init__"}]}
    tl = allocation_timeline(_snap([_entry("alloc", 100, 10), _entry("free_requested", 500, 64),
                                    _entry("free_completed", 500, 64)], [block]))
    assert tl is not None
    base = [b for b in tl.bands if b.base]
    assert [(b.size, b.start) for b in base] == [(4000, 0), (64, 0)]
    assert base[0].end == tl.events + 1 and "model.py:3 __init__" in base[0].stack
    assert base[1].end == 2 and base[1].stack_of_free and not base[0].stack_of_free
    assert list(tl.total) == [4064, 4074, 4010]
    assert tl.base == 2 and tl.freed_before == 1


def _synthetic(n_events: int, seed: int = 0) -> tuple[pd.DataFrame, list[int]]:
    """A trace of allocs and frees (free_requested + free_completed) and the live bytes after each
    alloc or free_requested, replayed by hand."""
    rng = random.Random(seed)
    live: dict[int, int] = {}
    rows: list[tuple[str, int, int, str]] = []
    expect = [0]
    total = 0
    addr = 0
    counted = 0
    while counted < n_events:
        if live and (rng.random() < 0.5 or len(live) > 400):
            a = rng.choice(list(live))
            size = live.pop(a)
            total -= size
            rows += [("free_requested", a, size, f"f.py:{a % 50} g"), ("free_completed", a, size, "")]
        else:
            addr += 1
            size = int(rng.lognormvariate(12, 2)) + 1
            live[addr] = size
            total += size
            rows.append(("alloc", addr, size, f"model.py:{addr % 97} forward"))
        counted += 1
        expect.append(total)
    df = pd.DataFrame(rows, columns=["action", "address", "size", "stack"])
    df["device"] = 0
    df["time_us"] = np.arange(len(df), dtype=float)
    df["frame"] = df["stack"]
    return df, expect


def test_a_long_trace_is_bounded_keeps_the_largest_and_conserves_totals() -> None:
    df, expect = _synthetic(100_000)
    mm = SimpleNamespace(trace=df, blocks=pd.DataFrame(), segments=pd.DataFrame(), truncated_trace=0)
    tl = allocation_timeline(mm)
    assert tl is not None and tl.events == 100_000
    allocs = df[df["action"] == "alloc"]
    assert tl.allocations == len(allocs)
    assert 20 <= len(tl.bands) <= 200 and tl.merged == len(allocs) - len(tl.bands)
    assert tl.points <= 20_000
    # the largest allocations are drawn on their own (a quarter of the bands), the rest by area
    drawn = {b.address for b in tl.bands}
    largest = allocs.nlargest(len(tl.bands) // 4, "size")["address"]
    assert set(largest) <= drawn
    # totals conserved at every sampled x: bands stacked exactly, the merged band on top, the top = live bytes
    assert len(tl.x) > 100
    for x, drawn_top, total in zip(tl.x, tl.drawn, tl.total, strict=True):
        assert total == expect[x]
        assert _stacked_ok(tl, int(x)) == drawn_top <= total
    assert tl.peak_bytes == max(expect)


def test_the_merged_band_keeps_the_peak() -> None:
    # many small allocations and one brief spike of them: the spike's x is sampled
    trace = [_entry("alloc", i, 10) for i in range(1, 5001)]
    trace += [_entry("free_requested", i, 10) for i in range(1, 5001)]
    mm = _snap(trace)
    tl = allocation_timeline(mm, max_bands=5, buckets=50)
    assert tl is not None and len(tl.bands) == 5
    assert int(tl.total.max()) == 50_000 == tl.peak_bytes
    assert len(tl.x) < 300


def test_the_real_snapshot_timeline_matches_its_raw_trace() -> None:
    raw = pickle.loads(REAL.read_bytes())  # our own fixture: trusted
    trace = raw["device_traces"][0]
    # replayed independently: live requested bytes after each alloc / first free of an address
    live: dict[int, int] = {}
    freed_first: set[int] = set()
    before: list[tuple[int, int]] = []  # (x of the free, size) of allocations made before the trace began
    replay = [0]
    for e in trace:
        if e["action"] == "alloc":
            live[e["addr"]] = e["size"]
        elif e["action"] == "free_requested" or (e["action"] == "free_completed" and e["addr"] not in freed_first):
            if e["addr"] in live:
                del live[e["addr"]]
            else:
                before.append((len(replay), e["size"]))
        else:
            freed_first.discard(e["addr"])
            continue
        if e["action"] == "free_requested":
            freed_first.add(e["addr"])
        replay.append(sum(live.values()))
    assert before  # this trace starts mid-run: some frees have no alloc in it
    active = sum(b["requested_size"] for s in raw["segments"] for b in s["blocks"]
                 if b["state"] == "active_allocated" and b["address"] not in live)
    mm = load_snapshot(REAL)
    tl = allocation_timeline(mm)
    assert tl is not None and tl.events == 2 * 1721
    assert tl.freed_before == len(before)
    assert tl.base == len(before) + sum(1 for s in raw["segments"] for b in s["blocks"]
                                        if b["state"] == "active_allocated" and b["address"] not in live)
    for x, total in zip(tl.x, tl.total, strict=True):
        assert total == active + replay[x] + sum(size for at, size in before if at > x)
    assert int(tl.total[-1]) == mm.requested_bytes
    # allocations made in autograd's backward carry no Python frames in this file; the rest do
    assert sum(".py:" in b.stack for b in tl.bands) >= len(tl.bands) // 2
    assert tl.points <= 20_000


_entries = st.lists(st.tuples(st.sampled_from(["alloc", "free_requested", "free_completed", "segment_alloc", "oom"]),
                              st.integers(0, 12), st.integers(0, 5000)), max_size=120)


@settings(max_examples=60, deadline=None)
@given(entries=_entries, max_bands=st.integers(1, 8))
def test_any_trace_stacks_exactly(entries: list[tuple[str, int, int]], max_bands: int) -> None:
    trace = [_entry(a, addr, size) for a, addr, size in entries]
    tl = allocation_timeline(_snap(trace), max_bands=max_bands, buckets=4)
    if tl is None:
        assert not any(a in ("alloc", "free_requested", "free_completed") for a, _, _ in entries)
        return
    for x, drawn_top in zip(tl.x, tl.drawn, strict=True):
        assert _stacked_ok(tl, int(x)) == drawn_top
    assert len(tl.bands) <= max_bands and tl.merged == tl.allocations - len(tl.bands)
    live: dict[int, int] = {}
    for a, addr, size in entries:
        if a == "alloc":
            live[addr] = size
        elif a.startswith("free"):
            live.pop(addr, None)
    assert tl.total[-1] == sum(live.values()) and tl.x[-1] == tl.events
