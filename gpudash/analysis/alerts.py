"""Alerts: the run's verdicts turned into "tell someone now", as pure rules (rows in, alerts out).

:func:`evaluate` looks at a trailing window of a run (a :class:`gpudash.Run` whose frames hold the newest
rows, as a live watcher reads them) and returns what holds there, through the same functions every surface
uses: :func:`~gpudash.analysis.stability.nonfinite_steps`, the one spike rule, the OOM forensics,
:func:`~gpudash.analysis.ranks.node_stragglers`, the run's capacity and its recent step period.
:class:`AlertGate` turns those findings into alerts, each once per episode, with a cooldown per kind.
:func:`recorded_alerts` reads back the ``alert`` events a run holds (the dashboard and the report show them).
Delivery (webhook, desktop, terminal, the run's events) lives with whoever raises them (gpudash.alerts.delivery).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.leak import leak_text, recorded_leaks
from gpudash.analysis.memory import MEASURED_PEAK_COLUMNS, capacity_bytes
from gpudash.analysis.oom import oom_reports
from gpudash.analysis.progress import step_period
from gpudash.analysis.ranks import run_stragglers
from gpudash.analysis.stability import (
    SPIKE_WINDOW,
    loss_series,
    nonfinite_steps,
    precision_fallbacks,
    spike_mask,
    spike_scores,
)
from gpudash.options import ALERT_KINDS
from gpudash.store.run import DIED, Run, parse_json
from gpudash.units import distinct_bytes

__all__ = ["ALERT_EVENT", "ALERT_KINDS", "EPISODE_GAP_STEPS", "FULL_EVERY_S", "STATE_KINDS", "Alert", "AlertGate",
           "TRIGGER_COLUMNS", "Triggers", "evaluate", "recorded_alerts"]

ALERT_EVENT = "alert"
"""The event kind an alert is recorded under in the run."""
EPISODE_GAP_STEPS = 10
"""Occurrences of one kind on one rank at most this many steps apart are one episode (one alert)."""
STATE_KINDS = frozenset({"stall", "headroom", "straggler", "host_memory"})
"""Kinds that hold for a while (an episode lasts while they hold); the others happen at a step."""
FULL_EVERY_S = 10.0
"""A live watcher evaluates every rule at least this often; between, only when :class:`Triggers` fire."""
_RETRY_COLUMNS = ("alloc_retries", "num_alloc_retries")
_USED_COLUMNS = (*MEASURED_PEAK_COLUMNS, "reserved_bytes", "allocated_bytes")


@dataclass(frozen=True)
class Alert:
    """One finding worth telling someone about."""

    kind: str
    """One of ALERT_KINDS."""
    text: str
    """One line, for a person."""
    step: int | None = None
    rank: int | None = None
    where: str | None = None
    """What the alert is about when not one rank (a node's name)."""
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(v: Any) -> int | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) else None


# ---- the rules: each a pure function of the window ----------------------------------------------
def _nonfinite(run: Run) -> list[Alert]:
    return [Alert("nonfinite", f"loss is non-finite (NaN/Inf) at step {s}", step=s) for s in nonfinite_steps(run)]


def _spikes(run: Run, complete: bool) -> list[Alert]:
    steps, loss = loss_series(run)
    mask, z = spike_scores(loss)
    out = []
    for i in np.flatnonzero(mask):
        if not complete and i < SPIKE_WINDOW:  # the window cut its history short: judged when it was newest
            continue
        with np.errstate(all="ignore"):
            before = loss[max(0, i - SPIKE_WINDOW):i]
            med = float(np.nanmedian(before)) if np.isfinite(before).any() else float("nan")
        out.append(Alert("loss_spike", f"loss spike at step {int(steps[i])}: {loss[i]:.4g} is {z[i]:.1f} robust "
                                       f"sigma above the recent median {med:.4g}", step=int(steps[i]),
                         data={"loss": float(loss[i]), "z": float(z[i])}))
    return out


