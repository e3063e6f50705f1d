"""``run_facts(run)``: the facts about a run, derived once, rendered by every surface.

The dashboard (lights, markers, summary panel), ``gpudash report --format
json``, ``gpudash info --json``, ``/api/runs/<id>/summary``, ``/metrics`` and
the trainer's end-of-run lines all show these numbers; none of them decides
on its own what a phase, a spike, an OOM or a peak is.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpudash.analysis.attempts import Resume, attempt_count, resumes, resumes_text
from gpudash.analysis.bottleneck import Bound, run_bound
from gpudash.analysis.energy import Energy, energy_text, run_energy
from gpudash.analysis.frames import numeric as _num
from gpudash.analysis.hostmem import HostMemory, host_memory_text, oom_kill_text, run_host_memory
from gpudash.analysis.leak import Leak, leak_text, run_leak
from gpudash.analysis.lights import FRAG_BAD_PCT, FRAG_WARN_PCT, Light, fragmentation_pct, stability_lights
from gpudash.analysis.listing import steps_through
from gpudash.analysis.memory import MEASURED_PEAK_COLUMNS, capacity_bytes, estimator_errors
from gpudash.analysis.memory_parts import frozen_params
from gpudash.analysis.phases import run_phases
from gpudash.analysis.progress import Progress, progress_text, run_progress
from gpudash.analysis.ranks import STRAGGLER_RATIO, rank_nodes, run_stragglers
from gpudash.analysis.rates import RECENT_STEPS, Throughput, fmt_mfu, fmt_rate, throughput
from gpudash.analysis.stability import SPIKE_RATIO, SPIKE_WINDOW, SPIKE_Z, loss_spikes, nonfinite_steps
from gpudash.analysis.verdict import num
from gpudash.store.run import Run, run_start
from gpudash.store.schema import MEMORY_CATEGORIES, MEMORY_PARTS, SAME_OOM_S

__all__ = ["CATEGORY_COLUMNS", "MEASURED_PEAK_COLUMNS", "SAME_OOM_S", "Facts", "estimator_error", "headline_rows",
           "json_safe", "oom_count", "peak_memory", "run_facts", "step_count"]

#: ``peak_bytes`` keys and the memory columns they are the maximum of.
CATEGORY_COLUMNS = {c.removesuffix("_bytes"): c for c in MEMORY_CATEGORIES}
_OOM_COUNTERS = ("num_ooms", "ooms")
_RETRIES = ("alloc_retries", "num_alloc_retries")
_NONFINITE_COLS = ("nonfinite", "non_finite", "skipped", "skipped_step", "skipped_steps", "found_inf")


@dataclass(frozen=True)
class Facts:
    """What gpudash says about a run. ``to_json()`` is the ``"facts"`` object of every JSON surface."""

    status: str
    steps: int
    """Steps recorded: the last step number less the first, + 1 (steps are numbered from 0, or as the
    framework numbers them: HF and Lightning from ``global_step`` 1, a resumed run from where it resumed)."""
    ranks: int
    phases: tuple[str, ...]
    """What ``monitor.phase()`` opened (the run's ``phases`` record), known phases first."""
    loss_spike_steps: tuple[int, ...]
    nonfinite_steps: tuple[int, ...]
    oom_count: int
    """OOMs, each counted once (an observer event and an exception event of one OOM are one)."""
    peak_bytes: dict[str, float | None]
    """Largest params / grads / optimizer / activations bytes, and ``measured``: the largest measured step peak."""
    capacity_bytes: float | None
    fragmentation_pct: float | None
    """Worst share (%) of reserved memory in inactive split blocks."""
    alloc_retries: int | None
    estimator_error: float | None
    """Median over steps of predicted_peak_bytes / measured peak - 1."""
    headline: dict[str, float | None]
    """duration_s, step_time_median_s, step_time_p95_s, tokens_per_s, samples_per_s, mfu (over every step:
    :func:`gpudash.analysis.rates.throughput`), peak_memory_bytes."""
    lights: tuple[Light, ...]
    thresholds: dict[str, float] = field(default_factory=dict)
    nodes: int = 1
    """Machines the ranks ran on (the ``node`` each rank recorded)."""
    node_stragglers: tuple[str, ...] = ()
    """Nodes whose ranks are all slow while another node's are not (worst first): one slow machine."""
    rank_stragglers: tuple[int, ...] = ()
    dropped_records: int = 0
    """Records the writer's full buffer dropped (all ranks): ``steps`` counts step indices, so a run that
    dropped step rows has fewer rows than ``steps`` says."""
    dropped_values: int = 0
    """Logged values that could not be stored (left empty), all ranks."""
    """Slow ranks on otherwise healthy nodes (worst first)."""
    progress: Progress | None = None
    """Steps done of the run's ``total_steps`` and the ETA while live (None when the total is unknown)."""
    trainable_params_bytes: float | None = None
    """The part of the parameters that requires grad (LoRA adapters); None when not recorded."""
    frozen_params_bytes: float | None = None
    """Parameters that do not require grad (a frozen base model): ``params`` peak less the trainable ones."""
    params_dtypes: dict[str, float] = field(default_factory=dict)
    """Parameter bytes per dtype (quantized weights named with their class: ``uint8 (Params4bit)``)."""
    steps_from: str | None = None
    """How ``gpudash run`` counted the steps (optimizer steps, or backward calls without an optimizer)."""
    no_steps_reason: str | None = None
    """Why a run has no step, when it knows (``gpudash run`` says so rather than a silent "finished")."""
    recent: Throughput = field(default_factory=Throughput)
    """The rates over the last :data:`gpudash.analysis.rates.RECENT_STEPS` steps (what a live run does now)."""
    bound: Bound | None = None
    """What bounds the step time (input-, compute-, host/offload- or synchronization-bound), as the bottleneck
    verdict judges it (:func:`gpudash.analysis.bottleneck.run_bound`); None without recorded phases."""
    leak: Leak | None = None
    """Memory held between steps that grows step after step (:func:`gpudash.analysis.leak.run_leak`)."""
    attempts: int = 1
    """Processes that recorded the run (a preempted, resumed run has 2 or more: :mod:`gpudash.analysis.attempts`)."""
    resumes: tuple[Resume, ...] = ()
    """Where and when each later attempt resumed (its ``resume`` event)."""
    host_memory: HostMemory | None = None
    """Host memory by process: the training process and its workers (:mod:`gpudash.analysis.hostmem`)."""
    energy: Energy | None = None
    """Joules per step, Wh per million tokens, kWh per run (:mod:`gpudash.analysis.energy`)."""
    end_reason: str | None = None
    """Why a run that is not finished ended: what it recorded, or the OOM killer where the rows say so."""

    def light(self, signal: str) -> Light | None:
        return next((li for li in self.lights if li.signal == signal), None)

    def to_json(self) -> dict[str, Any]:
        """JSON-safe (no NaN or infinity: unknown is null)."""
        d = asdict(self)
        d["lights"] = [li.as_dict() for li in self.lights]
        return json_safe(d)


def json_safe(v: Any) -> Any:
    """``v`` with NaN and infinities as None and numpy scalars as Python numbers."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(float(v)) else None
    return v


def _max(df: pd.DataFrame, col: str) -> float | None:
    v = _num(df, col)
    return None if v is None else float(v.max())


def oom_count(run: Run) -> int:
    """OOMs of the run, each once: the allocator observer's event and the caught exception's event of one
    OOM (same rank and step, within ``SAME_OOM_S``) count as one; so does the counter in the memory rows."""
    ev = run.events
    n = 0
    if len(ev) and "kind" in ev:
        ooms = ev[ev["kind"].astype(str) == "oom"].sort_values("time")
        observed: list[tuple[Any, Any, float]] = []  # unmatched observer events: (rank, step, time)
        for _, e in ooms.iterrows():
            data = e.get("data") if isinstance(e.get("data"), dict) else {}
            key = (e.get("rank"), e.get("step"), float(e.get("time") or 0.0))
            if data.get("source") == "allocator_observer":
                observed.append(key)
                n += 1
                continue
            twin = next((o for o in observed if o[0] == key[0] and o[1] == key[1]
                         and abs(key[2] - o[2]) <= SAME_OOM_S), None)
            if twin is not None:
                observed.remove(twin)
            else:
                n += 1
    mem = run.memory
    for col in _OOM_COUNTERS:
        v = _num(mem, col)
        if v is not None:
            per_rank = v.groupby(mem["rank"]).max() if "rank" in mem else v.max()
            n = max(n, int(np.nansum(np.asarray(per_rank, dtype=float))))
    reason = str(run.meta.get("end_reason") or "").lower()
    if n == 0 and run.status == "crashed" and "out of memory" in reason:
        n = 1
    return n


def _peaks(mem: pd.DataFrame) -> dict[str, float | None]:
    out: dict[str, float | None] = {k: _max(mem, c) for k, c in CATEGORY_COLUMNS.items()}
    # grads_bytes is what the step held at its peak moment (0 before the first backward of a step);
    # the gradients' own peak is their full size, recorded beside it
    total = _max(mem, "grads_total_bytes")
    if total is not None:
        out["grads"] = max(total, out["grads"] or 0.0)
    out["measured"] = next((m for m in (_max(mem, c) for c in MEASURED_PEAK_COLUMNS) if m is not None), None)
    return out


def peak_memory(mem: pd.DataFrame, peaks: dict[str, float | None]) -> float | None:
    """The run's one peak-memory number: the measured peak, else the largest reserved / allocated bytes,
    else the largest per-row sum of the categories."""
    if peaks.get("measured") is not None:
        return peaks["measured"]
    for col in ("reserved_bytes", "allocated_bytes"):
        m = _max(mem, col)
        if m is not None:
            return m
    cats = [c for c in MEMORY_PARTS if _num(mem, c) is not None]
    if not cats:
        return None
    return float(mem[cats].apply(pd.to_numeric, errors="coerce").fillna(0.0).sum(axis=1).max())


def estimator_error(mem: pd.DataFrame) -> float | None:
    """Median over steps of ``predicted_peak_bytes / measured - 1`` (see :func:`estimator_errors`)."""
    found = estimator_errors(mem)
    return None if found is None else float(found[1].median())


def _headline(run: Run, steps: pd.DataFrame) -> dict[str, float | None]:
    """The run's duration and its :func:`gpudash.analysis.rates.throughput` over every step."""
    tp = throughput(steps, run.meta)
    out: dict[str, float | None] = {"duration_s": None, "step_time_median_s": tp.step_time_median_s,
                                    "step_time_p95_s": tp.step_time_p95_s, "tokens_per_s": tp.tokens_per_s,
                                    "samples_per_s": tp.samples_per_s, "mfu": tp.mfu}
    t = _num(steps, "time")
    if t is not None:
        dur = _num(steps, "duration_s")
        first = float((t - (dur.fillna(0.0) if dur is not None else 0.0)).min())
        t0 = run_start(run.meta, run.rank_meta)
        ended = num(run.meta.get("ended_at")) if run.status != "live" else None
        t1 = max(ended, float(t.max())) if ended is not None else float(t.max())
        out["duration_s"] = t1 - min(t0 if t0 is not None else first, first)
    return out


def _count(v: Any) -> int:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0 else 0


def step_count(steps: pd.DataFrame, meta: dict[str, Any] | None = None) -> int:
    """Steps a run recorded: last step number + 1 - its first (``first_step`` in the meta: 1 where HF or Lightning
    numbered the steps by ``global_step``; else 0). Rows dropped on the way do not lower it."""
    if not len(steps) or "step" not in steps:
        return 0
    return steps_through(float(pd.to_numeric(steps["step"], errors="coerce").max()), meta)


def run_facts(run: Run) -> Facts:
    """Every fact about ``run`` that more than one surface shows, derived once."""
    steps, mem = run.steps, run.memory
    n = step_count(steps, run.meta)
    spikes = loss_spikes(run)
    nonfinite = nonfinite_steps(run)
    ooms = oom_count(run)
    retry_col = next((c for c in _RETRIES if _num(mem, c) is not None), None)
    retries = int(_max(mem, retry_col) or 0) if retry_col else None
    frag = fragmentation_pct(mem)
    loss_logged = _num(steps, "loss") is not None
    nonfinite_recorded = loss_logged or any(_num(steps, c) is not None for c in _NONFINITE_COLS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lights = stability_lights(steps=n, loss_logged=loss_logged, spikes=len(spikes), nonfinite=len(nonfinite),
                                  nonfinite_recorded=nonfinite_recorded, ooms=ooms, retries=retries, frag_pct=frag)
    capacity = capacity_bytes(run)
    peaks = _peaks(mem)
    headline = _headline(run, steps)
    headline["peak_memory_bytes"] = peak_memory(mem, peaks)
    nodes = rank_nodes(run.rank_meta)
    strag = run_stragglers(run) if len(run.ranks) > 1 else {"node_stragglers": [], "rank_stragglers": []}
    dropped = {k: sum(_count(m.get(k)) for m in run.rank_meta.values()) for k in ("dropped_records", "dropped_values")}
    hostmem = run_host_memory(run)
    return Facts(
        dropped_records=dropped["dropped_records"], dropped_values=dropped["dropped_values"],
        status=run.status, steps=n, ranks=max(len(run.ranks), 1 if n else 0),
        phases=tuple(run_phases(run.meta, steps)),
        loss_spike_steps=tuple(spikes), nonfinite_steps=tuple(nonfinite), oom_count=ooms,
        peak_bytes=peaks, capacity_bytes=capacity, fragmentation_pct=frag, alloc_retries=retries,
        estimator_error=estimator_error(mem), headline=headline, lights=tuple(lights),
        thresholds={"frag_warn_pct": FRAG_WARN_PCT, "frag_bad_pct": FRAG_BAD_PCT, "spike_z": SPIKE_Z,
                    "spike_ratio": SPIKE_RATIO, "spike_window": float(SPIKE_WINDOW),
                    "straggler_ratio": STRAGGLER_RATIO},
        nodes=max(len(set(nodes.values())), 1), node_stragglers=tuple(strag["node_stragglers"]),
        rank_stragglers=tuple(strag["rank_stragglers"]), progress=run_progress(run, n),
        recent=throughput(steps, run.meta, last=RECENT_STEPS), bound=run_bound(run),
        leak=run_leak(run), attempts=attempt_count(run), resumes=tuple(resumes(run.events)),
        host_memory=hostmem, energy=run_energy(run, n), end_reason=_end_reason(run, hostmem),
        **_params_facts(run, peaks))


def _end_reason(run: Run, hostmem: HostMemory | None) -> str | None:
    if hostmem is not None and hostmem.oom_killed:
        return oom_kill_text(hostmem)
    reason = run.meta.get("end_reason")
    return str(reason) if reason and run.status != "finished" else None


def _params_facts(run: Run, peaks: dict[str, float | None]) -> dict[str, Any]:
    trainable = _max(run.memory, "trainable_params_bytes")
    params = peaks.get("params")
    frozen = float(frozen_params(params, trainable)) if trainable is not None and params is not None else None
    dtypes = run.meta.get("params_dtypes")
    dtypes = {str(k): float(v) for k, v in dtypes.items() if isinstance(v, int | float)} \
        if isinstance(dtypes, dict) else {}
    text = {k: str(run.meta[k])[:500] if run.meta.get(k) else None for k in ("steps_from", "no_steps_reason")}
    return {"trainable_params_bytes": trainable, "frozen_params_bytes": frozen, "params_dtypes": dtypes, **text}


def _steps_text(steps: tuple[int, ...], limit: int = 8) -> str:
    from gpudash.analysis.stability import ranges

    rs = ranges(list(steps))
    parts = [f"{a}" if a == b else f"{a}–{b}" for a, b in rs[:limit]]
    return ", ".join(parts) + (f" and {len(rs) - limit} more" if len(rs) > limit else "")


def headline_rows(facts: Facts, meta: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """The facts as (label, text) rows: the report's table, ``gpudash info`` and the trainer's last lines."""
    from gpudash.analysis.verdict import fmt_s
    from gpudash.units import distinct_bytes, human_bytes

    meta = meta or {}
    h = facts.headline
    rows = [("status", facts.status)]
    if facts.end_reason:
        rows.append(("ended", facts.end_reason))
    elif meta.get("end_reason") and facts.status != "finished":
        rows.append(("ended", str(meta["end_reason"])))
    if facts.attempts > 1:
        rows.append(("attempts", f"{facts.attempts} attempts" + (f": {resumes_text(list(facts.resumes))}"
                                                                 if facts.resumes else "")))
    rows += [("device", str(meta.get("device_name") or meta.get("device") or "?")), ("ranks", str(facts.ranks) + (f" on {facts.nodes} nodes" if facts.nodes > 1 else ""))]
    if facts.node_stragglers or facts.rank_stragglers:
        who = [f"node {n} (all its ranks)" for n in facts.node_stragglers] + [f"rank {r}" for r in
                                                                           facts.rank_stragglers[:8]]
        rows.append(("stragglers", ", ".join(who) + (f" and {len(facts.rank_stragglers) - 8} more ranks"
                                                     if len(facts.rank_stragglers) > 8 else "")))
    if not facts.steps and facts.no_steps_reason:
        rows.append(("no steps", facts.no_steps_reason))
    if facts.steps_from:
        rows.append(("steps from", facts.steps_from))
    if facts.steps:
        rows.append(("steps", f"{facts.steps}, step time median {fmt_s(h.get('step_time_median_s'))}, "
                              f"p95 {fmt_s(h.get('step_time_p95_s'))}"))
    if facts.progress is not None:
        rows.append(("progress", f"{100 * facts.progress.fraction:.0f} %, " + progress_text(facts.progress)))
    if h.get("duration_s") is not None:
        rows.append(("duration", fmt_s(h["duration_s"])))
    rates = [f"{fmt_rate(h[k])} {k.removesuffix('_per_s')}/s" for k in ("tokens_per_s", "samples_per_s")
             if h.get(k) is not None]
    if rates:
        rows.append(("throughput", ", ".join(rates)))
    if h.get("mfu") is not None:
        rows.append(("MFU", fmt_mfu(h["mfu"])))
    if facts.phases:
        rows.append(("phases", ", ".join(facts.phases)))
    peaks = [f"{k} {human_bytes(v)}" for k, v in facts.peak_bytes.items() if k != "measured" and v is not None]
    if peaks:
        rows.append(("peak memory", ", ".join(peaks)))
    if facts.trainable_params_bytes is not None and facts.peak_bytes.get("params") is not None:
        kinds = ", ".join(f"{k} {human_bytes(v)}" for k, v in facts.params_dtypes.items()) \
            if len(facts.params_dtypes) > 1 or any("(" in k for k in facts.params_dtypes) else ""
        rows.append(("parameters", f"{human_bytes(facts.peak_bytes['params'])}: trainable "
                                   f"{human_bytes(facts.trainable_params_bytes)}, frozen "
                                   f"{human_bytes(facts.frozen_params_bytes or 0.0)}" + (f" ({kinds})" if kinds else "")))
    if facts.peak_bytes.get("measured") is not None:
        measured, cap = distinct_bytes(facts.peak_bytes["measured"], facts.capacity_bytes)
        rows.append(("measured peak", measured + (f" of {cap}" if facts.capacity_bytes else "")))
    if facts.estimator_error is not None:
        rows.append(("estimator", f"predicted peak {round(100 * facts.estimator_error, 1) + 0.0:+.1f} % against the measured "
                                  "peak (median over steps)"))
    rows.append(("loss spikes", f"{len(facts.loss_spike_steps)}" +
                 (f" (steps {_steps_text(facts.loss_spike_steps)})" if facts.loss_spike_steps else "")))
    rows.append(("non-finite", f"{len(facts.nonfinite_steps)} step(s)" +
                 (f" (steps {_steps_text(facts.nonfinite_steps)})" if facts.nonfinite_steps else "")))
    rows.append(("OOMs", str(facts.oom_count)))
    if facts.leak is not None:
        rows.append(("leak", leak_text(facts.leak)))
    if facts.host_memory is not None and (text := host_memory_text(facts.host_memory)):
        rows.append(("host memory", text))
    if facts.energy is not None:
        rows.append(("energy", energy_text(facts.energy)))
    elif meta.get("unavailable_cpu_energy") and facts.steps:  # a CPU run without RAPL: said, not left out
        rows.append(("energy", f"not measured ({str(meta['unavailable_cpu_energy'])[:200]})"))
    if facts.dropped_records or facts.dropped_values:
        rows.append(("not recorded", f"{facts.dropped_records:,} record(s) dropped (the writer's buffer was full), "
                                     f"{facts.dropped_values:,} value(s) that could not be stored"))
    if facts.fragmentation_pct is not None:
        rows.append(("fragmentation", f"up to {facts.fragmentation_pct:.0f} % of reserved memory in split blocks"))
    return rows
