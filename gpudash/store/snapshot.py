"""Allocator snapshots as memory maps: read, summarise, store, load.

A torch allocator snapshot (``torch.cuda.memory._snapshot()``, pickled by
``torch.cuda.memory._dump_snapshot``) is a dict of plain containers::

    {"segments": [{"device", "address", "total_size", "allocated_size",
                   "active_size", "requested_size", "stream", "segment_type",
                   "segment_pool_id", "is_expandable", "frames",
                   "blocks": [{"address", "size", "requested_size", "state",
                               "frames": [{"filename", "line", "name"}]}]}],
     "device_traces": [[{"action", "addr", "size", "stream", "frames",
                         "time_us", "device_free"}]],
     "allocator_settings": {...}, "external_annotations": [...]}

Every key but ``segments`` is optional here (torch 2.1 files lack several), and
so is every key inside a segment, block or trace entry.

The capture side (``gpudash.collectors.snapshots``) and ``gpudash
import-snapshot`` both :func:`summarize` the dict into a compact columnar
summary (one top frame per block, a string table of frames, the most recent
trace entries) and store it zlib-compressed JSON in the ``snapshots`` table
with format :data:`SUMMARY_FORMAT`. :func:`snapshots_from_frame` turns those
rows back into :class:`MemoryMap` objects. No torch here: a laptop reads them.

A pickle is code. :func:`load_snapshot` uses an unpickler that refuses every
global, so a hostile file fails with a one-line :class:`RunError` and nothing
in it runs.
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpudash.errors import RunError

__all__ = [
    "MAX_BLOCKS",
    "MAX_NODES",
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

SUMMARY_FORMAT = "gpudash-memmap-v1"
#: Blocks and trace entries kept per stored snapshot (bounded DB growth).
MAX_BLOCKS = 200_000
MAX_TRACE = 100_000
#: Work budget of one summary: segments, blocks, trace entries, frames and settings entries
#: visited. A pickle can reference one list from many places (4,000 segments sharing one list of
#: 4,000 blocks is 16 KB on disk and 16 million visits), so the work is bounded, not the file size.
MAX_NODES = 5_000_000
_INT64 = 2**63

SEGMENT_COLUMNS = ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                   "stream", "segment_type", "is_expandable", "blocks")
BLOCK_COLUMNS = ("segment_address", "address", "size", "requested_size", "state", "frame")
TRACE_COLUMNS = ("device", "action", "address", "size", "stream", "time_us", "device_free", "frame")

_INTERNAL = ("/torch/", "\\torch\\", "<frozen", "/contextlib.py", "/functools.py")


@dataclass
class MemoryMap:
    """The allocator's memory at one moment.

    ``segments``: one row per cudaMalloc'd segment (``device``, ``address``,
    ``total_size``, ``allocated_size``, ``active_size``, ``requested_size``,
    ``stream``, ``segment_type``, ``is_expandable``, ``blocks`` = block count).
    ``blocks``: one row per block (``segment_address``, ``address``, ``size``,
    ``requested_size``, ``state``, ``frame`` = the top user frame that allocated
    it, or ``""``). ``trace``: the allocation history when it was recorded
    (``action``, ``address``, ``size``, ``stream``, ``time_us``, ``device_free``,
    ``frame``), else None. Sizes are bytes.
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


# ---- reading a pickle safely ----------------------------------------------------------------
class _NoGlobals(pickle.Unpickler):
    """Plain containers only: every global (and so every call) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused global {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("refused persistent id")


def read_snapshot_pickle(data: bytes, where: str = "snapshot") -> dict[str, Any]:
    """Unpickle ``data`` allowing only plain containers; RunError on anything else."""
    try:
        obj = _NoGlobals(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        if "refused" in str(exc):
            raise RunError(f"{where}: refused: the pickle wants to run code ({exc}); "
                           "a torch memory snapshot holds only plain data") from None
        raise RunError(f"{where}: not a readable pickle ({exc})") from None
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError, OverflowError,
            MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise RunError(f"{where}: not a readable pickle ({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise RunError(f"{where}: not a torch memory snapshot (top level is {type(obj).__name__}, expected a dict)")
    if "segments" not in obj and "device_traces" not in obj:
        raise RunError(f"{where}: not a torch memory snapshot (no 'segments' key); "
                       "write one with torch.cuda.memory._dump_snapshot(path)")
    return obj


# ---- summarising ----------------------------------------------------------------------------
class _Budget:
    """Counts visited nodes; past the limit the summary stops (shared references count each use)."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def take(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            raise _OverBudget


