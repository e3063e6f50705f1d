"""One-time description of where the run executes (recorded in the run's meta)."""

from __future__ import annotations

import os
import platform
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpudash.collectors.base import try_import_torch

__all__ = ["HOSTNAME_ENV", "Placement", "cuda_device_meta", "describe_environment", "node_identity", "placement"]

#: Overrides the node name a rank records (tests simulate several hosts on one machine with it).
HOSTNAME_ENV = "GPUDASH_HOSTNAME"

#: Where each launcher (torchrun, Intel MPI/MPICH, Open MPI, SLURM) says where this process sits; first set wins.
RANK_VARS = ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
WORLD_SIZE_VARS = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
NODE_RANK_VARS = ("GROUP_RANK", "SLURM_NODEID")
LOCAL_WORLD_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


@dataclass(frozen=True)
class Placement:
    """Where the launcher put this process: the one reading of rank variables in gpudash (the Monitor,
    the trainer and the device collector all use it). ``problems``: one line per variable that was set
    to something that is not a whole number (it is skipped, never raised); ``bad``: the same, as
    ``(variable, "VAR='value' is not a rank (a whole number >= 0)")`` for a caller that cannot skip it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int | None = None
    node_rank: int | None = None
    local_world_size: int | None = None
    problems: tuple[str, ...] = ()
    bad: tuple[tuple[str, str], ...] = ()


def placement(environ: Mapping[str, str] | None = None) -> Placement:
    """Read :class:`Placement` from ``environ`` (default ``os.environ``); never raises."""
    env = os.environ if environ is None else environ
    bad: list[tuple[str, str, str, int]] = []  # (variable, its value, what it names, the least valid value)

    def read(names: tuple[str, ...], what: str, least: int) -> int | None:
        for n in names:
            raw = env.get(n)
            if raw is None or not raw.strip():
                continue
            v = raw.strip()
            if v.isascii() and v.isdigit() and int(v) >= least:
                return int(v)
            bad.append((n, raw, what, least))
        return None

    rank, world = read(RANK_VARS, "rank", 0), read(WORLD_SIZE_VARS, "world size", 1)
    local, node = read(LOCAL_RANK_VARS, "local rank", 0), read(NODE_RANK_VARS, "node rank", 0)
    local_world = read(LOCAL_WORLD_SIZE_VARS, "local world size", 1)
    where = Placement(0 if rank is None else rank, 1 if world is None else world, local, node, local_world)
    used = {"rank": where.rank, "world size": where.world_size, "local rank": local, "node rank": node,
            "local world size": local_world}
    if not bad:
        return where
    said = tuple((n, f"{n}={raw[:40]!r} is not a {what} (a whole number >= {least})") for n, raw, what, least in bad)
    problems = tuple(f"{text}: ignored, this process records {what} "
                     f"{'unknown' if used[what] is None else used[what]}; fix the launcher's {n} or unset it"
                     for (n, text), (_, _, what, _) in zip(said, bad, strict=True))
    return replace(where, problems=problems, bad=said)


def node_identity(where: Placement | None = None) -> dict[str, Any]:
    """Which machine this process runs on and where it sits there: ``node`` (the host name, or
    ``$GPUDASH_HOSTNAME``), ``local_rank``, ``node_rank`` and ``local_world_size`` when the launcher
    (torchrun, SLURM, Open MPI) says so."""
    p = placement() if where is None else where
    out: dict[str, Any] = {"node": os.environ.get(HOSTNAME_ENV, "").strip() or socket.gethostname()}
    for key in ("local_rank", "node_rank", "local_world_size"):
        v = getattr(p, key)
        if v is not None:
            out[key] = v
    return out


def describe_environment(where: Placement | None = None) -> dict[str, Any]:
    ident = node_identity(where)
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
