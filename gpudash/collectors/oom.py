"""CUDA out-of-memory: parse the allocator's message, record the event.

Two message formats exist. torch >= 2.1::

    CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity
    of 79.15 GiB of which 10.75 MiB is free. Process 4242 has 79.13 GiB memory
    in use. [X allowed; ]Of the allocated memory 78.20 GiB is allocated by
    PyTorch, [with Y allocated in private pools (e.g., CUDA Graphs), ]and
    401.45 MiB is reserved by PyTorch but unallocated. ...

(torch 2.1 spells it "total capacty"), and older torch::

    CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total
    capacity; 14.20 GiB already allocated; 10.75 MiB free; 14.50 GiB reserved
    in total by PyTorch) If reserved memory is >> allocated memory ...

Sizes are printed with two decimals (``bytes``, ``KiB``, ``MiB``, ``GiB``), so
parsed byte counts are exact only to that precision.

One OOM is one ``oom`` event. On CUDA the allocator's OOM observer fires first
(the snapshot collector hands its exact numbers to :func:`note_observed_oom`
and stores a memory map at that moment); then whoever catches the
``torch.OutOfMemoryError`` (the trainer, a user's loop) calls
:func:`record_oom`, which records one event carrying both: the observer's
numbers and the caller's (micro-batch, leaked bytes...). If nobody calls it,
the observed OOM is recorded on its own at the next step or when the monitor
closes (a run that dies of the OOM keeps it).
"""

from __future__ import annotations

import re
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from gpudash.store.schema import SAME_OOM_S
from gpudash.units import human_bytes

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["flush_observed_oom", "note_observed_oom", "oom_message_summary", "parse_oom_message", "parse_size",
           "record_oom"]

#: monitor -> (monotonic time, the observer's numbers) of an OOM observed but not yet recorded
_OBSERVED: weakref.WeakKeyDictionary[Any, tuple[float, dict[str, Any]]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()

_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30, "tb": 1 << 40}
_SIZE = r"(\d+(?:\.\d+)?\s*(?:bytes|byte|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB))"

_NEW = {
    "requested_bytes": rf"Tried to allocate {_SIZE}",
    "device": r"GPU (\d+) has a total capac",
    "capacity_bytes": rf"total capac(?:i)?ty of {_SIZE}",
    "free_bytes": rf"of which {_SIZE} is free",
    "allowed_bytes": rf"{_SIZE} allowed;",
    "process_bytes": rf"this process has {_SIZE} memory in use",
    "allocated_bytes": rf"Of the allocated memory {_SIZE} is allocated by PyTorch",
    "private_pools_bytes": rf"with {_SIZE} allocated in private pools",
    "reserved_unallocated_bytes": rf"and {_SIZE} is reserved by PyTorch but unallocated",
}
_OLD = {
    "requested_bytes": rf"Tried to allocate {_SIZE}",
    "device": r"\(GPU (\d+);",
    "capacity_bytes": rf"{_SIZE} total capacity",
    "allowed_bytes": rf"{_SIZE} allowed;",
    "allocated_bytes": rf"{_SIZE} already allocated",
    "free_bytes": rf"{_SIZE} free",
    "reserved_bytes": rf"{_SIZE} reserved in total by PyTorch",
}
_PROCESS = re.compile(rf"Process (\d+) has {_SIZE} memory in use")