class _OverBudget(Exception):
    pass


def _int(value: Any, default: int = 0) -> int:
    """A byte count, address or id: a whole number that fits in 64 bits (``default`` when missing)."""
    if value is None:
        value = default
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"expected a number, got {value}")
        value = int(value)
    if not isinstance(value, int):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if not -_INT64 <= value < _INT64:
        raise ValueError("a number does not fit in 64 bits (no allocator writes one)")
    return value


def _label(value: Any, default: str = "") -> str:
    """Text for a name, state or file: strings as they are, small numbers printed, anything else
    by its type (``str()`` of a nested or shared structure can take unbounded time)."""
    if value is None:
        return default
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or isinstance(value, float):
        return str(value)
    if isinstance(value, int):
        return str(value) if -_INT64 <= value < _INT64 else "<huge number>"
    return f"<{type(value).__name__}>"


def _list(value: Any, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{what} is {type(value).__name__}, expected a list")
    return list(value)


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {type(value).__name__}, expected a dict")
    return value


def top_frame(frames: Any) -> str:
    """``file:line name`` of the innermost frame outside torch and the stdlib helpers."""
    if not isinstance(frames, (list, tuple)) or not frames:
        return ""
    first = ""
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        filename = _label(fr.get("filename"), "?")
        text = f"{filename}:{_label(fr.get('line'), '?')} {_label(fr.get('name'), '?')}"
        if not first:
            first = text
        if filename.endswith(".py") and not any(s in filename for s in _INTERNAL):
            return text
    return first


def _count(snapshot: dict[str, Any], budget: _Budget) -> None:
    """Charge the budget before any work: list lengths first (one step per segment or device),
    so a list shared by thousands of places is refused at once; then the frames of each item."""
    segments = snapshot.get("segments")
    segments = segments if isinstance(segments, (list, tuple)) else []
    budget.take(len(segments))
    block_lists: list[list[Any] | tuple[Any, ...]] = []
    for s in segments:
        blocks = s.get("blocks") if isinstance(s, dict) else None
        if isinstance(blocks, (list, tuple)):
            block_lists.append(blocks)
    for blocks in block_lists:
        budget.take(len(blocks))
    traces = snapshot.get("device_traces")
    traces = [t for t in traces if isinstance(t, (list, tuple))] if isinstance(traces, (list, tuple)) else []
    for entries in traces:
        budget.take(len(entries))
    for items in (*block_lists, *traces):
        for item in items:
            frames = item.get("frames") if isinstance(item, dict) else None
            if isinstance(frames, (list, tuple)):
                budget.take(1 + len(frames))


class _Strings:
    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}
        self.items: list[str] = [""]

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.items)
            self.items.append(s)
        return i


def summarize(snapshot: dict[str, Any], *, max_blocks: int = MAX_BLOCKS, max_trace: int = MAX_TRACE,
              max_nodes: int = MAX_NODES, where: str = "snapshot") -> dict[str, Any]:
    """Compact, JSON-able summary of a snapshot dict (columnar, frames in a string table).

    Reads at most ``max_nodes`` segments, blocks, trace entries, frames and settings entries
    (a reference shared by many places counts at each); RunError past that."""
    try:
        return _summarize(snapshot, max_blocks, max_trace, _Budget(max_nodes))
    except _OverBudget:
        raise RunError(f"{where}: too much to read: over {max_nodes:,} segments, blocks, frames and trace "
                       "entries (shared references count at each use); if you trust the file, raise the "
                       "budget (load_snapshot(..., max_nodes=N), gpudash import-snapshot --max-nodes N)") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        raise RunError(f"{where}: malformed torch memory snapshot ({exc})") from None


