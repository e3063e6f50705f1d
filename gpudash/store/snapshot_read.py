"""Reading a torch allocator snapshot pickle safely and summarising it into compact columns.

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

:func:`summarize` turns the dict into a compact columnar summary: one top frame per block and
trace entry, and a short user stack (:data:`STACK_DEPTH` frames, for the allocation timeline's
hover), both through string tables. A pickle is code: :func:`read_snapshot_pickle` uses an
unpickler that refuses every global, so a hostile file fails with a one-line :class:`RunError`
and nothing in it runs. No torch here.
"""

from __future__ import annotations

import io
import math
import pickle
from typing import Any

from gpudash.errors import RunError

__all__ = [
    "BLOCK_COLUMNS",
    "MAX_BLOCKS",
    "MAX_NODES",
    "MAX_TRACE",
    "SEGMENT_COLUMNS",
    "STACK_DEPTH",
    "SUMMARY_FORMAT",
    "TRACE_COLUMNS",
    "read_snapshot_pickle",
    "summarize",
    "top_frame",
    "top_frames",
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
#: User frames kept per block and trace entry (the ``stack`` column; innermost first).
STACK_DEPTH = 4


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


def _frame_text(fr: dict[str, Any]) -> tuple[str, str]:
    filename = _label(fr.get("filename"), "?")
    return filename, f"{filename}:{_label(fr.get('line'), '?')} {_label(fr.get('name'), '?')}"


def _is_user(filename: str) -> bool:
    return filename.endswith(".py") and not any(s in filename for s in _INTERNAL)


def top_frame(frames: Any) -> str:
    """``file:line name`` of the innermost frame outside torch and the stdlib helpers."""
    if not isinstance(frames, (list, tuple)) or not frames:
        return ""
    first = ""
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        filename, text = _frame_text(fr)
        if not first:
            first = text
        if _is_user(filename):
            return text
    return first


def top_frames(frames: Any, depth: int = STACK_DEPTH) -> list[str]:
    """Up to ``depth`` user frames (``file:line name``, innermost first), else the innermost frame."""
    if not isinstance(frames, (list, tuple)) or not frames:
        return []
    out: list[str] = []
    first = ""
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        filename, text = _frame_text(fr)
        first = first or text
        if _is_user(filename):
            out.append(text)
            if len(out) >= depth:
                break
    return out or ([first] if first else [])


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


class _Stacks:
    """Short stacks as lists of frame ids, each distinct stack stored once (0 = no frames)."""

    def __init__(self, frames: _Strings) -> None:
        self.frames = frames
        self.index: dict[tuple[int, ...], int] = {(): 0}
        self.items: list[list[int]] = [[]]

    def __call__(self, raw_frames: Any) -> tuple[int, int]:
        """(top frame id, stack id) of one block's or trace entry's ``frames``."""
        ids = tuple(self.frames(t) for t in top_frames(raw_frames))
        i = self.index.get(ids)
        if i is None:
            i = self.index[ids] = len(self.items)
            self.items.append(list(ids))
        return (ids[0] if ids else 0), i


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
    stacks = _Stacks(frames)
    seg: dict[str, list[Any]] = {c: [] for c in SEGMENT_COLUMNS}
    blk: dict[str, list[Any]] = {c: [] for c in (*BLOCK_COLUMNS, "stack")}
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
            top, stack = stacks(b.get("frames"))
            blk["frame"].append(top)
            blk["stack"].append(stack)
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
        trace = {c: [] for c in (*TRACE_COLUMNS, "stack")}
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
            top, stack = stacks(e.get("frames"))
            trace["frame"].append(top)
            trace["stack"].append(stack)
    settings = snapshot.get("allocator_settings")
    return {
        "format": SUMMARY_FORMAT,
        "segments": seg,
        "blocks": blk,
        "frames": frames.items,
        "stacks": stacks.items,
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

