"""Allocator snapshots as memory maps: store, load, turn back into :class:`MemoryMap`.

The capture side (``gpudash.collectors.snapshots``) and ``gpudash import-snapshot`` both
:func:`~gpudash.store.snapshot_read.summarize` a torch snapshot dict (read safely by
:func:`~gpudash.store.snapshot_read.read_snapshot_pickle`) into a compact columnar summary and
store it zlib-compressed JSON in the ``snapshots`` table with format :data:`SUMMARY_FORMAT`.
:func:`snapshots_from_frame` turns those rows back into :class:`MemoryMap` objects, decompressing
at most :data:`MAX_SUMMARY_BYTES` each (a crafted run database cannot make a zlib bomb of it).
The allocation timeline drawn from a map's trace is :mod:`gpudash.store.snapshot_trace`.
No torch here: a laptop reads them.
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpudash.errors import RunError
from gpudash.store.snapshot_read import (
    BLOCK_COLUMNS,
    MAX_BLOCKS,
    MAX_NODES,
    MAX_TRACE,
    SEGMENT_COLUMNS,
    SUMMARY_FORMAT,
    TRACE_COLUMNS,
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
    "MemoryMap",
    "decode_summary",
    "encode_summary",
    "load_snapshot",
    "memory_map_from_summary",
    "read_snapshot_pickle",
    "snapshot_row",
    "snapshots_from_frame",
    "summarize",
    "top_frame",
]

#: Largest decompressed summary read back from a run database (the largest one a summary
#: within MAX_BLOCKS and MAX_TRACE makes is far smaller).
MAX_SUMMARY_BYTES = 512 * 2**20


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


def encode_summary(summary: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(summary, separators=(",", ":")).encode(), 6)


def decode_summary(data: bytes, max_bytes: int | None = None) -> dict[str, Any]:
    """A stored summary back to its dict; ValueError if it is not one or inflates past ``max_bytes``
    (default :data:`MAX_SUMMARY_BYTES`)."""
    max_bytes = MAX_SUMMARY_BYTES if max_bytes is None else max_bytes
    inflater = zlib.decompressobj()
    raw = inflater.decompress(data, max_bytes)
    if inflater.unconsumed_tail or (not inflater.eof and inflater.decompress(b"", 1)):
        raise ValueError(f"snapshot summary inflates to over {max_bytes // 2**20} MiB (a crafted or damaged "
                         "run database; no gpudash summary is that large)")
    if not inflater.eof:
        raise ValueError("snapshot summary is cut short (truncated zlib data)")
    out = json.loads(raw.decode())
    if not isinstance(out, dict) or out.get("format") != SUMMARY_FORMAT:
        raise ValueError("not a gpudash memory-map summary")
    return out


def snapshot_row(summary: dict[str, Any], *, time: float, step: int | None, reason: str) -> dict[str, Any]:
    """The ``snapshots`` table row for a summary."""
    return {"time": time, "step": step, "reason": reason, "format": SUMMARY_FORMAT,
            "data": encode_summary(summary)}


# ---- summaries back to memory maps ------------------------------------------------------------
def memory_map_from_summary(summary: dict[str, Any], *, time: float | None = None, step: int | None = None,
                            reason: str = "", rank: int | None = None) -> MemoryMap:
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

    seg = pd.DataFrame({c: summary["segments"].get(c, []) for c in SEGMENT_COLUMNS})
    bdict = dict(summary["blocks"])
    bdict["frame"] = frame_names(bdict.get("frame", []))
    bdict["stack"] = stacks(bdict)
    blocks = pd.DataFrame({c: bdict.get(c, []) for c in (*BLOCK_COLUMNS, "stack")})
    for df, cols in ((seg, ("device", "address", "total_size", "allocated_size", "active_size",
                            "requested_size", "stream", "blocks")),
                     (blocks, ("segment_address", "address", "size", "requested_size"))):
        for c in cols:
            df[c] = df[c].astype("int64")
    trace = None
    if summary.get("trace"):
        tdict = dict(summary["trace"])
        tdict["frame"] = frame_names(tdict.get("frame", []))
        tdict["stack"] = stacks(tdict)
        trace = pd.DataFrame({c: tdict.get(c, []) for c in (*TRACE_COLUMNS, "stack")})
        trace["time_us"] = pd.to_numeric(trace["time_us"], errors="coerce")
        trace["device_free"] = pd.to_numeric(trace["device_free"], errors="coerce")
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


def load_snapshot(path: str | os.PathLike[str], *, max_nodes: int = MAX_NODES) -> MemoryMap:
    """Read a ``torch.cuda.memory._dump_snapshot`` pickle (any torch >= 2.1) as a :class:`MemoryMap`.

    Raises :class:`RunError` with a one-line message for a missing, malformed or
    hostile file; a pickle that asks to import or call anything is refused unrun. At most
    ``max_nodes`` segments, blocks, frames and trace entries are visited (see :func:`summarize`).
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise RunError(f"{p}: no such snapshot file (write one with torch.cuda.memory._dump_snapshot)") from None
    except IsADirectoryError:
        raise RunError(f"{p}: is a directory; pass the snapshot .pickle file") from None
    except OSError as exc:
        raise RunError(f"{p}: unreadable ({exc.strerror or exc})") from None
    snap = read_snapshot_pickle(data, where=str(p))
    summary = summarize(snap, max_blocks=10**12, max_trace=10**12, max_nodes=max_nodes, where=str(p))
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
        if row.get("format") != SUMMARY_FORMAT:
            problems.append(f"{what}: unknown format {row.get('format')!r}; skipped (newer gpudash?)")
            continue
        data = row.get("data")
        try:
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise ValueError("no data")
            summary = decode_summary(bytes(data))
            mm = memory_map_from_summary(summary, time=t_f, step=step_i, reason=str(row.get("reason") or ""),
                                         rank=int(rank) if isinstance(rank, (int, float)) else None)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError, zlib.error) as exc:
            problems.append(f"{what}: unreadable ({type(exc).__name__}: {str(exc)[:200]}); skipped")
            continue
        out.append(mm)
    out.sort(key=lambda m: (m.time or 0.0))
    return out
