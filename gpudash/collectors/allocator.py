"""The CUDA caching allocator, read once per step.

At the end of every step one ``torch.cuda.memory_stats()`` call (no device
sync) gives current and peak allocated / reserved / active / inactive-split /
requested bytes and the retry and OOM counters; the peaks are then reset so
each row's ``*_peak_bytes`` is that step's peak. About once a second
``torch.cuda.mem_get_info()`` adds what the whole device holds (other
processes, CUDA context, NCCL buffers), which the allocator cannot see.

Columns written to the step's memory row (bytes unless named otherwise):
``allocated_bytes``, ``reserved_bytes``, ``active_bytes``,
``inactive_split_bytes``, ``requested_bytes``, ``allocated_peak_bytes``,
``reserved_peak_bytes``, ``active_peak_bytes``, ``reserved_unallocated_bytes``
(reserved - allocated), ``fragmentation_pct`` (100 x inactive-split /
reserved: cached memory stuck in split blocks), ``alloc_retries`` and ``ooms``
(cumulative counters), ``cuda_mallocs`` and ``cuda_frees`` (cumulative
cudaMalloc/cudaFree calls), ``peak_bytes`` (= ``allocated_peak_bytes``: the
step's measured peak, the column every memory surface reads), and every ~1 s ``device_used_bytes``,
``device_free_bytes``, ``device_total_bytes`` and ``non_pytorch_bytes``
(device used - reserved: context, other processes, NCCL).

``torch.cuda.reset_peak_memory_stats()`` after each read also resets what
``torch.cuda.max_memory_allocated()`` reports to the user's own code.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from gpudash.collectors.base import cuda_torch

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["AllocatorCollector", "AllocatorSource", "TorchAllocatorSource", "allocator_row", "device_row"]


class AllocatorSource(Protocol):
    """Where the numbers come from: torch on a GPU, a recording in tests."""

    def memory_stats(self) -> dict[str, Any]: ...

    def reset_peaks(self) -> None: ...

    def mem_get_info(self) -> tuple[int, int]: ...


class TorchAllocatorSource:
    """The current CUDA device's caching allocator."""

    def __init__(self, torch: Any) -> None:
        self._cuda = torch.cuda
        self._nested = getattr(torch.cuda, "memory_stats_as_nested_dict", None)

    def memory_stats(self) -> dict[str, Any]:
        """The stats the memory row reads, by their flat names. From the nested dict torch's C++ builds:
        ``memory_stats()`` flattens and sorts every one of its ~100 keys in Python first (84 µs a call on the
        H200 machine, on the training thread once a step)."""
        if self._nested is not None:
            try:
                return flat_stats(self._nested())
            except Exception:  # noqa: BLE001 - another torch's layout: the flat call below
                self._nested = None
        return dict(self._cuda.memory_stats())

    def reset_peaks(self) -> None:
        self._cuda.reset_peak_memory_stats()

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self._cuda.mem_get_info()
        return int(free), int(total)


_CURRENT = {
    "allocated_bytes": "allocated_bytes.all.current",
    "reserved_bytes": "reserved_bytes.all.current",
    "active_bytes": "active_bytes.all.current",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "requested_bytes": "requested_bytes.all.current",
    "allocated_peak_bytes": "allocated_bytes.all.peak",
    "reserved_peak_bytes": "reserved_bytes.all.peak",
    "active_peak_bytes": "active_bytes.all.peak",
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
    "cuda_mallocs": "num_device_alloc",
    "cuda_frees": "num_device_free",
}


#: each flat key :func:`allocator_row` reads and its path in the nested stats (split once, not every step)
_PATHS = tuple((key, tuple(key.split("."))) for key in _CURRENT.values())


def flat_stats(nested: dict[str, Any]) -> dict[str, Any]:
    """The flat ``memory_stats()`` keys :func:`allocator_row` reads, from ``memory_stats_as_nested_dict()``
    (``"allocated_bytes.all.current"`` is ``nested["allocated_bytes"]["all"]["current"]``)."""
    out: dict[str, Any] = {}
    for key, path in _PATHS:
        v: Any = nested
        for part in path:
            v = v.get(part) if isinstance(v, dict) else None
        if v is not None:
            out[key] = v
    return out


def allocator_row(stats: dict[str, Any]) -> dict[str, Any]:
    """Memory-row columns from one ``torch.cuda.memory_stats()`` dict (missing keys are skipped)."""
    row: dict[str, Any] = {}
    for col, key in _CURRENT.items():
        v = stats.get(key)
        if v is not None:
            row[col] = int(v)
    if "allocated_peak_bytes" in row:
        row["peak_bytes"] = row["allocated_peak_bytes"]  # the step's measured peak (peaks reset each step)
    alloc = row.get("allocated_bytes")
    reserved = row.get("reserved_bytes")
    if alloc is not None and reserved is not None:
        row["reserved_unallocated_bytes"] = max(0, reserved - alloc)
        split = row.get("inactive_split_bytes", 0)
        row["fragmentation_pct"] = 100.0 * split / reserved if reserved else 0.0
    return row


def device_row(free: int, total: int, reserved: int | None) -> dict[str, Any]:
    """Device-wide columns from ``torch.cuda.mem_get_info()``."""
    row: dict[str, Any] = {"device_free_bytes": free, "device_total_bytes": total,
                           "device_used_bytes": total - free}
    if reserved is not None:
        row["non_pytorch_bytes"] = max(0, total - free - reserved)
    return row


class AllocatorCollector:
    """Adds allocator columns to each step's memory row (training thread, ~tens of µs)."""

    name = "allocator"

    def __init__(self, source: AllocatorSource | None = None, *, device_info_interval: float = 1.0,
                 reset_peaks: bool = True) -> None:
        self.source = source
        self.device_info_interval = device_info_interval
        self.reset_peaks = reset_peaks
        self._monitor: Recording | None = None
        self._next_info = 0.0

    def start(self, monitor: Recording) -> None:
        self._monitor = monitor
        if self.source is None:
            torch = cuda_torch(monitor, self.name, "no CUDA device (torch.cuda.is_available() is False)")
            if torch is None:
                return
            self.source = TorchAllocatorSource(torch)
        monitor.add_step_hooks(end=self.on_step_end)

    def stop(self) -> None:
        self._monitor = None

    def on_step_end(self, step: int, row: dict[str, Any]) -> None:
        monitor = self._monitor
        source = self.source
        if monitor is None or source is None or row.get("failed"):
            return  # a failed step records no memory row: keep its peaks for the retry
        stats = source.memory_stats()
        if not stats:
            return  # CUDA not initialised yet: nothing allocated, and no context to create
        mem = allocator_row(stats)
        if self.reset_peaks:
            source.reset_peaks()
        now = time.monotonic()
        if now >= self._next_info:
            self._next_info = now + self.device_info_interval
            free, total = source.mem_get_info()
            mem.update(device_row(free, total, mem.get("reserved_bytes")))
        monitor.memory_row(step, mem)
