"""CUDA out-of-memory: record the event, with the numbers of the allocator's message
(parsed by :mod:`gpudash.store.oom_message`, the one parser analysis uses too).

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

import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from gpudash.store.oom_message import parse_oom_message
from gpudash.store.schema import SAME_OOM_S
from gpudash.units import human_bytes

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["flush_observed_oom", "note_observed_oom", "oom_message_summary", "record_oom"]

#: monitor -> (monotonic time, the observer's numbers) of an OOM observed but not yet recorded
_OBSERVED: weakref.WeakKeyDictionary[Any, tuple[float, dict[str, Any]]] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


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
    data = parse_oom_message(text).to_dict()
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