def _ooms(run: Run) -> list[Alert]:
    out = []
    for r in oom_reports(run):
        where = f" at step {r.step}" if r.step is not None else ""
        who = f" on rank {r.rank}" if r.rank is not None and len(run.ranks) > 1 else ""
        why = f"; {r.evidence[0]}" if r.evidence else ""
        out.append(Alert("oom", f"CUDA out of memory{where}{who}: {r.verdict}{why}", step=r.step, rank=r.rank,
                         data={"verdict": r.verdict, "recovered": r.recovered}))
    return out


def _fallbacks(run: Run) -> list[Alert]:
    return [Alert("precision_fallback", f"precision fallback at step {s}: {m}", step=s if s >= 0 else None)
            for s, m in precision_fallbacks(run)]


def _retries(run: Run) -> list[Alert]:
    mem = run.memory
    col = next((c for c in _RETRY_COLUMNS if c in mem), None)
    if col is None or not len(mem):
        return []
    out = []
    for rank, g in mem.groupby("rank") if "rank" in mem else [(None, mem)]:
        g = g.sort_values("step")
        v = pd.to_numeric(g[col], errors="coerce").ffill()
        rose = v.diff() > 0
        for step, total in zip(g.loc[rose, "step"], v[rose], strict=True):
            out.append(Alert("alloc_retries", f"the allocator retried (freed its cache to find memory) at step "
                                              f"{int(step)}: {int(total)} retries so far (fragmentation or memory "
                                              f"pressure; steps slow down)", step=int(step), rank=_int(rank),
                             data={"retries": int(total)}))
    return out


def _headroom(run: Run, headroom_pct: float) -> list[Alert]:
    mem = run.memory
    cap = capacity_bytes(run)
    col = next((c for c in _USED_COLUMNS if c in mem and pd.to_numeric(mem[c], errors="coerce").notna().any()),
               None)
    if not cap or col is None or not len(mem):
        return []
    out = []
    for rank, g in mem.groupby("rank") if "rank" in mem else [(None, mem)]:
        used = pd.to_numeric(g.sort_values("step")[col], errors="coerce").dropna()
        if not len(used):
            continue
        last = float(used.iloc[-1])
        left = 100.0 * (1.0 - last / cap)
        if left < headroom_pct:
            step = _int(g.loc[used.index[-1], "step"])
            used_text, cap_text = distinct_bytes(last, cap, min_digits=2)
            out.append(Alert("headroom", f"memory at {used_text} of {cap_text} ({left:.1f} % headroom, under "
                                         f"{headroom_pct:g} %): the next larger batch or sequence may OOM",
                             step=step, rank=_int(rank), data={"used_bytes": last, "capacity_bytes": cap,
                                                                "headroom_pct": left}))
    return out


def _stall(run: Run, now: float, factor: float, min_s: float) -> list[Alert]:
    s = run.steps
    if run.status != "live" or not len(s) or "time" not in s:
        return []
    t = pd.to_numeric(s["time"], errors="coerce")
    if not t.notna().any():
        return []
    dur = pd.to_numeric(s["duration_s"], errors="coerce").to_numpy(dtype=float).tolist() if "duration_s" in s else None
    period = step_period(pd.to_numeric(s["step"], errors="coerce").to_numpy(dtype=float).tolist(),
                         t.to_numpy(dtype=float).tolist(), dur)
    if period is None:
        return []
    idle = now - float(t.max())
    limit = max(factor * period, min_s)
    if idle <= limit:
        return []
    last = _int(pd.to_numeric(s["step"], errors="coerce").max())
    return [Alert("stall", f"no step for {idle:.0f} s (the recent step took {period:.3g} s; last step {last}): "
                           "a dead data loader, a hung collective or a deadlock?", step=last,
                  data={"idle_s": idle, "step_s": period})]


