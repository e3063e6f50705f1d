"""Energy of a run, derived once from its recorded rows: joules per step, Wh per million tokens, kWh per run.

GPU: each rank's ``device`` rows, per GPU, from NVML's total-energy counter (``energy_j``: increments
between samples; a counter that went back, as after a driver reload, adds nothing for that interval); where
a GPU has no counter, its power (``power_w``) integrated over time (trapezoids). CPU: the ``host`` rows'
``cpu_energy_j`` (RAPL packages, see :mod:`gpudash.collectors.rapl`), once per machine (the ranks on one
machine read the same packages). A sample interval is *busy* when its midpoint falls inside a step of its
rank (a step's span is ``[time - duration_s, time]``), else *idle* (start-up, evaluation outside the steps,
checkpoints, shutdown). Per step and per token are the busy energy over the steps and tokens; per run
is all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.frames import numeric, sampled
from gpudash.analysis.ranks import rank_nodes

__all__ = ["Energy", "energy_text", "interval_energy", "run_energy"]

_J_PER_WH = 3600.0


@dataclass(frozen=True)
class Energy:
    """What the run's devices drew. ``None`` where it was not measured."""

    total_j: float
    busy_j: float
    idle_j: float
    gpu_j: float | None = None
    cpu_j: float | None = None
    steps: int = 0
    tokens: float | None = None
    j_per_step: float | None = None
    """Busy joules (all GPUs and CPU packages together) per step."""
    wh_per_mtok: float | None = None
    """Busy watt-hours per million tokens (the steps' ``tokens``)."""
    gpu_source: str | None = None
    """``"NVML energy counter"``, ``"power integrated"`` or both (``"... and ..."``: some GPUs each way)."""
    per_gpu_j: dict[str, float] = field(default_factory=dict)
    """Joules per ``"rank R GPU G"``."""
    per_rank_j: dict[str, float] = field(default_factory=dict)
    """Joules per ``"rank R"``: its GPUs, and the CPU packages of its machine where this rank's samples are the ones
    counted (once per machine)."""
    cpu_unavailable: str | None = None
    """Why there is no CPU energy (the RAPL counters unreadable), as the run recorded it."""

    @property
    def kwh(self) -> float:
        return self.total_j / _J_PER_WH / 1000.0

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "kwh": self.kwh}


def interval_energy(t: np.ndarray, counter_j: np.ndarray | None, power_w: np.ndarray | None) -> np.ndarray | None:
    """Joules in each interval between consecutive samples (``len(t) - 1`` of them), from a cumulative counter
    where it has numbers at both ends, else from power at both ends; NaN where neither. None under 2 samples."""
    if len(t) < 2:
        return None
    dt = np.diff(t)
    out = np.full(len(dt), np.nan)
    if power_w is not None:
        out = (power_w[1:] + power_w[:-1]) / 2.0 * dt
    if counter_j is not None:
        d = np.diff(counter_j)
        d = np.where(d < 0, 0.0, d)  # the counter went back (driver reload): nothing counted for it
        out = np.where(np.isfinite(d), d, out)
    return np.where(dt > 0, out, 0.0)


def _step_spans(steps: pd.DataFrame, rank: Any) -> tuple[np.ndarray, np.ndarray]:
    s = steps[steps["rank"] == rank] if rank is not None and "rank" in steps else steps
    end = numeric(s, "time")
    if end is None:
        return np.empty(0), np.empty(0)
    dur = numeric(s, "duration_s")
    e = end.to_numpy(dtype=float)
    b = e - (dur.fillna(0.0).to_numpy(dtype=float) if dur is not None else 0.0)
    order = np.argsort(e)
    return b[order], e[order]


