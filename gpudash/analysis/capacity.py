"""The one capacity of a run: the bytes its memory is judged against, on every surface.

The whole-run facts (headroom, the leak's "runs out at"), the report's chart line, the dashboard's memory
chart and the live leak watch all take it from :func:`capacity`, so under ``--memory-cap-gb`` they all
judge against the cap, never one of them against the device's total memory.

In order: the pre-flight's capacity (what the trainer judged against: the cap, a CPU budget or the device),
the memory cap the run's config names, the device's total memory (as the allocator reported it, else as
the environment did), the budget the run names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np

from gpudash.units import GiB

if TYPE_CHECKING:  # the live leak watch imports this module: recording loads no pandas (nor the reader)
    import pandas as pd

    from gpudash.store.run import Run

__all__ = ["MEMORY_COLUMNS", "Capacity", "capacity", "capacity_bytes", "device_bytes"]

MEMORY_COLUMNS = ("device_total_bytes",)
"""The memory rows' columns a capacity is read from (the live leak watch keeps them in its window)."""


class Capacity(NamedTuple):
    bytes: float
    kind: Literal["memory cap", "budget", "device"]
    """What it is: a memory cap (``--memory-cap-gb``), a budget (a CPU ``--memory-budget-gb``), the device."""


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) and f > 0 else None


def _dict(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def capacity(meta: Mapping[str, Any], memory: pd.DataFrame | Mapping[str, Any] | None = None) -> Capacity | None:
    """The capacity of a run with this ``meta`` (a run's, or one rank's) and ``memory`` rows; None when
    nothing says (a CPU run without a budget)."""
    pre, config = _dict(meta.get("preflight")), _dict(meta.get("config"))
    if (b := _num(pre.get("capacity_bytes"))) is not None:
        source = str(pre.get("capacity_source") or "")
        return Capacity(b, "memory cap" if "cap" in source else "budget" if "budget" in source else "device")
    if (gb := _num(config.get("memory_cap_gb"))) is not None:
        return Capacity(gb * GiB, "memory cap")
    if (b := device_bytes(meta, memory)) is not None:
        return Capacity(b, "device")
    b = (_num(meta.get("memory_budget_bytes")) or _num(config.get("memory_budget_bytes"))
         or ((gb := _num(config.get("memory_budget_gb"))) and gb * GiB) or None)
    return Capacity(b, "budget") if b else None


def device_bytes(meta: Mapping[str, Any], memory: pd.DataFrame | Mapping[str, Any] | None = None) -> float | None:
    """The device's total memory: as the allocator reported it in ``memory`` (a run's rows, or the live leak
    watch's float columns: read without pandas), else as the environment did."""
    (total,) = MEMORY_COLUMNS
    if memory is not None and total in memory:
        col = memory[total]
        if isinstance(col, np.ndarray) and col.dtype.kind == "f":
            b = _num(np.nanmax(col)) if np.isfinite(col).any() else None
        else:
            import pandas as pd

            b = _num(pd.to_numeric(col, errors="coerce").max())
        if b is not None:
            return b
    return _num(meta.get("device_capacity_bytes")) or _num(meta.get("device_total_bytes"))


def capacity_bytes(run: Run | Mapping[str, Any], memory: pd.DataFrame | Mapping[str, Any] | None = None) -> float | None:
    """:func:`capacity`'s bytes, of a :class:`Run` or of a ``meta`` and its ``memory`` rows."""
    found = capacity(run, memory) if isinstance(run, Mapping) else capacity(run.meta, run.memory)
    return found.bytes if found else None
