"""Host memory by process, derived once from the ``host`` rows (:mod:`gpudash.collectors.procmem`).

The headline is the peak of each process's proportional set (PSS: pages shared by N processes count 1/N in
each, so the sum over the processes is what they hold together): the training process (``main``) and each
descendant slot (``worker 0``..., a DataLoader's workers keep their slots across epochs), per rank when
there are several. Beside it the peak of their sum, the peak of ``/dev/shm``, of pinned (page-locked) host memory
(or why it was not measured, said once), and the machine's lowest
available memory; :data:`LOW_AVAILABLE` of it is the finding's threshold. A run that died without a word
(SIGKILL can be neither caught nor recorded) while the machine's available memory was under
:data:`OOM_KILL_AVAILABLE` of its total at the last sample is said to have been killed by the OOM killer; so is a
run whose ``end_cause`` ``gpudash run``'s watcher recorded as ``oom_killed`` (:mod:`gpudash.zerocode.endwatch`:
the OOM-kill counter went up while the job ran).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.frames import numeric, sampled
from gpudash.analysis.leak import Growth, floor_growth
from gpudash.analysis.verdict import Verdict
from gpudash.store.run import DIED
from gpudash.store.schema import OOM_KILLED

__all__ = ["LOW_AVAILABLE", "OOM_KILL_AVAILABLE", "HostMemory", "WorkerLeak", "host_memory_text",
           "host_memory_verdicts", "oom_kill_text", "run_host_memory", "worker_leak_text", "worker_leaks"]

#: the finding and alert: the machine's available memory under this share of its total
LOW_AVAILABLE = 0.10
#: a silent death with available memory under this share of the total at the last sample: the OOM killer
OOM_KILL_AVAILABLE = 0.05
_SLOT = re.compile(r"^child(\d+)_pss_bytes$")


@dataclass(frozen=True)
class WorkerLeak:
    """A worker process whose memory grows step after step, by the one leak rule
    (:func:`gpudash.analysis.leak.floor_growth`) on that process's samples: its RSS, read every sample (its
    USS/PSS are read within a CPU budget, so they may lag a step or several), else its PSS."""

    process: str
    """``worker 2`` (``rank 1 worker 2`` with several ranks)."""
    pid: int
    growth: Growth
    rank: int | None = None


def worker_leak_text(w: WorkerLeak) -> str:
    from gpudash.units import human_bytes

    g = w.growth
    return (f"{w.process} (pid {w.pid}) grows {human_bytes(g.per_step_bytes)} per step since step {g.since_step} "
            f"({human_bytes(g.grown_bytes)} by step {g.last_step})")


def worker_leaks(host: pd.DataFrame, first_step: float | None = None) -> list[WorkerLeak]:
    """The workers whose memory grows step after step: each process (slot and pid) judged on its own samples at
    the steps they were taken in (``step`` of the host rows)."""
    if not len(host) or numeric(host, "step") is None:
        return []
    out = []
    groups = list(host.groupby("rank")) if "rank" in host and host["rank"].nunique() > 1 else [(None, host)]
    for key, g in groups:
        rank = None if key is None else int(str(key))
        who = "" if rank is None else f"rank {rank} "
        step = pd.to_numeric(g["step"], errors="coerce")
        for m in filter(None, (_SLOT.match(c) for c in g.columns)):
            slot = m.group(1)
            pss = numeric(g, f"child{slot}_rss_bytes")
            pss = pss if pss is not None else numeric(g, m.group(0))
            pid = numeric(g, f"child{slot}_pid")
            if pss is None or pid is None:
                continue
            for p, rows in pss.groupby(pid):  # a slot holds one process after another: each judged alone
                found = floor_growth(step.loc[rows.index], rows, first_step=first_step)
                if found is not None:
                    out.append(WorkerLeak(process=f"{who}worker {m.group(1)}", pid=int(p), growth=found,
                                          rank=rank))
    return sorted(out, key=lambda w: -w.growth.per_step_bytes)


@dataclass(frozen=True)
class HostMemory:
    peak_pss_bytes: dict[str, float] = field(default_factory=dict)
    """Peak PSS per process: ``main``, ``worker 0``, ... (``rank R main`` ... with several ranks)."""
    peak_total_pss_bytes: float | None = None
    """The largest sum over the processes of one rank at one sample (the largest rank's, with several)."""
    workers: int = 0
    """The most descendants alive at once (one rank)."""
    shm_peak_bytes: float | None = None
    min_available_bytes: float | None = None
    total_bytes: float | None = None
    low_available_at: float | None = None
    """When (unix time) available memory first fell under :data:`LOW_AVAILABLE` of the total; None if never."""
    last_available_bytes: float | None = None
    oom_killed: bool = False
    """The run died silently with the machine's memory nearly full: killed by the kernel's OOM killer."""
    leaks: tuple[WorkerLeak, ...] = ()
    """Workers whose memory grows step after step (:func:`worker_leaks`), fastest first."""
    oom_kills: int = 0
    """Processes the OOM killer killed on the machine while the run was sampled (a worker of it, or another's)."""
    pinned_peak_bytes: float | None = None
    """The most page-locked host memory torch's pinned allocator held (``pinned_bytes``), summed over the ranks'
    samples at their own peaks; None where not measured (then :attr:`pinned_unavailable` says why)."""
    pinned_unavailable: str | None = None
    """Why pinned memory was not measured, as the run recorded it once (``no CUDA: no pinned memory``)."""
    oom_reason: str | None = None
    """The end cause as ``gpudash run``'s watcher recorded it (``end_cause: oom_killed``), when it did."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _peak(v: pd.Series | None) -> float | None:
    return None if v is None else float(v.max())


def _metas(run: Any) -> list[dict[str, Any]]:
    return [run.meta, *(getattr(run, "rank_meta", None) or {}).values()]


def run_host_memory(run: Any) -> HostMemory | None:
    """The run's :class:`HostMemory`; None when it recorded no host row."""
    host = sampled(run, "host")
    if not len(host) or "time" not in host:
        return None
    host = host.sort_values("time")
    groups = list(host.groupby("rank")) if "rank" in host and host["rank"].nunique() > 1 else [(None, host)]
    peaks: dict[str, float] = {}
    totals: list[float] = []
    workers = 0
    for rank, g in groups:
        who = "" if rank is None else f"rank {rank} "
        parts = [c for c in ("main_pss_bytes", "children_pss_bytes") if numeric(g, c) is not None]
        main = _peak(numeric(g, "main_pss_bytes"))
        if main is not None:
            peaks[f"{who}main"] = main
        slots = sorted((int(m.group(1)), c) for c in g.columns if (m := _SLOT.match(c)))
        for i, col in slots:
            p = _peak(numeric(g, col))
            if p is not None:
                peaks[f"{who}worker {i}"] = p
        if parts:
            totals.append(float(g[parts].apply(pd.to_numeric, errors="coerce").fillna(0.0).sum(axis=1).max()))
        kids = numeric(g, "children")
        workers = max(workers, int(kids.max()) if kids is not None else 0)
    avail, total = numeric(host, "available_bytes"), numeric(host, "total_bytes")
    low_at = None
    if avail is not None and total is not None:
        low = (avail < LOW_AVAILABLE * total).to_numpy()
        if low.any():
            low_at = float(pd.to_numeric(host["time"], errors="coerce").to_numpy()[np.argmax(low)])
    last_avail = float(avail.dropna().iloc[-1]) if avail is not None else None
    last_total = float(total.dropna().iloc[-1]) if total is not None else None
    reason = str(run.meta.get("end_reason") or DIED)
    recorded = run.status == "crashed" and any(rm.get("end_cause") == OOM_KILLED for rm in _metas(run))
    killed = recorded or (run.status == "crashed" and reason == DIED and last_avail is not None
                          and last_total is not None and last_avail < OOM_KILL_AVAILABLE * last_total)
    kills = numeric(host, "oom_kills")
    pinned = [float(v.max()) for _, g in groups if (v := numeric(g, "pinned_bytes")) is not None]
    no_pinned = next((str(m["unavailable_pinned_memory"]) for m in _metas(run) if m.get("unavailable_pinned_memory")),
                     None)
    first = numeric(run.steps, "step")
    return HostMemory(leaks=tuple(worker_leaks(host, None if first is None else float(first.min()))),oom_kills=int(kills.max()) if kills is not None else 0, peak_pss_bytes=peaks, peak_total_pss_bytes=max(totals) if totals else None, workers=workers,
                      shm_peak_bytes=_peak(numeric(host, "shm_used_bytes")),
                      min_available_bytes=None if avail is None else float(avail.min()),
                      total_bytes=last_total, low_available_at=low_at, last_available_bytes=last_avail,
                      pinned_peak_bytes=sum(pinned) if pinned else None,
                      pinned_unavailable=None if pinned else no_pinned,
                      oom_killed=bool(killed), oom_reason=next((str(rm["end_reason"]) for rm in _metas(run)
                                                                if rm.get("end_cause") == OOM_KILLED
                                                                and rm.get("end_reason")), None) if recorded else None)


def host_memory_text(h: HostMemory, limit: int = 6) -> str:
    """``peak 3.1 GiB over 5 processes: main 1.0 GiB, worker 0 520 MiB, ...; /dev/shm up to 64 MiB; pinned up to
    512 MiB (or why not: ``no CUDA: no pinned memory``); available down to 2.0 GiB of 31 GiB``."""
    from gpudash.units import human_bytes

    bits = []
    if h.peak_pss_bytes:
        top = sorted(h.peak_pss_bytes.items(), key=lambda kv: -kv[1])
        listed = ", ".join(f"{k} {human_bytes(v)}" for k, v in top[:limit])
        more = f" and {len(top) - limit} more" if len(top) > limit else ""
        bits.append(f"peak {human_bytes(h.peak_total_pss_bytes)} (PSS) over {len(top)} process(es): {listed}{more}")
    if h.shm_peak_bytes is not None:
        bits.append(f"/dev/shm up to {human_bytes(h.shm_peak_bytes)}")
    if h.pinned_peak_bytes is not None:
        bits.append(f"pinned up to {human_bytes(h.pinned_peak_bytes)}")
    elif h.pinned_unavailable:
        bits.append(h.pinned_unavailable[:200])
    if h.min_available_bytes is not None:
        bits.append(f"available down to {human_bytes(h.min_available_bytes)}"
                    + (f" of {human_bytes(h.total_bytes)}" if h.total_bytes else ""))
    bits += [worker_leak_text(w) for w in h.leaks[:3]]
    if h.oom_kills:
        bits.append(f"the OOM killer killed {h.oom_kills} process(es) on the machine during the run")
    return "; ".join(bits)


def oom_kill_text(h: HostMemory) -> str:
    """The end reason of a run the OOM killer took."""
    from gpudash.units import human_bytes

    if h.oom_reason:
        return h.oom_reason
    return (f"killed by the kernel's OOM killer (SIGKILL, no traceback): the machine had "
            f"{human_bytes(h.last_available_bytes)} of {human_bytes(h.total_bytes)} available at the last sample")


def host_memory_verdicts(run: Any) -> list[Verdict]:
    """The summary's host-memory findings: the peak by process (when the workers were measured), and the
    machine's available memory under :data:`LOW_AVAILABLE` (bad when the OOM killer then took the run)."""
    from gpudash.units import human_bytes

    h = run_host_memory(run)
    if h is None:
        return []
    out = []
    if h.peak_pss_bytes:
        top = sorted(h.peak_pss_bytes.items(), key=lambda kv: -kv[1])
        out.append(Verdict(kind="host-memory", title=f"Host memory peak {human_bytes(h.peak_total_pss_bytes)} over "
                                                     f"{len(top)} process(es)", severity="ok",
                           evidence=[host_memory_text(h)],
                           numbers={"peak_total_pss_bytes": float(h.peak_total_pss_bytes or 0.0),
                                    "workers": float(h.workers)}))
    for w in h.leaks:
        out.append(Verdict(kind="worker-leak", title=f"{w.process[0].upper()}{w.process[1:]}'s memory grows step "
                                                     "after step", severity="warn", evidence=[worker_leak_text(w)],
                           recommendation="a worker keeps what it loads (a cache in the Dataset, a list that only "
                                          "grows): find it in the Dataset's __getitem__, or recycle the workers "
                                          "(persistent_workers=False)",
                           steps=(w.growth.since_step, w.growth.last_step), rank=w.rank,
                           numbers={"per_step_bytes": w.growth.per_step_bytes, "pid": float(w.pid)}))
    if h.low_available_at is not None or h.oom_killed or h.oom_kills:
        ev = [f"the machine's available memory fell to {human_bytes(h.min_available_bytes)} of "
              f"{human_bytes(h.total_bytes)} (under {LOW_AVAILABLE:.0%})"] if h.low_available_at is not None else []
        if h.oom_killed:
            ev.insert(0, oom_kill_text(h))
        if h.oom_kills:
            ev.append(f"the kernel's OOM killer killed {h.oom_kills} process(es) on the machine during the run "
                      "(a DataLoader worker it kills ends the run with \"DataLoader worker ... is killed by signal\")")
        if h.workers:
            ev.append(f"{h.workers} worker process(es): each holds its own copy of what it loads "
                      "(the peak by process says which)")
        title = "Killed by the OOM killer" if h.oom_killed else "Host memory nearly full" \
            if h.low_available_at is not None else f"The OOM killer killed {h.oom_kills} process(es) during the run"
        out.append(Verdict(kind="host-memory-low", title=title, severity="bad" if h.oom_killed else "warn", evidence=ev,
                           recommendation="fewer DataLoader workers (num_workers), a memory-mapped dataset the "
                                          "workers share instead of a copy each, or less CPU offload",
                           numbers={"min_available_bytes": float(h.min_available_bytes or 0.0),
                                    "total_bytes": float(h.total_bytes or 0.0)}))
    return out
