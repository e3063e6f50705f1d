"""OOM forensics: why did this allocation fail?

For every ``oom`` event (recorded by the GPU collectors from the OOM observer
and the error message, or by the trainer under a CPU memory budget) gather the
request, what was free, the largest free block, reserved-but-unallocated
bytes, device memory held outside this process and memory by category at the
last completed step, then decide:

* **another process** — this process's own need fits the card, but memory
  held outside its allocator (``device_used − reserved``) does not leave room;
* **fragmentation** — enough memory was free in total (cached in the
  allocator, or on the device) but no single block was large enough;
* **did not fit** — what the step needs is more than the capacity or budget.

A crashed run whose end reason is an OOM but which recorded no event is
analysed from the error message alone.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from gpudash.analysis.capacity import capacity_bytes
from gpudash.analysis.verdict import Verdict, num
from gpudash.store.oom_message import parse_oom_message
from gpudash.store.run import Run
from gpudash.store.schema import MEMORY_PARTS
from gpudash.units import distinct_bytes, human_bytes

__all__ = ["CATEGORIES", "OomReport", "categories_before", "oom_reports", "oom_verdicts", "snapshot_largest_free"]

#: The memory columns an OOM report breaks the bytes into (the store's categories and the rest).
CATEGORIES = MEMORY_PARTS
_CONTEXT_ALLOWANCE = 768 * 2**20  # CUDA context + NCCL live outside the allocator in every process


@dataclass
class OomReport:
    """Everything known about one OOM, and the verdict."""

    step: int | None
    time: float | None
    rank: int | None
    message: str
    verdict: str
    evidence: list[str] = field(default_factory=list)
    requested_bytes: float | None = None
    free_bytes: float | None = None
    largest_free_bytes: float | None = None
    allocated_bytes: float | None = None
    reserved_bytes: float | None = None
    reserved_unallocated_bytes: float | None = None
    capacity_bytes: float | None = None
    device_used_bytes: float | None = None
    outside_bytes: float | None = None
    categories: dict[str, float] = field(default_factory=dict)
    categories_step: int | None = None
    peak_bytes: float | None = None
    """Measured peak (``peak_bytes``) of the step the categories come from."""
    measured_bytes: float | None = None
    """What a budget meter counted when it refused (CPU budget runs)."""
    micro_batch: float | None = None
    """The (micro-)batch size of the step that failed, when recorded."""
    recovered: bool = False

    @property
    def need_bytes(self) -> float | None:
        """What this process needed at the failing allocation (held + requested)."""
        if self.measured_bytes is not None:
            return self.measured_bytes
        held = self.allocated_bytes
        if held is None and self.categories:
            held = sum(self.categories.values())
        if held is None:
            return None
        return held + (self.requested_bytes or 0.0)


def _pick(d: dict[str, Any], *keys: str) -> float | None:
    for k in keys:
        v = num(d.get(k))
        if v is not None:
            return v
    return None


def categories_before(run: Run, t: float | None, step: int | None, rank: int | None) -> tuple[int | None, dict[str, float]]:
    """Memory by category at the last step recorded before time ``t`` (or before ``step``) whose
    categories were all measured (activations are sampled): one moment, under that step's peak."""
    mem = run.memory
    if mem.empty:
        return None, {}
    if rank is not None and "rank" in mem:
        mem = mem[mem["rank"] == rank]
    if t is not None and "time" in mem:
        mem = mem[mem["time"] <= t]
    elif step is not None:
        mem = mem[mem["step"] < step]
    cats = [c for c in CATEGORIES if c in mem]
    if mem.empty or not cats:
        return None, {}
    # activations are measured on sampled steps only: another step's would not add up with this one's
    measured = [c for c in cats if c != "other_bytes"]
    whole = mem[mem[measured].notna().all(axis=1)] if "activations_bytes" in cats else mem
    if whole.empty:
        whole = mem
    row = whole.iloc[-1]
    out = {c: float(row[c]) for c in cats if not pd.isna(row[c])}
    if "allocated_bytes" in mem and not pd.isna(row.get("allocated_bytes")):
        out.setdefault("other_bytes", 0.0)
    return int(row["step"]), out


