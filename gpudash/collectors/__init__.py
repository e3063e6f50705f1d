"""Collectors: each records one source into the run, and degrades to "not available".

The Monitor starts :func:`default_collectors`; ``Monitor.watch`` adds the
memory-by-category collector. GPU collectors check for CUDA/NVML themselves
and record a ``collector_unavailable`` event where the hardware is absent.
"""

from __future__ import annotations

from typing import Any

from gpudash.collectors.base import MonitorOptions
from gpudash.collectors.host import HostCollector

__all__ = ["default_collectors"]


def default_collectors(options: MonitorOptions) -> list[Any]:
    out: list[Any] = []
    if options.host_hz > 0:
        out.append(HostCollector(options.host_hz))
    return out
