"""Throughput, defined once: tokens/s, samples/s and MFU of a run or of its last steps.

A rate is what was done over the wall time it took: the sum of ``tokens`` (or ``samples``) of the steps,
all ranks together, over the seconds from the first step's start (its ``time`` less its ``duration_s``) to
the last step's end. Time between steps (an evaluation, a checkpoint, data loading outside the step) is
time the run spent, so it counts; ranks run side by side, so a torchrun job's rate is all its ranks' tokens.
MFU is that rate times the model's FLOPs per token over the devices' peak FLOP/s (each rank one device),
or the median of an ``mfu`` the user logged.

Every surface renders these: the run page's throughput header and the live tick, the runs list, the compare
page, ``/metrics``, ``gpudash info``, the report and the trainer's progress and final lines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.frames import numeric as _num
from gpudash.analysis.phases import phase_columns

__all__ = ["PEAK_BF16_FLOPS", "RECENT_STEPS", "Throughput", "device_peak_flops", "flops_per_token", "fmt_mfu",
           "fmt_rate", "mfu", "mfu_inputs", "per_second", "rate_of", "recent_steps", "throughput"]

#: Steps the "recent" rates are taken over (the run page's header, ``/metrics``, the trainer's progress line).
RECENT_STEPS = 100

#: Dense bf16 tensor-core peak FLOP/s by device name (vendor data sheets; SXM parts where two exist).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12), ("H100 PCIe", 756e12), ("H100", 989e12), ("A100", 312e12), ("L40S", 362e12),
    ("L4", 121e12), ("A10G", 70e12), ("A10", 125e12), ("RTX 4090", 165e12), ("RTX 3090", 71e12), ("V100", 125e12),
)


def _meta_num(meta: Mapping[str, Any], *keys: str) -> float | None:
    """The first positive finite number under ``keys`` in the meta, its ``estimate`` or its ``config``."""
    for src in (meta, meta.get("estimate") or {}, meta.get("config") or {}):
        if not isinstance(src, Mapping):
            continue
        for k in keys:
            try:
                v = float(src[k])
            except (KeyError, TypeError, ValueError):
                continue
            if math.isfinite(v) and v > 0:
                return v
    return None


def device_peak_flops(meta: Mapping[str, Any]) -> float | None:
    """One device's bf16 peak FLOP/s: the run's own ``peak_flops`` (meta, estimate or config), else the
    table above by ``device_name`` on a CUDA device; None on a CPU or an unknown card."""
    peak = _meta_num(meta, "peak_flops", "device_peak_flops")
    if peak:
        return peak
    if not str(meta.get("device") or "").startswith("cuda"):
        return None
    name = str(meta.get("device_name") or "")
    return next((p for key, p in PEAK_BF16_FLOPS if key in name), None)


def flops_per_token(meta: Mapping[str, Any]) -> float | None:
    """Training FLOPs per token (the trainer's estimate records it; a user may put it in the config)."""
    return _meta_num(meta, "flops_per_token")


def mfu_inputs(meta: Mapping[str, Any]) -> dict[str, float]:
    """The two numbers MFU needs from the meta, when known: ``peak_flops`` and ``flops_per_token``
    (a dict that is itself a meta :func:`device_peak_flops` and :func:`flops_per_token` read)."""
    out = {"peak_flops": device_peak_flops(meta), "flops_per_token": flops_per_token(meta)}
    return {k: v for k, v in out.items() if v}


def per_second(amounts: Sequence[float] | np.ndarray | pd.Series, ends: Sequence[float] | np.ndarray | pd.Series,
               durations: Sequence[float] | np.ndarray | pd.Series | None = None) -> float | None:
    """``sum(amounts)`` per second of wall time from the first step's start to the last step's end.

    ``ends``: when each step ended (unix time); ``durations``: each step's wall time. Without durations the
    first step's start is unknown, so the span starts at the first end and the first step's amount is left
    out. None when nothing was counted or no time passed."""
    a = np.asarray(amounts, dtype=float)
    t = np.asarray(ends, dtype=float)
    ok = np.isfinite(t)
    if not ok.any():
        return None
    d = np.zeros_like(t) if durations is None else np.nan_to_num(np.asarray(durations, dtype=float), nan=0.0)
    if not np.isfinite(a[ok]).any():
        return None
    start = float(np.min((t - d)[ok]))
    end = float(np.max(t[ok]))
    done = np.nansum(a[ok])
    if durations is None:  # the steps that ended first began before the span: their amount is not in it
        done -= np.nansum(a[ok][t[ok] == start])
    span = end - start
    return float(done) / span if span > 0 else None


def recent_steps(steps: pd.DataFrame, n: int = RECENT_STEPS) -> pd.DataFrame:
    """The rows of the last ``n`` step numbers (every rank's)."""
    if not len(steps) or "step" not in steps:
        return steps.tail(n)
    s = pd.to_numeric(steps["step"], errors="coerce")
    top = s.max()
    if not np.isfinite(top):
        return steps.tail(n)
    return steps[s > top - n]


def rate_of(steps: pd.DataFrame, col: str) -> float | None:
    """``col`` (samples, tokens) per second of wall time over ``steps`` (:func:`per_second`); None when the
    steps did not record it."""
    v, t = _num(steps, col), _num(steps, "time")
    if v is None or t is None:
        return None
    return per_second(v.to_numpy(), t.to_numpy(), None if "duration_s" not in steps else
                      pd.to_numeric(steps["duration_s"], errors="coerce").to_numpy())


def mfu(tokens_per_s: float | None, meta: Mapping[str, Any], devices: int = 1,
        logged: pd.Series | None = None) -> float | None:
    """Model FLOPs utilisation: the median ``mfu`` the user logged, else ``tokens_per_s`` (all ``devices``
    together) x FLOPs per token / (peak FLOP/s x devices). None when a number it needs is unknown."""
    if logged is not None:
        v = pd.to_numeric(logged, errors="coerce").dropna()
        if len(v):
            return float(v.median())
    peak, fpt = device_peak_flops(meta), flops_per_token(meta)
    if not (peak and fpt and tokens_per_s):
        return None
    return tokens_per_s * fpt / (peak * max(devices, 1))


@dataclass(frozen=True)
class Throughput:
    """How fast the steps went: over the whole run, or over its last ``steps`` (``window``)."""

    steps: int = 0
    """Step numbers the numbers are taken over."""
    ranks: int = 0
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    mfu: float | None = None
    step_time_median_s: float | None = None
    step_time_p95_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    """Share of the step time in each phase."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def throughput(steps: pd.DataFrame, meta: Mapping[str, Any] | None = None, last: int | None = None) -> Throughput:
    """The rates of the steps (of their last ``last`` step numbers when given), all ranks together."""
    meta = meta or {}
    s = steps if last is None else recent_steps(steps, last)
    if not len(s):
        return Throughput()
    ranks = int(s["rank"].nunique()) if "rank" in s else 1
    n = int(pd.to_numeric(s["step"], errors="coerce").nunique()) if "step" in s else len(s)
    tps = rate_of(s, "tokens")
    dur = _num(s, "duration_s")
    phases: dict[str, float] = {}
    if dur is not None and float(dur.sum()) > 0:
        total = float(dur.sum())
        phases = {c.removesuffix("_s"): float(pd.to_numeric(s[c], errors="coerce").sum()) / total
                  for c in phase_columns(s, meta)}
    return Throughput(
        steps=n, ranks=ranks, tokens_per_s=tps, samples_per_s=rate_of(s, "samples"),
        mfu=mfu(tps, meta, ranks, _num(s, "mfu")),
        step_time_median_s=None if dur is None else float(dur.median()),
        step_time_p95_s=None if dur is None else float(dur.quantile(0.95)), phases=phases)


def fmt_rate(v: float | None) -> str:
    """A rate as every surface prints it: ``38,612`` at and above 1,000, else three digits (``29.6``)."""
    if v is None or not math.isfinite(v):
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def fmt_mfu(v: float | None) -> str:
    """MFU as a percentage with one decimal (``41.3 %``)."""
    return "-" if v is None or not math.isfinite(v) else f"{100 * v:.1f} %"
