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

:func:`summarize` turns the dict into a compact columnar summary (numpy columns for blocks and every
trace entry): one top frame per block and trace entry, and a short user stack (:data:`STACK_DEPTH`
frames, for the allocation timeline's hover), both through string tables. Which frames those are is
chosen in one place, :func:`top_frames`: frames of torch and a few stdlib helpers are skipped, and so are
gpudash's own frames on top of a stack (``gpudash run`` wraps the model's call), so every surface that
shows a snapshot's stacks (memory map, diff, leak event, timeline) names the user's line. Frame lists are
looked up by the ids of the frame dicts in them (torch pickles each frame once), so a million entries take
about a second. A pickle is code: :func:`read_snapshot_pickle` uses an unpickler that refuses every
global, so a hostile file fails with a one-line :class:`RunError` and nothing in it runs; the bytes
reach the C unpickler a MiB at a time and the memory made is checked before each
(:data:`GROWTH_PER_BYTE`), so a small file cannot make gigabytes; the work of :func:`summarize` is
counted as it walks (:func:`node_budget`). No torch here.
"""

from __future__ import annotations

import math
import os
import sys
from operator import itemgetter
from typing import Any

import numpy as np

from gpudash.errors import RunError
from gpudash.store.snapshot_pickle import no_gc, open_snapshot_file, read_snapshot_pickle

__all__ = [
    "BLOCK_COLUMNS",
    "MAX_BLOCKS",
    "MAX_NODES",
    "NA_INT",
    "OWN_DIRS",
    "SUMMARY_FORMAT_V1",
    "no_gc",
    "node_budget",
    "open_snapshot_file",
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

SUMMARY_FORMAT = "gpudash-memmap-v2"
#: The JSON summaries written before the columnar one (still read).
SUMMARY_FORMAT_V1 = "gpudash-memmap-v1"
#: Blocks and trace entries kept per stored snapshot (bounded DB growth).
MAX_BLOCKS = 200_000
#: Trace entries kept per stored snapshot: every one of torch's largest histories (torchtitan records
#: 1,000,000), 57 bytes each in memory once read back.
MAX_TRACE = 4_000_000
#: Work budget of one summary: segments, blocks, trace entries, frames and settings entries
#: visited. A pickle can reference one list from many places (4,000 segments sharing one list of
#: 4,000 blocks is 16 KB on disk and 16 million visits), so the work is bounded, not the file size.
MAX_NODES = 5_000_000


def node_budget(file_bytes: int) -> int:
    """The work budget for a file of ``file_bytes``: :data:`MAX_NODES` and one node per byte on top. Each
    reference in a pickle takes at least a byte, so an honest file (however big) stays within it, while a
    list shared from thousands of places (a few bytes each, the whole list each) does not."""
    return MAX_NODES + max(0, int(file_bytes))
_INT64 = 2**63

SEGMENT_COLUMNS = ("device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                   "stream", "segment_type", "is_expandable", "blocks")
BLOCK_COLUMNS = ("segment_address", "address", "size", "requested_size", "state", "frame")
TRACE_COLUMNS = ("device", "action", "address", "size", "stream", "time_us", "device_free", "frame")

_INTERNAL = ("/torch/", "\\torch\\", "<frozen", "/contextlib.py", "/functools.py")


def _own_dirs() -> tuple[str, ...]:
    """gpudash's package directory (from ``gpudash.__file__``), as imported and with links resolved, each
    ending in a separator: a frame is gpudash's own when its file is under it (a path, not a folder name that
    a user's project could share)."""
    init = getattr(sys.modules.get("gpudash"), "__file__", None) or os.path.join(os.path.dirname(__file__), "..",
                                                                                 "__init__.py")
    here = os.path.dirname(os.path.abspath(init))
    return tuple(dict.fromkeys(os.path.join(d, "") for d in (here, os.path.realpath(here))))


#: Where gpudash's own frames live (see :func:`top_frames`).
OWN_DIRS = _own_dirs()