def parse_size(text: str) -> int:
    """``"20.00 MiB"`` -> 20971520."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r}")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))


def parse_oom_message(text: str) -> dict[str, Any]:
    """Numbers from a CUDA OOM message of either format; keys absent when not printed.

    Keys: ``format`` ("current" or "legacy"), ``requested_bytes``, ``device``,
    ``capacity_bytes``, ``free_bytes``, ``allocated_bytes``,
    ``reserved_unallocated_bytes``, ``reserved_bytes``, and when printed
    ``allowed_bytes`` (a memory-fraction cap), ``process_bytes`` (this process,
    non-PyTorch memory included), ``private_pools_bytes``, ``processes``
    ({pid: bytes}). Returns ``{}`` for text that is not a CUDA OOM message.
    """
    if not isinstance(text, str) or "out of memory" not in text.lower():
        return {}
    legacy = re.search(r"\(GPU \d+;", text) is not None
    patterns = _OLD if legacy else _NEW
    out: dict[str, Any] = {"format": "legacy" if legacy else "current"}
    for key, pat in patterns.items():
        m = re.search(pat, text)
        if m is None:
            continue
        out[key] = int(m.group(1)) if key == "device" else parse_size(m.group(1))
    if legacy:
        if "reserved_bytes" in out and "allocated_bytes" in out:
            out["reserved_unallocated_bytes"] = max(0, out["reserved_bytes"] - out["allocated_bytes"])
    elif "allocated_bytes" in out and "reserved_unallocated_bytes" in out:
        out["reserved_bytes"] = out["allocated_bytes"] + out["reserved_unallocated_bytes"]
    procs = {int(pid): parse_size(size) for pid, size in _PROCESS.findall(text)}
    if procs:
        out["processes"] = procs
    return out


def oom_message_summary(data: dict[str, Any]) -> str:
    """One line for the event message: what was asked for and what was left."""
    def size(key: str) -> str:
        return human_bytes(data.get(key), 2, missing="?")  # binary units, two decimals: as torch prints them

    dev = data.get("device")
    where = f"GPU {dev}" if dev is not None else "GPU"
    return (f"CUDA out of memory on {where}: tried to allocate {size('requested_bytes')}, "
            f"{size('free_bytes')} free, {size('allocated_bytes')} allocated, "
            f"{size('reserved_unallocated_bytes')} reserved but unallocated")


def _take_observed(monitor: Any) -> tuple[float, dict[str, Any]] | None:
    with _LOCK:
        return _OBSERVED.pop(monitor, None)


def note_observed_oom(monitor: Any, data: dict[str, Any]) -> None:
    """The allocator's OOM observer saw an OOM for ``monitor`` (``data``: its numbers).
    Recorded by the :func:`record_oom` call that follows, or by :func:`flush_observed_oom`."""
    flush_observed_oom(monitor)  # an earlier one nobody claimed is an OOM of its own
    with _LOCK:
        _OBSERVED[monitor] = (time.monotonic(), dict(data))


def flush_observed_oom(monitor: Any) -> None:
    """Record an observed OOM that no :func:`record_oom` call claimed (the next step
    started, or the monitor closes); nothing if there is none."""
    seen = _take_observed(monitor)
    if seen is not None:
        monitor.event("oom", oom_message_summary(seen[1]), **seen[1])


def record_oom(monitor: Recording, error: BaseException | str, *, message: str | None = None,
               **extra: Any) -> dict[str, Any]:
    """Record the ``oom`` event of a caught ``torch.OutOfMemoryError`` (or its text).

    ``extra`` (e.g. ``micro_batch``, ``leaked_bytes``) goes into the event's data;
    ``message`` replaces the event's message. If the allocator's OOM observer saw this
    OOM (in the last few seconds), the one event carries its exact numbers too.
    Returns the event's data. Safe to call from an ``except`` block: it parses a
    string and queues one record.
    """
    text = str(error)
    data = parse_oom_message(text)
    source = "exception"
    seen = _take_observed(monitor)
    if seen is not None and time.monotonic() - seen[0] < SAME_OOM_S:
        data.update(seen[1])  # the allocator's own numbers beat the message's rounded ones
        source = "allocator_observer+exception"
    elif seen is not None:
        monitor.event("oom", oom_message_summary(seen[1]), **seen[1])  # an older, unclaimed one
    data["source"] = source
    data.update(extra)
    if message is None:
        cuda = "requested_bytes" in data or "capacity_bytes" in data
        message = oom_message_summary(data) if cuda else text.splitlines()[0][:300] if text else "out of memory"
    monitor.event("oom", message, **data)
    return data
