"""Allocator snapshots as memory maps: store, load, turn back into :class:`MemoryMap`.

The capture side (``gpudash.collectors.snapshots``) and ``gpudash import-snapshot`` both
:func:`~gpudash.store.snapshot_read.summarize` a torch snapshot dict (read safely by
:func:`~gpudash.store.snapshot_read.read_snapshot_pickle`) into a compact columnar summary and
store it (:mod:`gpudash.store.snapshot_codec`: zlib'd numpy columns, every trace entry) in the
``snapshots`` table with format :data:`SUMMARY_FORMAT`. :func:`snapshots_from_frame` turns those rows
back into :class:`MemoryMap` objects, inflating each only to the rows it declares (a crafted run
database cannot make a zlib bomb of it); the trace's strings come back as categoricals.
The allocation timeline drawn from a map's trace is :mod:`gpudash.analysis.snapshot_trace`.
No torch here: a laptop reads them.
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudash.store.snapshot_codec import MAX_V1_BYTES, decode_summary, encode_summary, snapshot_row
from gpudash.store.snapshot_read import (
    BLOCK_COLUMNS,
    MAX_BLOCKS,
    MAX_NODES,
    MAX_TRACE,
    NA_INT,
    SEGMENT_COLUMNS,
    SUMMARY_FORMAT,
    SUMMARY_FORMAT_V1,
    TRACE_COLUMNS,
    no_gc,
    node_budget,
    open_snapshot_file,
    read_snapshot_pickle,
    summarize,
    top_frame,
)

__all__ = [
    "MAX_BLOCKS",
    "MAX_NODES",
    "MAX_SUMMARY_BYTES",
    "MAX_TRACE",
    "SUMMARY_FORMAT",
    "SUMMARY_FORMAT_V1",
    "MemoryMap",
    "decode_summary",
    "encode_summary",
    "load_snapshot",
    "memory_map_from_summary",
    "node_budget",
    "open_snapshot_file",
    "read_snapshot_pickle",
    "snapshot_row",
    "snapshots_from_frame",
    "summarize",
    "top_frame",
]

#: Largest decompressed v1 summary read back from a run database.
MAX_SUMMARY_BYTES = MAX_V1_BYTES


@dataclass
class MemoryMap:
    """The allocator's memory at one moment.

    ``segments``: one row per cudaMalloc'd segment (``device``, ``address``,
    ``total_size``, ``allocated_size``, ``active_size``, ``requested_size``,
    ``stream``, ``segment_type``, ``is_expandable``, ``blocks`` = block count).
    ``blocks``: one row per block (``segment_address``, ``address``, ``size``,
    ``requested_size``, ``state``, ``frame`` = the top user frame that allocated
    it, or ``""``; ``stack`` = a few user frames, one per line). ``trace``: the
    allocation history when it was recorded (``device``, ``action``, ``address``,
    ``size``, ``stream``, ``time_us``, ``device_free``, ``frame``, ``stack``), else
    None. Sizes are bytes.
    """

    segments: pd.DataFrame
    blocks: pd.DataFrame
    reserved_bytes: int
    allocated_bytes: int
    active_bytes: int
    requested_bytes: int
    free_bytes: int
    largest_free_bytes: int
    trace: pd.DataFrame | None = None
    time: float | None = None
    step: int | None = None
    reason: str = ""
    rank: int | None = None
    #: blocks and trace entries left out of the stored summary (MAX_BLOCKS, MAX_TRACE)
    truncated_blocks: int = 0
    truncated_trace: int = 0
    allocator_settings: dict[str, Any] = field(default_factory=dict)

    @property
    def fragmentation_pct(self) -> float:
        """Share of free reserved memory that is not in the largest free block."""
        if self.free_bytes <= 0:
            return 0.0
        return 100.0 * (1.0 - self.largest_free_bytes / self.free_bytes)

    def __repr__(self) -> str:
        return (f"MemoryMap(step={self.step}, reason={self.reason!r}, segments={len(self.segments)}, "
                f"blocks={len(self.blocks)}, reserved={self.reserved_bytes}, allocated={self.allocated_bytes}, "
                f"free={self.free_bytes}, largest_free={self.largest_free_bytes})")


# ---- summaries back to memory maps ------------------------------------------------------------
def memory_map_from_summary(summary: dict[str, Any], *, time: float | None = None, step: int | None = None,
                            reason: str = "", rank: int | None = None) -> MemoryMap:
    """The memory map a summary (v2 columns, or a v1 JSON dict) describes."""
    if summary.get("format") == SUMMARY_FORMAT_V1:
        seg, blocks, trace = _frames_v1(summary)
    else:
        seg, blocks, trace = _frames_v2(summary)
    inactive = blocks.loc[blocks["state"] == "inactive", "size"]
    reserved = int(seg["total_size"].sum())
    allocated = int(seg["allocated_size"].sum())
    free = int(inactive.sum()) if summary.get("truncated_blocks", 0) == 0 else reserved - allocated
    return MemoryMap(
        segments=seg,
        blocks=blocks,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        active_bytes=int(seg["active_size"].sum()),
        requested_bytes=int(seg["requested_size"].sum()),
        free_bytes=free,
        largest_free_bytes=int(inactive.max()) if len(inactive) else 0,
        trace=trace,
        time=time,
        step=step,
        reason=reason,
        rank=rank,
        truncated_blocks=int(summary.get("truncated_blocks") or 0),
        truncated_trace=int(summary.get("truncated_trace") or 0),
        allocator_settings=dict(summary.get("allocator_settings") or {}),
    )


def _segments(summary: dict[str, Any]) -> pd.DataFrame:
    seg = pd.DataFrame({c: summary["segments"].get(c, []) for c in SEGMENT_COLUMNS})
    for c in ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
              "blocks"):
        seg[c] = seg[c].astype("int64")
    return seg


def _table(items: Any, what: str) -> np.ndarray:
    """A string table as an object array (ids index it; index 0 is "")."""
    if not isinstance(items, list):
        raise ValueError(f"snapshot summary has no {what} table")
    out = np.empty(len(items) + 1, dtype=object)
    out[:-1] = [i if isinstance(i, str) else "" for i in items]
    out[-1] = ""  # where an id is out of range
    return out


def _take(table: np.ndarray, ids: Any) -> np.ndarray:
    ids = np.asarray(ids, dtype=np.int64)
    bad = (ids < 0) | (ids >= len(table) - 1)
    return table[np.where(bad, len(table) - 1, ids)]


def _category(table: np.ndarray, ids: Any) -> pd.Categorical:
    """A string column of a million rows as codes into its table (no string per row to build or convert)."""
    ids = np.asarray(ids, dtype=np.int64)
    ids = np.where((ids < 0) | (ids >= len(table) - 1), len(table) - 1, ids)
    uniq, inverse = np.unique(np.asarray(table, dtype=str), return_inverse=True)
    cat = pd.Categorical.from_codes(inverse.reshape(-1)[ids], categories=pd.Index(uniq))  # type: ignore[call-overload]
    return cat.remove_unused_categories()  # value_counts() lists only what occurs


def _frames_v2(summary: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    frames = _table(summary.get("frames"), "frame")
    stack_lists = summary.get("stacks")
    if not isinstance(stack_lists, list):
        raise ValueError("snapshot summary has no stack table")
    stacks = _table(["\n".join(str(f) for f in _take(frames, ids) if f) if isinstance(ids, list) else ""
                     for ids in stack_lists], "stack")
    seg = _segments(summary)
    b = summary.get("blocks") or {}
    n_blocks = len(b.get("address", ()))
    for c in ("segment_address", "address", "size", "requested_size", "state", "frame", "stack"):
        if len(b.get(c, ())) != n_blocks:
            raise ValueError(f"snapshot summary: block column {c} has {len(b.get(c, ())):,} rows, not {n_blocks:,}")
    blocks = pd.DataFrame({
        "segment_address": b["segment_address"] if n_blocks else np.zeros(0, np.int64),
        "address": b["address"] if n_blocks else np.zeros(0, np.int64),
        "size": b["size"] if n_blocks else np.zeros(0, np.int64),
        "requested_size": b["requested_size"] if n_blocks else np.zeros(0, np.int64),
        "state": _take(_table(summary.get("block_states"), "block state"), b.get("state", [])),
        "frame": _take(frames, b.get("frame", [])),
        "stack": _take(stacks, b.get("stack", [])),
    })
    for c in ("segment_address", "address", "size", "requested_size"):
        blocks[c] = blocks[c].astype("int64")
    t = summary.get("trace")
    trace = None
    if t:
        n = len(t.get("address", ()))
        for c in ("device", "action", "address", "size", "stream", "time_us", "device_free", "frame", "stack"):
            if len(t.get(c, ())) != n:
                raise ValueError(f"snapshot summary: trace column {c} has {len(t.get(c, ())):,} rows, not {n:,}")

        def na(col: np.ndarray) -> np.ndarray:
            out = col.astype(float)
            out[col == NA_INT] = np.nan
            return out

        trace = pd.DataFrame({
            "device": t["device"].astype(np.int64),
            "action": _category(_table(summary.get("trace_actions"), "action"), t["action"]),
            "address": t["address"], "size": t["size"], "stream": t["stream"], "time_us": na(t["time_us"]),
            "device_free": na(t["device_free"]), "frame": _category(frames, t["frame"]),
            "stack": _category(stacks, t["stack"]),
            "stack_id": t["stack"].astype(np.int64),
        })
    return seg, blocks, trace


def _frames_v1(summary: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    frames = list(summary.get("frames") or [""])

    def frame_names(ids: Iterable[Any]) -> list[str]:
        return [frames[i] if isinstance(i, int) and 0 <= i < len(frames) else "" for i in ids]

    stack_text = ["\n".join(f for f in frame_names(ids) if f) if isinstance(ids, list) else ""
                  for ids in summary["stacks"]] if isinstance(summary.get("stacks"), list) else None

    def stacks(cols: dict[str, Any]) -> list[str]:
        """The ``stack`` column: a few frames per row (older summaries: the top frame alone)."""
        ids = cols.get("stack")
        if stack_text is None or not isinstance(ids, list) or len(ids) != len(cols["frame"]):
            return list(cols["frame"])
        return [stack_text[i] if isinstance(i, int) and 0 <= i < len(stack_text) else "" for i in ids]

    seg = _segments(summary)
    bdict = dict(summary["blocks"])
    bdict["frame"] = frame_names(bdict.get("frame", []))
    bdict["stack"] = stacks(bdict)
    blocks = pd.DataFrame({c: bdict.get(c, []) for c in (*BLOCK_COLUMNS, "stack")})
    for c in ("segment_address", "address", "size", "requested_size"):
        blocks[c] = blocks[c].astype("int64")
    trace = None
    if summary.get("trace"):
        tdict = dict(summary["trace"])
        tdict["frame"] = frame_names(tdict.get("frame", []))
        tdict["stack"] = stacks(tdict)
        trace = pd.DataFrame({c: tdict.get(c, []) for c in (*TRACE_COLUMNS, "stack")})
        trace["time_us"] = pd.to_numeric(trace["time_us"], errors="coerce")
        trace["device_free"] = pd.to_numeric(trace["device_free"], errors="coerce")
    return seg, blocks, trace


def load_snapshot(path: str | os.PathLike[str], *, max_nodes: int | None = None) -> MemoryMap:
    """Read a ``torch.cuda.memory._dump_snapshot`` pickle (any torch >= 2.1) as a :class:`MemoryMap`.

    Raises :class:`RunError` with a one-line message for a missing, malformed or
    hostile file; a pickle that asks to import or call anything is refused unrun. At most
    ``max_nodes`` segments, blocks, frames and trace entries are visited (default: :func:`node_budget` of the
    file's size; see :func:`summarize`).
    """
    p = Path(path)
    f, size = open_snapshot_file(p)
    with f, no_gc():
        snap = read_snapshot_pickle(f, where=str(p))
        summary = summarize(snap, max_blocks=10**12, max_trace=10**12,
                            max_nodes=node_budget(size) if max_nodes is None else max_nodes, where=str(p))
        del snap
    try:
        mtime: float | None = p.stat().st_mtime
    except OSError:
        mtime = None
    return memory_map_from_summary(summary, time=mtime, reason=f"file {p.name}")


def snapshots_from_frame(df: pd.DataFrame, problems: list[str]) -> list[MemoryMap]:
    """``snapshots`` table rows -> memory maps, oldest first; damaged rows go to ``problems``."""
    out: list[MemoryMap] = []
    if df is None or not len(df) or "data" not in df:
        return out
    for row in df.to_dict("records"):
        step = row.get("step")
        step_i = int(step) if isinstance(step, (int, float)) and math.isfinite(step) else None
        t = row.get("time")
        t_f = float(t) if isinstance(t, (int, float)) and math.isfinite(t) else None
        rank = row.get("rank")
        what = f"snapshot (step {step_i}, {row.get('reason') or 'no reason'})"
        if row.get("format") not in (SUMMARY_FORMAT, SUMMARY_FORMAT_V1):
            problems.append(f"{what}: unknown format {row.get('format')!r}; skipped (newer gpudash?)")
            continue
        data = row.get("data")
        try:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise ValueError("no data")
            summary = decode_summary(bytes(data))
            mm = memory_map_from_summary(summary, time=t_f, step=step_i, reason=str(row.get("reason") or ""),
                                         rank=int(rank) if isinstance(rank, (int, float)) else None)
        except MemoryError:
            problems.append(f"{what}: unreadable (too large for the memory this process has); skipped")
            continue
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError, zlib.error,
                UnicodeDecodeError) as exc:
            problems.append(f"{what}: unreadable ({str(exc)[:200] or type(exc).__name__}); skipped")
            continue
        out.append(mm)
    out.sort(key=lambda m: (m.time or 0.0))
    return out
