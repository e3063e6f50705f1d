"""One-time description of where the run executes (recorded in the run's meta)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from gpudash.collectors.base import try_import_torch

__all__ = ["HOSTNAME_ENV", "cuda_device_meta", "describe_environment", "node_identity"]

#: Overrides the node name a rank records (tests simulate several hosts on one machine with it).
HOSTNAME_ENV = "GPUDASH_HOSTNAME"


def _env_int(*names: str) -> int | None:
    for n in names:
        v = os.environ.get(n, "").strip()
        if v.isdigit():
            return int(v)
    return None


def node_identity() -> dict[str, Any]:
    """Which machine this process runs on and where it sits there: ``node`` (the host name, or
    ``$GPUDASH_HOSTNAME``), ``local_rank``, ``node_rank`` and ``local_world_size`` when the launcher
    (torchrun, SLURM, Open MPI) says so."""
    out: dict[str, Any] = {"node": os.environ.get(HOSTNAME_ENV, "").strip() or socket.gethostname()}
    for key, names in (("local_rank", ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")),
                       ("node_rank", ("GROUP_RANK", "SLURM_NODEID")),
                       ("local_world_size", ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"))):
        v = _env_int(*names)
        if v is not None:
            out[key] = v
    return out


def describe_environment() -> dict[str, Any]:
    ident = node_identity()
    env: dict[str, Any] = {
        "hostname": ident["node"],
        **ident,
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
        env["cuda_available"] = bool(torch.cuda.is_available())  # no context is created by this
    except Exception as exc:  # noqa: BLE001 - a broken driver is a state, not a crash
        env["cuda_available"] = False
        env["cuda_error"] = f"{type(exc).__name__}: {exc}"
    env["device"] = "cpu"
    env["device_name"] = platform.processor() or platform.machine()
    if env["cuda_available"]:
        env["device"] = "cuda (not initialised yet)"
        env.update(cuda_device_meta(torch))
    return env


def cuda_device_meta(torch: Any) -> dict[str, Any]:
    """Device details, only once CUDA is initialised: asking earlier would create a
    context on GPU 0 in every torchrun rank that has not called set_device yet."""
    try:
        if not torch.cuda.is_initialized():
            return {}
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        return {
            "device": f"cuda:{idx}",
            "device_name": props.name,
            "device_capacity_bytes": int(props.total_memory),
            "cuda": torch.version.cuda,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    except Exception as exc:  # noqa: BLE001
        return {"cuda_error": f"{type(exc).__name__}: {exc}"}
