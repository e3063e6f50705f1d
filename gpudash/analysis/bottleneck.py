"""Where the step time goes: input-, compute-, host/offload- or synchronization-bound.

Each step's wall time is split by its recorded phases (``<phase>_s`` columns):
data wait → input, forward/backward/optimizer → compute, offload copies →
host/offload, explicit sync/communication phases plus time no phase accounts
for (a ``.item()``, a blocking copy, an all-reduce) → synchronization.
Evaluation and checkpoint phases (``eval``, ``checkpoint``) are the run's own
work between training steps, not a bottleneck of training: their time is left
out of the step before it is split (their share is ``eval``). A step
is labelled by the largest non-compute share above a threshold, else compute.
Labels are smoothed over a window and runs of equal labels become
*stretches*; device telemetry (``sm_active_pct``, ``gpu_util_pct``) and GPU
phase times (``<phase>_gpu_s``) over each stretch are added as evidence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.phases import phase_columns as _phase_columns
from gpudash.analysis.ranks import lowest_rank
from gpudash.analysis.verdict import Severity, Verdict, fmt_pct, fmt_s
from gpudash.store.run import Run

__all__ = ["KINDS", "Bound", "Stretch", "bottleneck_verdicts", "phase_columns", "phase_shares", "run_bound",
           "stretches"]

KINDS = ("input-bound", "compute-bound", "host-offload-bound", "synchronization-bound")
_GROUPS: dict[str, tuple[str, ...]] = {
    "input": ("data", "data_wait", "input", "dataloader", "load"),
    "compute": ("forward", "backward", "optimizer", "loss", "step", "compute"),
    "offload": ("offload", "h2d", "d2h", "host_copy", "prefetch"),
    "sync": ("sync", "allreduce", "all_reduce", "comm", "barrier", "wait", "reduce_scatter", "all_gather"),
}
#: Phases that are not training: their time is taken out of the step before it is judged.
_BETWEEN = ("eval", "generate", "checkpoint")
_KIND_OF = {"input": "input-bound", "offload": "host-offload-bound", "sync": "synchronization-bound",
            "compute": "compute-bound"}
_GROUP_LABEL = {"input": "data wait", "compute": "compute", "offload": "host copies",
                "sync": "sync/outside phases"}
_GROUP_OF = {v: k for k, v in _KIND_OF.items()}
MIN_LOST_S = 2e-4
"""A bottleneck costing less than this per step (the loop's own overhead on toy steps) is not reported."""
THRESHOLD = 0.3
"""A non-compute share of the step above this makes the step bound by it."""


@dataclass
class Stretch:
    kind: str
    first_step: int
    last_step: int
    steps: int
    time_s: float
    median_step_s: float
    shares: dict[str, float] = field(default_factory=dict)
    """Mean share of step time per group (input, compute, offload, sync)."""
    phase_s: dict[str, float] = field(default_factory=dict)
    """Median seconds per recorded phase column."""
    device: dict[str, float] = field(default_factory=dict)
    """Mean device telemetry over the stretch (sm_active_pct, gpu_util_pct, gpu_busy_share)."""


def phase_columns(steps: pd.DataFrame, meta: dict[str, Any] | None = None) -> list[str]:
    """The run's ``<phase>_s`` columns (:func:`gpudash.analysis.phases.phase_columns`)."""
    return _phase_columns(steps, meta)


def _group(col: str) -> str:
    name = col.removesuffix("_s")
    if name in _BETWEEN:
        return "eval"
    for g, names in _GROUPS.items():
        if name in names or any(name.startswith(n + "_") for n in names):
            return g
    return "compute"


def phase_shares(steps: pd.DataFrame, meta: dict[str, Any] | None = None) -> pd.DataFrame:
    """Per step: the share of its training time (``duration_s`` less eval and checkpoint phases) in each
    group; ``sync`` includes unaccounted time; ``eval``: the eval and checkpoint share of ``duration_s``."""
    cols = phase_columns(steps, meta)
    full = steps["duration_s"].astype(float).clip(lower=1e-9)
    ecols = [c for c in cols if _group(c) == "eval"]
    between = steps[ecols].astype(float).fillna(0.0).sum(axis=1) if ecols else pd.Series(0.0, index=steps.index)
    dur = (full - between).clip(lower=1e-9)
    cols = [c for c in cols if c not in ecols]
    out = pd.DataFrame({"step": steps["step"].astype(int).to_numpy()}, index=steps.index)
    out["eval"] = (between / full).clip(upper=1.0)
    total = pd.Series(0.0, index=steps.index)
    for g in _GROUPS:
        gcols = [c for c in cols if _group(c) == g]
        secs = steps[gcols].astype(float).fillna(0.0).sum(axis=1) if gcols else pd.Series(0.0, index=steps.index)
        out[g] = secs / dur
        total += secs
    if cols:
        out["sync"] += ((dur - total).clip(lower=0.0)) / dur
    return out[["step", *_GROUPS, "eval"]]


#: A step's label is an index into this (integer codes: a long run's labels are smoothed and cut without
#: a Python loop over its steps or an array of strings).
_LABELS = ("compute", "input", "offload", "sync")


def _label(shares: pd.DataFrame) -> np.ndarray:
    other = shares[["input", "offload", "sync"]].to_numpy()
    bound = other.max(axis=1) >= THRESHOLD
    return np.where(bound, other.argmax(axis=1) + 1, 0)


def _smooth(labels: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(labels) <= window:
        return labels
    codes, uniq = pd.factorize(labels)  # first seen first: a tie goes to the label seen earlier in the run
    onehot = np.eye(len(uniq))[codes]
    counts = pd.DataFrame(onehot).rolling(window, center=True, min_periods=1).sum().to_numpy()
    return np.asarray(uniq)[counts.argmax(axis=1)]


def _runs(labels: np.ndarray, min_len: int) -> list[tuple[str, int, int]]:
    edges = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    starts, ends = np.r_[0, edges], np.r_[edges - 1, len(labels) - 1]
    runs = [(_LABELS[int(labels[a])], int(a), int(b)) for a, b in zip(starts, ends, strict=True)]
    merged: list[tuple[str, int, int]] = []
    for kind, a, b in runs:
        if merged and (b - a + 1 < min_len or merged[-1][0] == kind):
            pk, pa, _ = merged[-1]
            merged[-1] = (pk, pa, b)
        else:
            merged.append((kind, a, b))
    if len(merged) > 1 and merged[0][2] - merged[0][1] + 1 < min_len:
        _, a, _ = merged.pop(0)
        k, _, b = merged[0]
        merged[0] = (k, a, b)
    return merged


def _device_means(run: Run, t0: float, t1: float) -> dict[str, float]:
    try:
        dev = run.device
    except Exception:  # noqa: BLE001 - a damaged or absent device table is just no evidence
        return {}
    if dev is None or dev.empty or "time" not in dev:
        return {}
    win = dev[(dev["time"] >= t0) & (dev["time"] <= t1)]
    out: dict[str, float] = {}
    for col in ("sm_active_pct", "gpu_util_pct", "sm_occupancy_pct", "pcie_rx_mib_s", "pcie_tx_mib_s"):
        if col in win and win[col].notna().any():
            out[col] = float(win[col].mean())
    return out


def stretches(run: Run, rank: int | None = None, evidence: bool = True) -> list[Stretch]:
    """The run cut into stretches of one bottleneck kind (one rank: the lowest by default); ``evidence``:
    with the device telemetry over each stretch (reads the run's device table)."""
    steps = run.steps
    if steps.empty or "duration_s" not in steps:
        return []
    steps = lowest_rank(steps, rank)
    steps = steps.sort_values("step").reset_index(drop=True)
    cols = phase_columns(steps, run.meta)
    if not cols:
        return []
    shares = phase_shares(steps, run.meta)
    n = len(steps)
    labels = _smooth(_label(shares), window=max(1, min(25, n // 20)) | 1)
    out: list[Stretch] = []
    gpu_cols = [c for c in steps.columns if c.endswith("_gpu_s")]
    for group, a, b in _runs(labels, min_len=max(3, n // 50)):
        seg = steps.iloc[a:b + 1]
        sh = shares.iloc[a:b + 1]
        dur = seg["duration_s"].astype(float)
        t_end = float(seg["time"].max())
        t_start = float(seg["time"].min() - dur.iloc[0])
        device = _device_means(run, t_start, t_end) if evidence else {}
        if gpu_cols and evidence:
            busy = seg[gpu_cols].astype(float).fillna(0.0).sum(axis=1) / dur.clip(lower=1e-9)
            device["gpu_busy_share"] = float(busy.mean())
        out.append(Stretch(
            kind=_KIND_OF[group], first_step=int(seg["step"].iloc[0]), last_step=int(seg["step"].iloc[-1]),
            steps=len(seg), time_s=float(dur.sum()), median_step_s=float(dur.median()),
            shares={g: float(sh[g].mean()) for g in (*_GROUPS, "eval")},
            phase_s={c: float(seg[c].astype(float).median()) for c in cols}, device=device))
    return out


def _evidence(s: Stretch) -> list[str]:
    sh = s.shares
    ev = [f"median step {fmt_s(s.median_step_s)} over {s.steps} steps ({fmt_s(s.time_s)} in all)",
          "share of step time: " + ", ".join(f"{_GROUP_LABEL[g]} {fmt_pct(v)}" for g, v in sh.items()
                                             if v >= 0.005 and g in _GROUP_LABEL)]
    if sh.get("eval", 0.0) >= 0.005:
        ev.append(f"evaluation and checkpoints: {fmt_pct(sh['eval'])} of the step time, left out of this verdict")
    phases = sorted(s.phase_s.items(), key=lambda kv: -kv[1])
    ev.append("median per phase: " + ", ".join(f"{c.removesuffix('_s')} {fmt_s(v)}" for c, v in phases))
    d = s.device
    if "sm_active_pct" in d:
        ev.append(f"SM active {d['sm_active_pct']:.0f} % on average")
    if "gpu_util_pct" in d:
        ev.append(f"GPU utilization {d['gpu_util_pct']:.0f} % on average")
    if "gpu_busy_share" in d:
        ev.append(f"GPU busy {fmt_pct(d['gpu_busy_share'])} of the step (CUDA-event phase times)")
    return ev


_TITLES = {
    "input-bound": "Input-bound: the model waits for data",
    "host-offload-bound": "Host/offload-bound: copies to and from host memory dominate",
    "synchronization-bound": "Synchronization-bound: time outside the recorded phases (syncs, waits)",
    "compute-bound": "Compute-bound: forward, backward and optimizer dominate",
}


@dataclass(frozen=True)
class Bound:
    """One kind of bottleneck the run spent its steps in, as its verdict judges it."""

    kind: str
    """One of :data:`KINDS`."""
    title: str
    share_of_step: float
    """The bottleneck's share of the step time in its longest stretch (the compute share for compute-bound)."""
    share_of_run: float
    """The stretches of this kind's share of the run's step time."""
    first_step: int
    last_step: int
    severity: Severity


def _bounds(found: list[Stretch]) -> list[tuple[Bound, list[Stretch]]]:
    """The kinds worth a verdict, each with its stretches, longest stretch first: the one rule of
    :func:`bottleneck_verdicts` and :func:`run_bound`."""
    total = sum(s.time_s for s in found) or 1.0
    by_kind: dict[str, list[Stretch]] = {}
    for s in found:
        by_kind.setdefault(s.kind, []).append(s)
    out = []
    for kind, ss in by_kind.items():
        share_of_run = sum(s.time_s for s in ss) / total
        if kind != "compute-bound" and share_of_run < 0.1:
            continue
        if kind == "compute-bound" and share_of_run < 0.5:
            continue
        ss = sorted(ss, key=lambda s: -s.time_s)
        main = ss[0]
        share = main.shares[_GROUP_OF[kind]]
        if kind != "compute-bound" and main.median_step_s * share < MIN_LOST_S:
            continue  # microsecond steps: the loop's own overhead, nothing to fix
        severity: Severity = "ok" if kind == "compute-bound" else ("bad" if share >= 0.5 else "warn")
        out.append((Bound(kind=kind, title=_TITLES[kind], share_of_step=share, share_of_run=share_of_run,
                          first_step=min(s.first_step for s in ss), last_step=max(s.last_step for s in ss),
                          severity=severity), ss))
    return out


def run_bound(run: Run) -> Bound | None:
    """What bounds the run's step time, as :func:`bottleneck_verdicts` judges it: the worst bottleneck
    (by severity, then share of the run), else compute-bound; None without phases. No device evidence read:
    the facts carry it, so every surface (the throughput header too) says the verdict's word."""
    bounds = [b for b, _ in _bounds(stretches(run, evidence=False))]
    order = {"bad": 0, "warn": 1, "ok": 2}
    return min(bounds, key=lambda b: (order.get(b.severity, 3), -b.share_of_run), default=None)


def bottleneck_verdicts(run: Run) -> list[Verdict]:
    out: list[Verdict] = []
    for bound, ss in _bounds(stretches(run)):
        kind, main, group = bound.kind, ss[0], _GROUP_OF[bound.kind]
        time_s = sum(s.time_s for s in ss)
        lost_s = sum(s.shares[group] * s.time_s for s in ss)
        ev = _evidence(main)
        if len(ss) > 1:
            ev.insert(0, f"{len(ss)} stretches, {fmt_pct(bound.share_of_run)} of the run's step time")
        d = main.device
        if kind == "input-bound" and "sm_active_pct" in d:
            ev.append(f"SM activity low ({d['sm_active_pct']:.0f} %) while data wait is "
                      f"{fmt_pct(main.shares['input'])} of the step")
        numbers = {"time_s": time_s, "share_of_run": bound.share_of_run, "lost_s": lost_s,
                   "median_step_s": main.median_step_s, "share_of_step": bound.share_of_step}
        numbers.update({f"median_{c}": v for c, v in main.phase_s.items()})
        out.append(Verdict(kind=kind, title=bound.title, severity=bound.severity, evidence=ev,
                           steps=(bound.first_step, bound.last_step), numbers=numbers))
    return out