#: User frames kept per block and trace entry (the ``stack`` column; innermost first).
STACK_DEPTH = 4


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
    """``file:line name`` of the innermost user frame (the first of :func:`top_frames`)."""
    got = top_frames(frames, 1)
    return got[0] if got else ""


def top_frames(frames: Any, depth: int = STACK_DEPTH) -> list[str]:
    """Up to ``depth`` user frames (``file:line name``, innermost first), else the innermost frame.

    User frames are outside torch and the stdlib helpers; gpudash's own frames (files under :data:`OWN_DIRS`)
    on top of the user's are left out too, so the user's line is the one named (``gpudash run`` wraps the
    model's call: its wrapper is not the allocation's cause). A stack of gpudash's frames alone keeps them."""
    if not isinstance(frames, (list, tuple)) or not frames:
        return []
    out: list[str] = []
    own: list[str] = []  # gpudash's frames above the first other user frame
    first = ""
    for fr in frames:
        if not isinstance(fr, dict):
            continue
        filename, text = _frame_text(fr)
        first = first or text
        if _is_user(filename):
            if not out and filename.startswith(OWN_DIRS):
                if len(own) < depth:
                    own.append(text)
                continue
            out.append(text)
            if len(out) >= depth:
                break
    return out or own or ([first] if first else [])


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
    """Short stacks as lists of frame ids, each distinct stack stored once (0 = no frames).

    torch pickles each frame once and every entry's list refers to it, so a list is looked up by the ids
    of the frame dicts in it (while the snapshot is alive an id names one dict); :data:`_ID_CACHE` distinct
    lists at most are remembered (a file whose frames are all distinct is read, just slower)."""

    def __init__(self, frames: _Strings, budget: _Budget) -> None:
        self.frames = frames
        self.budget = budget
        self.index: dict[tuple[int, ...], int] = {(): 0}
        self.items: list[list[int]] = [[]]
        self.by_ids: dict[tuple[int, ...], tuple[int, int]] = {}
        self.by_ends: dict[tuple[int, int, int, int], tuple[Any, int]] = {}  # see _stack_ids

    def __call__(self, raw_frames: Any) -> tuple[int, int]:
        """(top frame id, stack id) of one block's or trace entry's ``frames``."""
        if not isinstance(raw_frames, (list, tuple)) or not raw_frames:
            return 0, 0
        self.budget.take(len(raw_frames))
        key = tuple(map(id, raw_frames))
        hit = self.by_ids.get(key)
        if hit is None:
            if len(self.by_ids) >= _ID_CACHE:
                self.by_ids.clear()
            hit = self.by_ids[key] = self._compute(raw_frames)
        return hit

    def _compute(self, raw_frames: Any) -> tuple[int, int]:
        ids = tuple(self.frames(t) for t in top_frames(raw_frames))
        i = self.index.get(ids)
        if i is None:
            i = self.index[ids] = len(self.items)
            self.items.append(list(ids))
        return (ids[0] if ids else 0), i


_ID_CACHE = 200_000
#: Missing ``time_us`` or ``device_free`` in the stored int64 columns.
NA_INT = -(2**63)


def _ints(values: list[Any], what: str, default: int = 0, nullable: bool = False) -> np.ndarray:
    """An int64 column; numpy converts the usual all-int column at C speed, anything else goes one by one
    (None to ``default`` or :data:`NA_INT`, floats truncated, other types and over-64-bit numbers refused)."""
    if values:
        try:
            arr = np.array(values)
        except (ValueError, TypeError, OverflowError):
            arr = None
        if arr is not None and arr.ndim == 1 and arr.dtype.kind in "ib" and len(arr) == len(values):
            return arr.astype(np.int64, copy=False)
    try:
        if nullable:
            return np.array([NA_INT if v is None else _int(v) for v in values], dtype=np.int64)
        return np.array([_int(v, default) for v in values], dtype=np.int64)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _codes(values: list[Any], table: _Strings) -> np.ndarray:
    """Labels (action, state) as ids into ``table``: known strings at dict speed, the rest one by one."""
    get = table.index.get
    try:
        out = np.array([get(v, -1) for v in values], dtype=np.int32)
    except TypeError:  # an unhashable value (a list where a label belongs)
        out = np.full(len(values), -1, dtype=np.int32)
    for i in np.flatnonzero(out < 0).tolist():
        out[i] = table(_label(values[i]))
    return out