def snapshot_largest_free(run: Run, t: float | None, rank: int | None) -> float | None:
    """``largest_free_bytes`` of the snapshot nearest the OOM (taken at or just before it)."""
    try:
        maps = run.snapshots
    except Exception:  # noqa: BLE001 - no snapshot support in this install, or a damaged table
        return None
    best: tuple[float, float] | None = None
    for m in maps:
        if rank is not None and getattr(m, "rank", rank) not in (rank, None):
            continue
        largest = num(getattr(m, "largest_free_bytes", None))
        mt = num(getattr(m, "time", None))
        if largest is None:
            continue
        dist = abs((t or 0.0) - (mt or 0.0)) if t is not None and mt is not None else math.inf
        reason = str(getattr(m, "reason", "") or "")
        if "oom" in reason.lower():
            dist = -1.0
        if best is None or dist < best[0]:
            best = (dist, largest)
    return None if best is None else best[1]


def _last_memory_value(run: Run, col: str, t: float | None, rank: int | None) -> float | None:
    """``col`` of the last memory row at or before ``t`` (the allocator collector's device columns)."""
    mem = run.memory
    if col not in mem or t is None:
        return None
    if rank is not None and "rank" in mem:
        mem = mem[mem["rank"] == rank]
    vals = mem.loc[mem["time"] <= t, col].dropna()
    return float(vals.iloc[-1]) if len(vals) else None


def _step_value(run: Run, col: str, step: int | None, rank: int | None) -> float | None:
    """``col`` of the memory row of ``step``."""
    mem = run.memory
    if col not in mem or step is None:
        return None
    if rank is not None and "rank" in mem:
        mem = mem[mem["rank"] == rank]
    vals = mem.loc[mem["step"] == step, col].dropna()
    return float(vals.iloc[-1]) if len(vals) else None


def _capacity(run: Run, data: dict[str, Any]) -> float | None:
    """The limit the allocation ran into: the limit this OOM's event (or torch's message) names, else the
    run's one capacity (:func:`gpudash.analysis.capacity.capacity_bytes`, as every other surface judges), else
    the device total or budget the event names."""
    cap = _pick(data, "capacity_bytes", "memory_budget_bytes", "cap_bytes")
    if cap is None:
        cap = capacity_bytes(run)
    if cap is None:
        cap = _pick(data, "budget_bytes", "device_total_bytes", "total_bytes")
    return cap


