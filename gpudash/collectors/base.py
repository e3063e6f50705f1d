"""What every collector shares: the torch import guard.

The interface a collector records through is :mod:`gpudash.collectors.api`;
the Monitor's options are :mod:`gpudash.options`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["cuda_torch", "try_import_torch"]


def try_import_torch() -> Any:
    """torch if it is installed, else None (collectors then report "not available")."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def cuda_torch(monitor: Recording, source: str, without_cuda: str) -> Any:
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
