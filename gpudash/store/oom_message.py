"""The numbers in an out-of-memory message: the one parser the collectors and analysis both use.

The collectors parse the message of a caught ``torch.OutOfMemoryError`` into the ``oom`` event's
data; analysis parses the event's message (or a crashed run's end reason) when the data lacks them.
Both get the same keys in the same unit from here.

Units: torch prints sizes with c10's ``format_size`` (``c10/core/Allocator.h``): ``bytes`` up to
1024, then ``KiB``, ``MiB``, ``GiB``, each a power of 1024, two decimals. The MPS allocator labels
the same powers of 1024 ``KB``, ``MB``, ``GB`` (its ``MB(x)`` is ``x * 1048576``), so a "GB" in a
torch message is 2**30 bytes, never 10**9. Parsed byte counts are exact to those two decimals.

Formats (tests/store/test_oom_message.py holds a real message of each):

* ``current`` (torch >= 2.1, "capacty" in 2.1): ``Tried to allocate 20.00 MiB. GPU 0 has a total
  capacity of 79.15 GiB of which 10.75 MiB is free. Process 4242 has ... memory in use. [8.00 GiB
  allowed; ]Of the allocated memory 78.20 GiB is allocated by PyTorch, [with ... allocated in private
  pools (e.g., CUDA Graphs), ]and 401.45 MiB is reserved by PyTorch but unallocated.``
* ``legacy`` (torch < 2.1): ``Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.20 GiB
  already allocated; 10.75 MiB free; 14.50 GiB reserved in total by PyTorch)``
* ``mps``: ``MPS backend out of memory (MPS allocated: 1.00 GB, other allocations: 2.00 MB, max
  allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.``
* ``budget``: the trainer's CPU memory budget (``--memory-budget-gb``): ``memory budget exceeded:
  1.23 GiB measured > budget 1.00 GiB (1320702443 > 1073741824 bytes; ...)``, exact bytes preferred.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import Any

from gpudash.units import UNIT_BYTES, parse_size

__all__ = ["OomNumbers", "parse_oom_message", "parse_size"]

#: A size as torch prints it: any label of :data:`gpudash.units.UNIT_BYTES` (binary, see the module docstring).
_SIZE = r"(\d+(?:\.\d+)?\s*(?i:" + "|".join(sorted(UNIT_BYTES, key=len, reverse=True)) + r")\b)"

_CURRENT = {
    "requested_bytes": rf"Tried to allocate {_SIZE}",
    "device": r"GPU (\d+) has a total capac",
    "capacity_bytes": rf"total capac(?:i)?ty of {_SIZE}",
    "free_bytes": rf"of which {_SIZE} is free",
    "allowed_bytes": rf"{_SIZE} allowed;",
    "process_bytes": rf"this process has {_SIZE} memory in use",
    "allocated_bytes": rf"{_SIZE} is allocated by PyTorch",
    "private_pools_bytes": rf"with {_SIZE} allocated in private pools",
    "reserved_unallocated_bytes": rf"{_SIZE} is reserved by PyTorch but unallocated",
}
_LEGACY = {
    "requested_bytes": rf"Tried to allocate {_SIZE}",
    "device": r"\(GPU (\d+);",
    "capacity_bytes": rf"{_SIZE} total capacity",
    "allowed_bytes": rf"{_SIZE} allowed;",
    "allocated_bytes": rf"{_SIZE} already allocated",
    "free_bytes": rf"{_SIZE} free",
    "reserved_bytes": rf"{_SIZE} reserved in total by PyTorch",
}
_MPS = {
    "requested_bytes": rf"Tried to allocate {_SIZE}",
    "allocated_bytes": rf"MPS allocated: {_SIZE}",
    "other_bytes": rf"other allocations: {_SIZE}",
    "allowed_bytes": rf"max allowed: {_SIZE}",
}
_BUDGET = {
    "measured_bytes": rf"{_SIZE} measured",
    "budget_bytes": rf"> budget {_SIZE}",
}
_BUDGET_EXACT = re.compile(r"\((\d+) > (\d+) bytes")
_PROCESS = re.compile(rf"Process (\d+) has {_SIZE} memory in use")


def _format(text: str) -> str | None:
    low = text.lower()
    if "memory budget exceeded" in low:
        return "budget"
    if "mps backend out of memory" in low:
        return "mps"
    if re.search(r"\(GPU \d+;", text):
        return "legacy"
    if "out of memory" in low or "tried to allocate" in low:
        return "current"
    return None


@dataclass(frozen=True, slots=True)
class OomNumbers:
    """The numbers an out-of-memory message printed (bytes as ints), None where it did not print one;
    ``format`` None for text that is no OOM message (falsy then)."""

    format: str | None = None
    """``current``, ``legacy``, ``mps`` or ``budget``."""
    requested_bytes: int | None = None
    device: int | None = None
    capacity_bytes: int | None = None
    free_bytes: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    reserved_unallocated_bytes: int | None = None
    """Derived from the other two of reserved / allocated when only those are printed (and the other way)."""
    allowed_bytes: int | None = None
    """A memory-fraction cap (``set_per_process_memory_fraction``), MPS's max allowed."""
    process_bytes: int | None = None
    """This process, non-PyTorch memory included."""
    private_pools_bytes: int | None = None
    other_bytes: int | None = None
    """MPS's other allocations."""
    processes: dict[int, int] | None = None
    """Bytes in use by each process the message lists, by pid."""
    measured_bytes: int | None = None
    budget_bytes: int | None = None

    def __bool__(self) -> bool:
        return self.format is not None

    def to_dict(self) -> dict[str, Any]:
        """The printed numbers only (an ``oom`` event's data), ``{}`` for text that is no OOM message."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def parse_oom_message(text: str) -> OomNumbers:
    """Numbers from an out-of-memory message (:class:`OomNumbers`); an empty one for other text."""
    if not isinstance(text, str):
        return OomNumbers()
    fmt = _format(text)
    if fmt is None:
        return OomNumbers()
    patterns = {"current": _CURRENT, "legacy": _LEGACY, "mps": _MPS, "budget": _BUDGET}[fmt]
    out: dict[str, Any] = {"format": fmt}
    for key, pat in patterns.items():
        m = re.search(pat, text)
        if m is not None:
            out[key] = int(m.group(1)) if key == "device" else parse_size(m.group(1))
    if fmt == "budget" and (exact := _BUDGET_EXACT.search(text)):
        out["measured_bytes"], out["budget_bytes"] = int(exact.group(1)), int(exact.group(2))
    if "reserved_bytes" in out and "allocated_bytes" in out and "reserved_unallocated_bytes" not in out:
        out["reserved_unallocated_bytes"] = max(0, out["reserved_bytes"] - out["allocated_bytes"])
    elif "allocated_bytes" in out and "reserved_unallocated_bytes" in out and "reserved_bytes" not in out:
        out["reserved_bytes"] = out["allocated_bytes"] + out["reserved_unallocated_bytes"]
    procs = {int(pid): parse_size(size) for pid, size in _PROCESS.findall(text)}
    if procs:
        out["processes"] = procs
    return OomNumbers(**out)