def _judge(r: OomReport) -> None:
    req, cap, free = r.requested_bytes, r.capacity_bytes, r.free_bytes
    need = r.need_bytes
    ev = r.evidence
    cats = r.categories
    # the totals quoted side by side get enough digits to tell them apart (never "3.5 MiB of 3.5 MiB")
    total = sum(cats.values()) if cats else None
    total_s, peak_s, need_s, cap_s = distinct_bytes(total, r.peak_bytes, need, cap, min_digits=2)
    if cats:
        parts = ", ".join(f"{k.removesuffix('_bytes')} {human_bytes(v)}" for k, v in cats.items() if v)
        ev.append(f"memory at step {r.categories_step} (last fully measured before the OOM): {parts} "
                  f"= {total_s}" + (f" (measured peak {peak_s})" if r.peak_bytes is not None else ""))
    if req is not None:
        ev.append(f"requested {human_bytes(req)}" + (f" with {human_bytes(free)} free" if free is not None else ""))
    if r.reserved_unallocated_bytes is not None:
        ev.append(f"reserved by the allocator but unallocated: {human_bytes(r.reserved_unallocated_bytes)}")
    if r.largest_free_bytes is not None:
        ev.append(f"largest free block: {human_bytes(r.largest_free_bytes)}")
    outside = r.outside_bytes
    if outside is not None and outside > 0:
        ev.append(f"device memory held outside this process's allocator: {human_bytes(outside)} "
                  f"(device used {human_bytes(r.device_used_bytes)} − reserved {human_bytes(r.reserved_bytes)})")
    if cap is not None and need is not None:
        ev.append(f"this process needed {need_s} of {cap_s} capacity")

    if r.measured_bytes is not None:
        ev.append("the memory budget meter refused the allocation: measured bytes exceeded the budget")
        r.verdict = "did not fit"
        return
    if (cap is not None and need is not None and outside is not None and need <= cap
            and outside > _CONTEXT_ALLOWANCE + 0.02 * cap
            and (req is None or (free or 0.0) + outside - _CONTEXT_ALLOWANCE >= req)):
        # our own need fits the card; what others hold would have covered the request
        r.verdict = "another process"
        return
    free_total = (r.reserved_unallocated_bytes or 0.0) + (free or 0.0)
    if req is not None and (need is None or cap is None or need <= cap):
        if r.largest_free_bytes is not None and free_total >= req > r.largest_free_bytes:
            r.verdict = "fragmentation"
            return
        if r.reserved_unallocated_bytes is not None and r.reserved_unallocated_bytes >= req:
            r.verdict = "fragmentation"
            return
    if cap is not None and ((need is not None and need > cap) or (cats and sum(cats.values()) > cap)):
        r.verdict = "did not fit"
        return
    if cap is None or need is None:
        ev.append("no capacity or request size was recorded with this OOM: the cause cannot be decided")
        r.verdict = "undetermined"
    else:
        r.verdict = "unexplained"


def oom_reports(run: Run) -> list[OomReport]:
    """One :class:`OomReport` per OOM event (and one for a crash by OOM that left no event)."""
    out: list[OomReport] = []
    ev = run.events
    rows = ev[ev["kind"].astype(str).str.lower().isin({"oom", "out_of_memory"})] if len(ev) else ev
    for _, e in rows.iterrows():
        data: dict[str, Any] = dict(e["data"]) if isinstance(e.get("data"), dict) else {}
        message = str(e.get("message") or "")
        for k, v in parse_oom_message(message).to_dict().items():
            data.setdefault(k, v)
        rank = int(e["rank"]) if "rank" in e and not pd.isna(e["rank"]) else None
        step = int(e["step"]) if not pd.isna(e.get("step")) else None
        t = num(e.get("time"))
        out.append(_report(run, data, message, step, t, rank, recovered=True))
    reason = str(run.meta.get("end_reason") or "")
    if not out and run.status == "crashed" and re.search(r"out ?of ?memory|OutOfMemory", reason, re.I):
        last_step = int(run.steps["step"].max()) + 1 if len(run.steps) else None
        out.append(_report(run, parse_oom_message(reason).to_dict(), reason, last_step, num(run.meta.get("ended_at")), None,
                           recovered=False))
    died_of_oom = run.status == "crashed" and bool(re.search(r"out ?of ?memory|OutOfMemory|\boom\b", reason, re.I))
    for i, r in enumerate(out):
        # the last OOM of a run that died of one killed it; every other one was survived
        r.recovered = not (died_of_oom and i == len(out) - 1)
    return out


