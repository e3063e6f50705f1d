"""What every collector shares: options, the collector interface, torch import guard."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpudash.monitor import Monitor

__all__ = ["Collector", "MonitorOptions", "cuda_torch", "try_import_torch"]


def try_import_torch() -> Any:
    """torch if it is installed, else None (collectors then report "not available")."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def cuda_torch(monitor: Monitor, source: str, without_cuda: str) -> Any:
    """torch when CUDA is usable; otherwise record once why ``source`` records nothing, and None."""
    torch = try_import_torch()
    if torch is None:
        monitor.unavailable(source, "torch is not installed")
        return None
    try:
        ok = bool(torch.cuda.is_available())
    except Exception as exc:  # noqa: BLE001 - a broken driver is a state, not a crash
        monitor.unavailable(source, f"CUDA check failed: {exc}")
        return None
    if not ok:
        monitor.unavailable(source, without_cuda)
        return None
    return torch


@dataclass(kw_only=True, slots=True)
class MonitorOptions:
    """Knobs of the Monitor and its collectors; defaults keep the cost inside the budget."""

    flush_interval: float = 0.5
    """Seconds between writer flushes; a SIGKILL loses at most about this much."""
    buffer_records: int = 200_000
    """Records held in memory before the oldest is dropped (and counted)."""
    host_hz: float = 1.0
    """psutil samples per second (0 turns the host collector off)."""
    memory_every: int = 1
    """Record memory by category every N steps (parameters, gradients, optimizer, ...)."""
    activations_every: int = 0
    """Measure saved activations every N steps; 0 picks N so the cost stays <= activations_budget."""
    activations_budget: float = 0.005
    """Target share of step time spent in the activation hooks when activations_every is 0."""
    device_hz: float = 10.0
    """NVML samples per second (GPU only; 0 turns it off)."""
    allocator: bool = True
    """Read torch.cuda.memory_stats() once per step (GPU only)."""
    cuda_timing: bool = True
    """Time phases with CUDA events, resolved off the training thread (GPU only)."""
    snapshot_every: int = 0
    """Take an allocator snapshot every N steps (0: only on demand and at OOM)."""
    stacks_hz: float = 0.0
    """py-spy samples per second of this process (0: off)."""
    handle_signals: bool = True
    """Install a SIGTERM handler that flushes and records why the run ended."""

    def __post_init__(self) -> None:
        if self.flush_interval <= 0:
            raise ValueError("flush_interval must be > 0 seconds")
        if self.buffer_records < 100:
            raise ValueError("buffer_records must be >= 100")
        for name in ("host_hz", "device_hz", "stacks_hz"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.memory_every < 1:
            raise ValueError("memory_every must be >= 1")
        if self.activations_every < 0 or self.snapshot_every < 0:
            raise ValueError("activations_every and snapshot_every must be >= 0")


class Collector(Protocol):
    """A source of records. ``start``/``stop`` run once; the step hooks run on the
    training thread and must be cheap (no I/O, no GPU sync) and must not raise."""

    name: str

    def start(self, monitor: Monitor) -> None: ...

    def stop(self) -> None: ...
