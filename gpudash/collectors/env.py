"""One-time description of where the run executes (recorded in the run's meta)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from gpudash.collectors.base import try_import_torch

__all__ = ["describe_environment"]


def describe_environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    torch = try_import_torch()
    if torch is None:
        env["device"] = "cpu"
        return env
    env["torch"] = torch.__version__
    try:
        if torch.cuda.is_available():
            idx = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(idx)
            env["device"] = f"cuda:{idx}"
            env["device_name"] = props.name
            env["device_capacity_bytes"] = int(props.total_memory)
            env["cuda"] = torch.version.cuda
            env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        else:
            env["device"] = "cpu"
            env["device_name"] = platform.processor() or platform.machine()
    except Exception as exc:  # noqa: BLE001 - a broken driver is a state, not a crash
        env["device"] = "cpu"
        env["cuda_error"] = f"{type(exc).__name__}: {exc}"
    return env