def _report(run: Run, data: dict[str, Any], message: str, step: int | None, t: float | None, rank: int | None,
            *, recovered: bool) -> OomReport:
    cat_step, cats = categories_before(run, t, step, rank)
    reserved = _pick(data, "reserved_bytes")
    allocated = _pick(data, "allocated_bytes", "device_allocated_bytes")
    unalloc = _pick(data, "reserved_unallocated_bytes")
    if unalloc is None and reserved is not None and allocated is not None:
        unalloc = max(0.0, reserved - allocated)
    if reserved is None and allocated is not None and unalloc is not None:
        reserved = allocated + unalloc
    device_used = _pick(data, "device_used_bytes")
    total, free = _pick(data, "device_total_bytes", "capacity_bytes"), _pick(data, "free_bytes")
    if device_used is None and total is not None and free is not None:
        device_used = total - free  # the observer reports the device's free memory, all processes
    outside = _pick(data, "other_processes_bytes", "outside_bytes")
    if outside is None and device_used is not None and reserved is not None:
        outside = max(0.0, device_used - reserved)
    if outside is None:
        outside = _last_memory_value(run, "non_pytorch_bytes", t, rank)
    largest = _pick(data, "largest_free_bytes")
    if largest is None:
        largest = snapshot_largest_free(run, t, rank)
    r = OomReport(step=step, time=t, rank=rank, message=message, verdict="", recovered=recovered,
                  requested_bytes=_pick(data, "requested_bytes", "alloc_bytes"),
                  free_bytes=_pick(data, "free_bytes", "device_free_bytes"), largest_free_bytes=largest,
                  allocated_bytes=allocated, reserved_bytes=reserved, reserved_unallocated_bytes=unalloc,
                  capacity_bytes=_capacity(run, data) or _last_memory_value(run, "device_total_bytes", t, rank), device_used_bytes=device_used, outside_bytes=outside,
                  categories=cats, categories_step=cat_step, measured_bytes=_pick(data, "measured_bytes"),
                  peak_bytes=_step_value(run, "peak_bytes", cat_step, rank),
                  micro_batch=_pick(data, "micro_batch", "batch_size"))
    if re.search(r"\binject", message, re.I):
        r.verdict = "injected"
        r.evidence.append("raised on purpose by a testing aid (--inject-oom-at-batch): not a real shortage")
        return r
    _judge(r)
    return r


def oom_verdicts(run: Run) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for r in oom_reports(run):
        fatal = not r.recovered
        where = f" at step {r.step}" if r.step is not None else ""
        title = (f"Died of OOM{where}: {r.verdict}" if fatal
                 else f"OOM{where} (recovered): {r.verdict}")
        numbers = {k: float(v) for k, v in {
            "requested_bytes": r.requested_bytes, "capacity_bytes": r.capacity_bytes, "need_bytes": r.need_bytes,
            "reserved_unallocated_bytes": r.reserved_unallocated_bytes, "outside_bytes": r.outside_bytes,
            "largest_free_bytes": r.largest_free_bytes, "free_bytes": r.free_bytes,
            "micro_batch": r.micro_batch, "peak_bytes": r.peak_bytes}.items() if v is not None}
        numbers.update({k: float(v) for k, v in r.categories.items()})
        numbers["fatal"] = 1.0 if fatal else 0.0
        verdicts.append(Verdict(kind=f"oom:{r.verdict}", title=title, severity="bad" if fatal else "warn",
                                evidence=list(r.evidence), rank=r.rank,
                                steps=(r.step, r.step) if r.step is not None else None, numbers=numbers))
    return _merge_recovered(verdicts)


def _merge_recovered(verdicts: list[Verdict]) -> list[Verdict]:
    """Many recovered OOMs with the same verdict read as one line with a step range."""
    fatal = [v for v in verdicts if v.severity == "bad"]
    groups: dict[str, list[Verdict]] = {}
    for v in verdicts:
        if v.severity != "bad":
            groups.setdefault(v.kind, []).append(v)
    out = list(fatal)
    for kind, vs in groups.items():
        if len(vs) == 1:
            out.append(vs[0])
            continue
        steps = [v.steps[0] for v in vs if v.steps is not None]
        first = vs[0]
        first.title = f"{len(vs)} OOMs recovered: {kind.split(':', 1)[1]}"
        first.steps = (min(steps), max(steps)) if steps else None
        first.evidence = [f"{len(vs)} OOMs between {first.step_range}; the first:"] + first.evidence
        first.numbers["count"] = float(len(vs))
        out.append(first)
    return out