def _busy(mid: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    if not len(ends):
        return np.zeros(len(mid), dtype=bool)
    i = np.searchsorted(ends, mid)  # the first step ending at or after the point
    inside = i < len(ends)
    return inside & (starts[np.minimum(i, len(ends) - 1)] <= mid)


def _series(df: pd.DataFrame, counter: str, power: str | None) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    d = df.sort_values("time")
    t = pd.to_numeric(d["time"], errors="coerce").to_numpy(dtype=float)
    c, p = numeric(d, counter), numeric(d, power) if power else None
    return (t, None if c is None else c.to_numpy(dtype=float), None if p is None else p.to_numpy(dtype=float))


def _split(e: np.ndarray, t: np.ndarray, spans: tuple[np.ndarray, np.ndarray]) -> tuple[float, float]:
    ok = np.isfinite(e)
    busy = _busy((t[1:] + t[:-1]) / 2.0, *spans)
    return float(e[ok & busy].sum()), float(e[ok & ~busy].sum())


def run_energy(run: Any, n: int) -> Energy | None:
    """The run's :class:`Energy` over its ``n`` steps (:func:`gpudash.analysis.facts.step_count`); None when
    neither a GPU nor a CPU energy source recorded anything."""
    steps = run.steps
    busy = idle = 0.0
    per_gpu: dict[str, float] = {}
    per_rank: dict[str, float] = {}
    sources: set[str] = set()
    dev = sampled(run, "device")
    if len(dev) and "time" in dev and ("energy_j" in dev or "power_w" in dev):
        keys = [c for c in ("rank", "gpu") if c in dev]
        for key, g in (dev.groupby(keys) if keys else [((), dev)]):
            key = key if isinstance(key, tuple) else (key,)
            rank, gpu = (key + (None, None))[:2] if "rank" in keys else (None, key[0] if key else None)
            t, c, p = _series(g, "energy_j", "power_w")
            e = interval_energy(t, c, p)
            if e is None or not np.isfinite(e).any():
                continue
            sources.add("NVML energy counter" if c is not None else "power integrated")
            b, i = _split(e, t, _step_spans(steps, rank))
            busy, idle = busy + b, idle + i
            who = f"rank {rank if rank is not None else 0}"
            per_gpu[f"{who} GPU {gpu if gpu is not None else 0}"] = b + i
            per_rank[who] = per_rank.get(who, 0.0) + b + i
    gpu_j = sum(per_gpu.values()) if per_gpu else None
    cpu_j = None
    host = sampled(run, "host")
    if len(host) and "time" in host and "cpu_energy_j" in host:
        nodes = rank_nodes(getattr(run, "rank_meta", {}) or {})
        seen: set[str] = set()
        for rank, g in (host.groupby("rank") if "rank" in host else [(None, host)]):
            r = None if rank is None else int(str(rank))
            node = "?" if r is None else nodes.get(r, f"rank {r}")
            if node in seen and node != "?":
                continue  # the same packages, read by another rank on this machine
            t, c, _ = _series(g, "cpu_energy_j", None)
            e = interval_energy(t, c, None)
            if e is None or not np.isfinite(e).any():
                continue
            seen.add(node)
            b, i = _split(e, t, _step_spans(steps, rank))
            busy, idle = busy + b, idle + i
            cpu_j = (cpu_j or 0.0) + b + i
            who = f"rank {r if r is not None else 0}"
            per_rank[who] = per_rank.get(who, 0.0) + b + i
    if gpu_j is None and cpu_j is None:
        return None
    tok = numeric(steps, "tokens")
    tokens = float(tok.sum()) if tok is not None and float(tok.sum()) > 0 else None
    why = run.meta.get("unavailable_cpu_energy")
    return Energy(total_j=busy + idle, busy_j=busy, idle_j=idle, gpu_j=gpu_j, cpu_j=cpu_j, steps=n, tokens=tokens,
                  j_per_step=busy / n if n else None,
                  wh_per_mtok=busy / _J_PER_WH / (tokens / 1e6) if tokens else None,
                  gpu_source=" and ".join(sorted(sources)) or None, per_gpu_j=per_gpu, per_rank_j=per_rank,
                  cpu_unavailable=str(why)[:300] if why and cpu_j is None else None)


def _j(v: float) -> str:
    if v >= 3.6e6:
        return f"{v / 3.6e6:.3g} kWh"
    if v >= 3600:
        return f"{v / _J_PER_WH:.3g} Wh"
    return f"{v:.3g} J"


def energy_text(e: Energy) -> str:
    """One line: ``12.4 Wh (GPU 11.9 Wh, CPU 0.5 Wh), busy 11.0 Wh, idle 1.4 Wh; 310 J/step, 2.1 Wh per
    million tokens; per GPU: rank 0 GPU 0 6.1 Wh, ...; per rank: rank 0 6.3 Wh, ...`` (the last two with more
    than one GPU / rank, the largest first)."""
    parts = [f"{who} {_j(v)}" for who, v in (("GPU", e.gpu_j), ("CPU", e.cpu_j)) if v is not None]
    text = f"{_j(e.total_j)} ({', '.join(parts)}), busy {_j(e.busy_j)}, idle {_j(e.idle_j)}"
    rates = ([f"{e.j_per_step:.3g} J/step"] if e.j_per_step is not None else []) + \
            ([f"{e.wh_per_mtok:.3g} Wh per million tokens"] if e.wh_per_mtok is not None else [])
    if rates:
        text += "; " + ", ".join(rates)
    for what, split in (("per GPU", e.per_gpu_j), ("per rank", e.per_rank_j)):
        if len(split) > 1:  # one GPU, one rank: the total says it
            shown = sorted(split.items(), key=lambda kv: -kv[1])[:8]
            more = f" and {len(split) - 8} more" if len(split) > 8 else ""
            text += f"; {what}: " + ", ".join(f"{k} {_j(v)}" for k, v in shown) + more
    if e.cpu_unavailable:
        text += f" (no CPU energy: {e.cpu_unavailable})"
    return text