def _summarize(snapshot: dict[str, Any], max_blocks: int, max_trace: int, budget: _Budget) -> dict[str, Any]:
    _count(snapshot, budget)
    frames = _Strings()
    seg: dict[str, list[Any]] = {c: [] for c in SEGMENT_COLUMNS}
    blk: dict[str, list[Any]] = {c: [] for c in BLOCK_COLUMNS}
    dropped_blocks = 0
    for i, s in enumerate(_list(snapshot.get("segments"), "segments")):
        s = _dict(s, f"segment {i}")
        blocks = [_dict(b, f"block in segment {i}") for b in _list(s.get("blocks"), f"segment {i} blocks")]
        address = _int(s.get("address"))
        sizes = [_int(b.get("size")) for b in blocks]
        alloc = sum(sz for sz, b in zip(sizes, blocks, strict=True) if b.get("state") == "active_allocated")
        active = sum(sz for sz, b in zip(sizes, blocks, strict=True) if _label(b.get("state")).startswith("active"))
        req = sum(_int(b.get("requested_size"), sz) for sz, b in zip(sizes, blocks, strict=True)
                  if b.get("state") == "active_allocated")
        seg["device"].append(_int(s.get("device")))
        seg["address"].append(address)
        seg["total_size"].append(_int(s.get("total_size"), sum(sizes)))
        seg["allocated_size"].append(_int(s.get("allocated_size"), alloc))
        seg["active_size"].append(_int(s.get("active_size"), active))
        seg["requested_size"].append(_int(s.get("requested_size"), req))
        seg["stream"].append(_int(s.get("stream")))
        seg["segment_type"].append(_label(s.get("segment_type")))
        seg["is_expandable"].append(bool(s.get("is_expandable", False)))
        seg["blocks"].append(len(blocks))
        offset = address
        for sz, b in zip(sizes, blocks, strict=True):
            baddr = _int(b.get("address"), offset)
            offset = baddr + sz
            if len(blk["address"]) >= max_blocks:
                dropped_blocks += 1
                continue
            blk["segment_address"].append(address)
            blk["address"].append(baddr)
            blk["size"].append(sz)
            blk["requested_size"].append(_int(b.get("requested_size"), sz))
            blk["state"].append(_label(b.get("state")))
            blk["frame"].append(frames(top_frame(b.get("frames"))))
    trace: dict[str, list[Any]] | None = None
    dropped_trace = 0
    traces = _list(snapshot.get("device_traces"), "device_traces")
    if any(traces):
        entries: list[tuple[int, dict[str, Any]]] = []
        for dev, per_device in enumerate(traces):
            for e in _list(per_device, f"device_traces[{dev}]"):
                entries.append((dev, _dict(e, "trace entry")))
        if len(entries) > max_trace:
            dropped_trace = len(entries) - max_trace
            entries = entries[-max_trace:]
        trace = {c: [] for c in TRACE_COLUMNS}
        for dev, e in entries:
            t = e.get("time_us")
            free = e.get("device_free")
            trace["device"].append(dev)
            trace["action"].append(_label(e.get("action")))
            trace["address"].append(_int(e.get("addr")))
            trace["size"].append(_int(e.get("size")))
            trace["stream"].append(_int(e.get("stream")))
            trace["time_us"].append(None if t is None else _int(t))
            trace["device_free"].append(None if free is None else _int(free))
            trace["frame"].append(frames(top_frame(e.get("frames"))))
    settings = snapshot.get("allocator_settings")
    return {
        "format": SUMMARY_FORMAT,
        "segments": seg,
        "blocks": blk,
        "frames": frames.items,
        "trace": trace,
        "truncated_blocks": dropped_blocks,
        "truncated_trace": dropped_trace,
        "allocator_settings": _plain(settings, budget) if isinstance(settings, dict) else {},
    }


def _plain(value: Any, budget: _Budget, depth: int = 0) -> Any:
    """JSON-safe copy of small nested settings (tuples to lists, keys to str, huge numbers to text)."""
    budget.take(1)
    if depth > 8:
        return None
    if isinstance(value, dict):
        return {_label(k): _plain(v, budget, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, budget, depth + 1) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
        return _label(value)
    if isinstance(value, (str, bool, int)) or value is None:
        return value
    return _label(value)


def encode_summary(summary: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(summary, separators=(",", ":")).encode(), 6)


def decode_summary(data: bytes) -> dict[str, Any]:
    out = json.loads(zlib.decompress(data).decode())
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

    seg = pd.DataFrame({c: summary["segments"].get(c, []) for c in SEGMENT_COLUMNS})
    bdict = dict(summary["blocks"])
    bdict["frame"] = frame_names(bdict.get("frame", []))
    blocks = pd.DataFrame({c: bdict.get(c, []) for c in BLOCK_COLUMNS})
    for df, cols in ((seg, ("device", "address", "total_size", "allocated_size", "active_size",
                            "requested_size", "stream", "blocks")),
                     (blocks, ("segment_address", "address", "size", "requested_size"))):
        for c in cols:
            df[c] = df[c].astype("int64")
    trace = None
    if summary.get("trace"):
        tdict = dict(summary["trace"])
        tdict["frame"] = frame_names(tdict.get("frame", []))
        trace = pd.DataFrame({c: tdict.get(c, []) for c in TRACE_COLUMNS})
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
