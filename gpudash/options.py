"""``MonitorOptions``: the knobs of the Monitor and its collectors (``gpudash.Monitor(..., host_hz=0)``).

Imports nothing from gpudash, so the collectors, the Monitor and the trainer's
config all read it without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MonitorOptions"]


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