def _stragglers(run: Run) -> list[Alert]:
    if len(run.ranks) < 2:
        return []
    found = run_stragglers(run)
    if not found["steps"]:
        return []
    ranks = found["ranks"]
    out = [Alert("straggler", f"node {n}: all its ranks are slow while other nodes' are not (a slow machine, "
                              "link or data source)", where=str(n)) for n in found["node_stragglers"]]
    for r in found["rank_stragglers"]:
        excess = float(ranks.loc[r, "excess"])
        out.append(Alert("straggler", f"rank {r} is a straggler: its own work takes {100 * excess:.0f} % of a step "
                                      "longer than the fast ranks' (every rank waits for it)", rank=int(r),
                         data={"excess": excess}))
    return out


def _leaks(run: Run) -> list[Alert]:
    """The leaks the training process's leak watch recorded (the leak rule on its trailing rows, which hold
    what this window does not: the host samples), each one alert."""
    return [Alert("leak", leak_text(lk), step=lk.last_step, rank=lk.rank, data=lk.as_dict())
            for lk in recorded_leaks(run)]


def _crashed(run: Run) -> list[Alert]:
    if run.status != "crashed":
        return []
    s = run.steps
    last = _int(pd.to_numeric(s["step"], errors="coerce").max()) if len(s) and "step" in s else None
    reason = str(run.meta.get("end_reason") or DIED)
    if reason == "KeyboardInterrupt":  # stopped by the person at the terminal: nobody to tell
        return []
    at = f" after step {last}" if last is not None else " before its first step"
    return [Alert("crashed", f"run crashed{at}: {reason[:300]}", step=last, data={"reason": reason[:2000]})]


def evaluate(run: Run, now: float | None = None, *, complete: bool = True, stall_factor: float = 10.0,
             stall_min_s: float = 60.0, headroom_pct: float = 5.0,
             kinds: tuple[str, ...] = ALERT_KINDS) -> list[Alert]:
    """What holds in ``run`` (a trailing window, or a whole run) at ``now``: every occurrence of the
    kinds that happen at a step, and the state kinds that hold now. ``complete``: the window starts at the
    run's first step (else spikes too close to its start, whose history it cut, are left to earlier looks)."""
    now = time.time() if now is None else now
    want = set(kinds)
    out: list[Alert] = []
    if "nonfinite" in want:
        out += _nonfinite(run)
    if "loss_spike" in want:
        nonfinite = {a.step for a in out}
        out += [a for a in _spikes(run, complete) if a.step not in nonfinite]
    if "oom" in want:
        out += _ooms(run)
    if "precision_fallback" in want:
        out += _fallbacks(run)
    if "alloc_retries" in want:
        out += _retries(run)
    if "headroom" in want:
        out += _headroom(run, headroom_pct)
    if "stall" in want:
        out += _stall(run, now, stall_factor, stall_min_s)
    if "straggler" in want:
        out += _stragglers(run)
    if "leak" in want:
        out += _leaks(run)
    if "crashed" in want:
        out += _crashed(run)
    if "host_memory" in want:
        out += _host_memory(run)
    if "worker_leak" in want:
        out += _worker_leaks(run)
    return out


def _worker_leaks(run: Run) -> list[Alert]:
    """A worker process whose memory grows step after step in the trailing host rows (the one leak rule on
    each process's samples: :func:`gpudash.analysis.hostmem.worker_leaks`)."""
    from gpudash.analysis.frames import sampled
    from gpudash.analysis.hostmem import worker_leak_text, worker_leaks

    return [Alert("worker_leak", worker_leak_text(w), step=w.growth.last_step, rank=w.rank,
                  data={"process": w.process, "pid": w.pid, "per_step_bytes": w.growth.per_step_bytes})
            for w in worker_leaks(sampled(run, "host"))]


