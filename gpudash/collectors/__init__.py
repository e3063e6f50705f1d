"""Collectors: each records one source into the run, and degrades to "not available".

The Monitor starts :func:`default_collectors`; ``Monitor.watch`` adds the
memory-by-category collector. GPU collectors check for CUDA/NVML themselves
and record a ``collector_unavailable`` event where the hardware is absent.
Collector modules are imported here lazily: none of them imports torch at
import time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpudash.collectors.host import HostCollector

if TYPE_CHECKING:
    from gpudash.collectors.api import Collector
    from gpudash.options import MonitorOptions

__all__ = ["default_collectors"]


def default_collectors(options: MonitorOptions) -> list[Collector]:
    """Host (psutil), allocator, allocator snapshots + OOM observer, NVML device
    telemetry, CUDA-event step timing and, when ``stacks_hz`` > 0, py-spy stacks."""
    from gpudash.collectors.allocator import AllocatorCollector
    from gpudash.collectors.cuda_timing import CudaTimingCollector
    from gpudash.collectors.device import DeviceCollector
    from gpudash.collectors.snapshots import SnapshotCollector
    from gpudash.collectors.stacks import StackCollector

    out: list[Collector] = []
    if options.host_hz > 0:
        out.append(HostCollector(options.host_hz))
    if options.allocator:
        out.append(AllocatorCollector())
    out.append(SnapshotCollector(options.snapshot_every))
    if options.device_hz > 0:
        out.append(DeviceCollector(options.device_hz))
    if options.cuda_timing:
        out.append(CudaTimingCollector())
    if options.stacks_hz > 0:
        out.append(StackCollector(options.stacks_hz))
    return out