def _column(entries: list[dict[str, Any]], key: str) -> list[Any]:
    """``entry[key]`` of every entry (None where missing), at C speed when every entry has it."""
    try:
        return list(map(itemgetter(key), entries))
    except KeyError:
        return [e.get(key) for e in entries]


def _stack_ids(frame_lists: list[Any], stacks: _Stacks, budget: _Budget) -> np.ndarray:
    """The stack id of every entry's ``frames`` (the loop of :meth:`_Stacks.__call__`, inlined: it runs once
    per trace entry). Frames are charged to the budget before each list is looked at.

    First by a short key, the list's length and the ids of its first, middle and last frame dicts, checked
    against the list last seen under it with ``==`` (a C loop that stops at once on the same dicts): a tuple
    of every frame's id per entry took 60 % of the summary for deep stacks (53 frames an entry, a 137 MB
    file: import 1.53x ``pickle.load``). A list that differs from it goes by every frame's id, as before."""
    by_ids = stacks.by_ids
    by_ends = stacks.by_ends
    ends = by_ends.get
    out: list[int] = []
    append = out.append
    seen = 0
    left = budget.left
    for f in frame_lists:
        if type(f) is list or type(f) is tuple:
            n = len(f)
            seen += n
            if seen > left:
                budget.take(seen)
            short = (n, id(f[0]), id(f[n >> 1]), id(f[-1])) if n else (0, 0, 0, 0)
            known = ends(short) if n else None
            if known is not None and known[0] == f:
                append(known[1])
                continue
            key = tuple(map(id, f))
            hit = by_ids.get(key)
            if hit is None:
                if len(by_ids) >= _ID_CACHE:
                    by_ids.clear()
                hit = by_ids[key] = stacks._compute(f)
            if n and known is None:
                if len(by_ends) >= _ID_CACHE:
                    by_ends.clear()
                by_ends[short] = (f, hit[1])
            append(hit[1])
        else:
            append(0)
    budget.take(seen)
    return np.array(out, dtype=np.int32)


def summarize(snapshot: dict[str, Any], *, max_blocks: int = MAX_BLOCKS, max_trace: int = MAX_TRACE,
              max_nodes: int = MAX_NODES, where: str = "snapshot") -> dict[str, Any]:
    """Compact summary of a snapshot dict: segments as lists, blocks and trace entries as numpy columns
    (labels and frames through string tables); :func:`gpudash.store.snapshot_codec.encode_summary` stores it.

    Reads at most ``max_nodes`` segments, blocks, trace entries, frames and settings entries, counted as
    they are walked (a list referenced from many places counts at each use); RunError past that."""
    try:
        return _summarize(snapshot, max_blocks, max_trace, _Budget(max_nodes))
    except _OverBudget:
        raise RunError(f"{where}: too much to read: over {max_nodes:,} segments, blocks, frames and trace "
                       "entries (shared references count at each use); if you trust the file, raise the "
                       "budget (load_snapshot(..., max_nodes=N), gpudash import-snapshot --max-nodes N)") from None
    except MemoryError:
        raise RunError(f"{where}: too large to summarise in the memory this process has (MemoryError)") from None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as exc:
        raise RunError(f"{where}: malformed torch memory snapshot ({exc})") from None