def _host_memory(run: Run) -> list[Alert]:
    """The machine's available memory under :data:`gpudash.analysis.hostmem.LOW_AVAILABLE` of its total at
    the newest host sample of a rank: the kernel's OOM killer is near, and it leaves no traceback."""
    from gpudash.analysis.frames import numeric, sampled
    from gpudash.analysis.hostmem import LOW_AVAILABLE

    host = sampled(run, "host")
    if not len(host) or numeric(host, "available_bytes") is None or numeric(host, "total_bytes") is None:
        return []
    out = []
    for rank, g in host.groupby("rank") if "rank" in host else [(None, host)]:
        g = g.sort_values("time")
        avail, total = numeric(g, "available_bytes"), numeric(g, "total_bytes")
        if avail is None or total is None or not avail.notna().any():
            continue
        i = avail.last_valid_index()
        a, t = float(avail.loc[i]), float(total.loc[i])
        if t > 0 and a < LOW_AVAILABLE * t:
            shown, of = distinct_bytes(a, t, min_digits=2)
            out.append(Alert("host_memory", f"host memory nearly full: {shown} of {of} available (under "
                                            f"{LOW_AVAILABLE:.0%}); the OOM killer takes the run without a "
                                            "traceback", step=_int(g.loc[i].get("step")), rank=_int(rank),
                             data={"available_bytes": a, "total_bytes": t}))
    return out


# ---- when a live look is worth a full evaluation ----------------------------------------------------------
#: The columns :class:`Triggers` reads from a look's new rows.
TRIGGER_COLUMNS = frozenset({"rank", "loss", *("nonfinite", "non_finite", "skipped", "skipped_step", "found_inf"),
                             "skipped_steps", "alloc_retries", "num_alloc_retries", *MEASURED_PEAK_COLUMNS,
                             "reserved_bytes", "allocated_bytes"})
_FLAG_COLUMNS = ("nonfinite", "non_finite", "skipped", "skipped_step", "found_inf")
_TOTAL_COLUMNS = ("skipped_steps",)


class Triggers:
    """Cheap necessary conditions on a look's new rows (columns as float arrays, ``rank`` included) for the
    rules to find something new: a non-finite loss or flag, a spike by the one spike rule on the trailing
    losses, a counter (retries, skipped steps) that rose, memory within the headroom of a known capacity.
    They only decide *when* :func:`evaluate` runs; what it finds is the rules' call, and a live watcher
    evaluates at least every :data:`FULL_EVERY_S` anyway."""

    def __init__(self) -> None:
        self.losses = np.zeros(0)
        self.totals: dict[tuple[float, str], float] = {}
        self.capacity: float | None = None

    def _rose(self, key: tuple[float, str], values: np.ndarray) -> bool:
        values = values[np.isfinite(values)]
        if not len(values):
            return False
        top, before = float(values.max()), self.totals.get(key)
        self.totals[key] = top if before is None else max(before, top)
        if before is None:
            return float(values.min()) < top  # rose within these rows
        return top > before

    def fire(self, steps: dict[str, np.ndarray], memory: dict[str, np.ndarray], headroom_pct: float) -> bool:
        hit = False
        if "loss" in steps and len(steps["loss"]):
            rank = steps.get("rank")
            new = steps["loss"] if rank is None else steps["loss"][rank == np.nanmin(rank)]
            both = np.concatenate([self.losses, new])
            if np.isinf(new).any() or np.isnan(new).any() and np.isfinite(both).mean() >= 0.5:
                hit = True
            elif len(new) and spike_mask(both[-(len(new) + SPIKE_WINDOW):])[-len(new):].any():
                hit = True
            self.losses = both[-SPIKE_WINDOW:]
        for col in _FLAG_COLUMNS:
            if col in steps and (np.nan_to_num(steps[col]) > 0).any():
                hit = True
        for col in _TOTAL_COLUMNS:
            if col in steps:
                hit = self._rose((0.0, col), steps[col]) or hit
        ranks = memory.get("rank")
        for col in _RETRY_COLUMNS:
            if col in memory:
                for r in np.unique(ranks) if ranks is not None else [0.0]:
                    values = memory[col] if ranks is None else memory[col][ranks == r]
                    hit = self._rose((float(r), col), values) or hit
        used = next((c for c in _USED_COLUMNS if c in memory), None)
        if self.capacity and used is not None:
            hit = hit or bool((np.nan_to_num(memory[used]) >= (1.0 - headroom_pct / 100.0) * self.capacity).any())
        return hit


# ---- episodes and cooldown ------------------------------------------------------------------------
class AlertGate:
    """Findings in, alerts out: each episode alerts once, and a kind that alerted stays quiet for
    ``cooldown_s`` (a new episode inside it is counted in ``suppressed``).

    An episode of a kind that happens at a step (non-finite, spike, OOM, retries, fallback, crash) is its
    occurrences on one rank at most :data:`EPISODE_GAP_STEPS` apart; an occurrence already seen is never
    new again (a trailing window shows it many times). An episode of a state kind (stall, headroom,
    straggler) lasts while every look finds it. Memory is bounded (the occurrences remembered are capped).
    """

    def __init__(self, cooldown_s: float = 300.0, remember: int = 10_000) -> None:
        self.cooldown_s = cooldown_s
        self.suppressed = 0
        self._seen: set[tuple[Any, ...]] = set()
        self._order: deque[tuple[Any, ...]] = deque()
        self._remember = remember
        self._last_step: dict[tuple[Any, ...], int] = {}
        self._active: set[tuple[Any, ...]] = set()
        self._fired: dict[str, float] = {}

    def _remember_key(self, key: tuple[Any, ...]) -> None:
        self._seen.add(key)
        self._order.append(key)
        if len(self._order) > self._remember:
            self._seen.discard(self._order.popleft())

    def _cooling(self, kind: str, now: float) -> bool:
        last = self._fired.get(kind)
        return last is not None and now - last < self.cooldown_s

    def admit(self, found: list[Alert], now: float | None = None, *, quiet: bool = False) -> list[Alert]:
        """The alerts to send among ``found`` (one look's :func:`evaluate`). ``quiet``: take note of what
        is there without sending (a server's first look at a run that was already going)."""
        now = time.time() if now is None else now
        out: list[Alert] = []
        active: set[tuple[Any, ...]] = set()
        for a in sorted(found, key=lambda a: (a.step if a.step is not None else -1)):
            who = (a.kind, a.rank, a.where)
            if a.kind in STATE_KINDS:
                active.add(who)
                if who in self._active:
                    continue
                new = True
            else:
                key = (*who, a.step)
                if key in self._seen:
                    continue
                self._remember_key(key)
                step = a.step if a.step is not None else -1
                prev = self._last_step.get(who)
                new = prev is None or step - prev > EPISODE_GAP_STEPS or a.kind == "crashed"
                if prev is None or step > prev:
                    self._last_step[who] = step
                if a.kind == "crashed" and prev is not None:
                    new = False
            if not new or quiet:
                continue
            if self._cooling(a.kind, now):
                self.suppressed += 1
                continue
            self._fired[a.kind] = now
            out.append(a)
        self._active = active
        return out


# ---- reading them back -------------------------------------------------------------------------------
def recorded_alerts(run: Run) -> list[Alert]:
    """The alerts a run holds (its ``alert`` events), in time order."""
    ev = run.events
    if ev.empty or "kind" not in ev:
        return []
    rows = ev[ev["kind"].astype(str) == ALERT_EVENT]
    if "time" in rows:
        rows = rows.sort_values("time")
    out = []
    for _, e in rows.iterrows():
        data = e["data"] if isinstance(e.get("data"), dict) else parse_json(e.get("data"))
        out.append(Alert(kind=str(data.get("alert") or "?"), text=str(e.get("message") or ""),
                         step=_int(e.get("step")), rank=_int(data.get("rank")),
                         where=str(data["where"]) if data.get("where") is not None else None,
                         data={k: v for k, v in data.items() if k not in ("alert", "rank", "where")}))
    return out