def _summarize(snapshot: dict[str, Any], max_blocks: int, max_trace: int, budget: _Budget) -> dict[str, Any]:
    frames = _Strings()
    stacks = _Stacks(frames, budget)
    seg: dict[str, list[Any]] = {c: [] for c in SEGMENT_COLUMNS}
    blk: dict[str, list[Any]] = {c: [] for c in (*BLOCK_COLUMNS, "stack")}
    states = _Strings()
    dropped_blocks = 0
    segments = _list(snapshot.get("segments"), "segments")
    budget.take(len(segments))
    for i, s in enumerate(segments):
        s = _dict(s, f"segment {i}")
        raw_blocks = _list(s.get("blocks"), f"segment {i} blocks")
        budget.take(len(raw_blocks))
        blocks = [_dict(b, f"block in segment {i}") for b in raw_blocks]
        address = _int(s.get("address"))
        sizes = [_int(b.get("size")) for b in blocks]
        labels = [_label(b.get("state")) for b in blocks]
        alloc = sum(sz for sz, st in zip(sizes, labels, strict=True) if st == "active_allocated")
        active = sum(sz for sz, st in zip(sizes, labels, strict=True) if st.startswith("active"))
        req = sum(_int(b.get("requested_size"), sz) for sz, b, st in zip(sizes, blocks, labels, strict=True)
                  if st == "active_allocated")
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
        for sz, st, b in zip(sizes, labels, blocks, strict=True):
            baddr = _int(b.get("address"), offset)
            offset = baddr + sz
            if len(blk["address"]) >= max_blocks:
                dropped_blocks += 1
                continue
            blk["segment_address"].append(address)
            blk["address"].append(baddr)
            blk["size"].append(sz)
            blk["requested_size"].append(_int(b.get("requested_size"), sz))
            blk["state"].append(states(st))
            top, stack = stacks(b.get("frames"))
            blk["frame"].append(top)
            blk["stack"].append(stack)
    blocks_out = {c: np.array(v, dtype=np.int32 if c in ("state", "frame", "stack") else np.int64)
                  for c, v in blk.items()}
    trace, actions, dropped_trace = _trace(snapshot, max_trace, budget, stacks)
    settings = snapshot.get("allocator_settings")
    return {
        "format": SUMMARY_FORMAT,
        "segments": seg,
        "blocks": blocks_out,
        "block_states": states.items,
        "frames": frames.items,
        "stacks": stacks.items,
        "trace": trace,
        "trace_actions": actions,
        "truncated_blocks": dropped_blocks,
        "truncated_trace": dropped_trace,
        "allocator_settings": _plain(settings, budget) if isinstance(settings, dict) else {},
    }


def _trace(snapshot: dict[str, Any], max_trace: int, budget: _Budget,
           stacks: _Stacks) -> tuple[dict[str, np.ndarray] | None, list[str], int]:
    """Every device's trace as columns (the newest ``max_trace`` entries), its action table, entries left out."""
    traces = _list(snapshot.get("device_traces"), "device_traces")
    budget.take(len(traces))
    per_device = [_list(t, f"device_traces[{d}]") for d, t in enumerate(traces)]
    lengths = [len(t) for t in per_device]
    budget.take(sum(lengths))
    total = sum(lengths)
    if not total:
        return None, [], 0
    entries: list[Any] = per_device[0] if len(per_device) == 1 else [e for t in per_device for e in t]
    device = np.repeat(np.arange(len(per_device), dtype=np.int32), lengths)
    dropped = max(0, total - max_trace)
    if dropped:
        entries, device = entries[dropped:], device[dropped:]
    if not all(type(e) is dict for e in entries):
        bad = next(e for e in entries if not isinstance(e, dict))
        raise ValueError(f"trace entry is {type(bad).__name__}, expected a dict")
    actions = _Strings()
    for a in ("alloc", "free_requested", "free_completed"):
        actions(a)
    stack_ids = _stack_ids(_column(entries, "frames"), stacks, budget)
    tops = np.array([ids[0] if ids else 0 for ids in stacks.items], dtype=np.int32)
    cols = {
        "device": device,
        "action": _codes(_column(entries, "action"), actions),
        "address": _ints(_column(entries, "addr"), "trace addr"),
        "size": _ints(_column(entries, "size"), "trace size"),
        "stream": _ints(_column(entries, "stream"), "trace stream"),
        "time_us": _ints(_column(entries, "time_us"), "trace time_us", nullable=True),
        "device_free": _ints(_column(entries, "device_free"), "trace device_free", nullable=True),
        "frame": tops[stack_ids],
        "stack": stack_ids,
    }
    return cols, actions.items, dropped


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

