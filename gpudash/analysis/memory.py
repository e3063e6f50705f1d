"""Memory verdicts that need no OOM: headroom against capacity, the trainer's
estimate against the measured peak, allocator fragmentation (cudaMalloc
retries, inactive split blocks) and device memory held by other processes.

Columns (all optional): ``peak_bytes`` (the step's measured peak: the CUDA
allocator's, or the trainer's CPU budget meter; runs recorded before it existed
have ``allocated_peak_bytes``/``step_peak_bytes``/``budget_peak_bytes``),
``predicted_peak_bytes`` (the estimator's prediction of that same quantity), ``device_total_bytes``,
``reserved_bytes``, ``inactive_split_bytes``, ``alloc_retries`` (cumulative),
``non_pytorch_bytes`` — the GPU collectors' and the trainer's names.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudash.analysis.capacity import capacity_bytes
from gpudash.analysis.lights import FRAG_WARN_PCT, fragmentation_pct
from gpudash.analysis.ranks import lowest_rank
from gpudash.analysis.verdict import Severity, Verdict, fmt_pct, num
from gpudash.store.run import Run
from gpudash.units import distinct_bytes, human_bytes

__all__ = ["capacity_bytes", "measured_peak", "memory_verdicts"]

#: The measured per-step peak: the ``peak_bytes`` column when recorded, else the allocator's per-step peaks.
MEASURED_PEAK_COLUMNS = ("peak_bytes", "allocated_peak_bytes", "step_peak_bytes", "budget_peak_bytes")
_PEAK_COLUMNS = (*MEASURED_PEAK_COLUMNS, "allocated_bytes")
_CONTEXT_ALLOWANCE = 768 * 2**20
ESTIMATE_WARN = 0.25
"""An estimate off by more than this is worth a warning (the estimator's goal is ±10 %)."""


def measured_peak(run: Run, steps: set[int] | None = None) -> tuple[float, str, int] | None:
    """(peak bytes, column, step) from the best peak column recorded (only ``steps`` when given)."""
    mem = lowest_rank(run.memory)
    if steps is not None:
        mem = mem[mem["step"].isin(steps)]
    for col in _PEAK_COLUMNS:
        if col in mem and mem[col].notna().any():
            values = mem[col].astype(float).to_numpy()
            i = int(np.nanargmax(values))
            return float(values[i]), col, int(mem["step"].to_numpy()[i])
    return None


def _steps_at_micro_batch(run: Run, micro: object) -> set[int] | None:
    """Steps that ran at the estimator's micro-batch (an adaptive run changes it)."""
    if not isinstance(micro, int):
        return None
    s = run.steps
    col = next((c for c in ("micro_batch", "batch_size") if c in s), None)
    if col is None:
        return None
    return set(s.loc[s[col] == micro, "step"].astype(int)) or None


def estimator_errors(mem: pd.DataFrame) -> tuple[str, pd.Series] | None:
    """``predicted_peak_bytes / measured peak - 1`` per step, and the measured column's name.
    One rank (the lowest), steps after the first (step 0 has no optimizer state yet: not steady state)."""
    mem = lowest_rank(mem)
    col = next((c for c in MEASURED_PEAK_COLUMNS if c in mem and pd.to_numeric(mem[c], errors="coerce").notna().any()),
               None)
    if col is None or "predicted_peak_bytes" not in mem:
        return None
    both = mem[["step", "predicted_peak_bytes", col]].apply(pd.to_numeric, errors="coerce").dropna()
    both = both[(both[col] > 0) & (both["step"] > 0)]
    if both.empty:
        return None
    return col, both["predicted_peak_bytes"].astype(float) / both[col].astype(float) - 1


def _per_step_estimate(run: Run) -> Verdict | None:
    """The trainer's per-step prediction (``predicted_peak_bytes``) against the measured peak of each step."""
    found = estimator_errors(run.memory)
    if found is None:
        return None
    col, err = found
    med, worst = float(err.median()), float(err.abs().max())
    within = float((err.abs() <= 0.1).mean())
    return Verdict(kind="estimate-check",
                   title=f"Estimator {'within' if abs(med) <= 0.1 else 'off by'} {abs(med) * 100:.0f} % "
                         "of the measured peak (median over steps)",
                   severity="ok" if abs(med) <= ESTIMATE_WARN else "warn",
                   evidence=[f"predicted vs measured peak ({col}) on {len(err)} steps: median error {round(med, 3) + 0.0:+.1%}, "
                             f"worst {worst:.0%}, {within:.0%} of steps within ±10 %"],
                   numbers={"error": med, "worst_error": worst, "share_within_10pct": within})


def memory_verdicts(run: Run) -> list[Verdict]:
    out: list[Verdict] = []
    peak = measured_peak(run)
    cap = capacity_bytes(run)
    has_oom = bool(len(run.events)) and bool((run.events["kind"].astype(str) == "oom").any())
    if peak is not None and cap and not has_oom:  # with an OOM, the OOM verdict tells the story
        p, col, step = peak
        share = p / cap
        sev: Severity = "warn" if share > 0.95 else "ok"
        peak_s, cap_s = distinct_bytes(p, cap, min_digits=2)
        ev = [f"peak {peak_s} ({col}) at step {step} of {cap_s} capacity: {fmt_pct(share)}"]
        rec = None
        if share < 0.5 and not has_oom:
            rec = (f"{fmt_pct(1 - share)} of the memory was never used: a larger micro-batch (fewer accumulation "
                   "steps) or less checkpointing would trade it for speed")
        elif sev == "warn":
            rec = "little headroom: a longer batch or a fragmentation spike will OOM; keep ~10 % free"
        out.append(Verdict(kind="memory-headroom", title=f"Peak memory {fmt_pct(share)} of capacity",
                           severity=sev, evidence=ev, recommendation=rec, steps=(step, step),
                           numbers={"peak_bytes": p, "capacity_bytes": cap, "peak_share": share}))
    per_step = _per_step_estimate(run)
    if per_step is not None:
        out.append(per_step)
    est = run.meta.get("estimate")
    at = None if per_step is not None else _steps_at_micro_batch(run, est.get("micro_batch")) if isinstance(est, dict) else None
    est_peak = measured_peak(run, at) if at else None
    if est_peak is not None and isinstance(est, dict) and num(est.get("peak_bytes")) and est_peak[1] != "allocated_bytes":
        predicted = float(est["peak_bytes"])
        err = predicted / est_peak[0] - 1
        out.append(Verdict(kind="estimate-check", title=f"Estimator {'within' if abs(err) <= 0.1 else 'off by'} "
                           f"{abs(err) * 100:.0f} % of the measured peak",
                           severity="ok" if abs(err) <= ESTIMATE_WARN else "warn",
                           evidence=[f"predicted peak {human_bytes(predicted)} (micro-batch {est.get('micro_batch')}, "
                                     f"ckpt {est.get('ckpt')}, {est.get('precision')}) vs measured "
                                     f"{human_bytes(est_peak[0])} ({est_peak[1]}) over {len(at or ())} steps at that "
                                     "micro-batch"],
                           numbers={"predicted_bytes": predicted, "measured_bytes": est_peak[0], "error": err}))
    mem = lowest_rank(run.memory)
    retries = mem["alloc_retries"].astype(float) if "alloc_retries" in mem else None
    split = mem["inactive_split_bytes"].astype(float) if "inactive_split_bytes" in mem else None
    ev = []
    first = None
    if retries is not None and retries.notna().any() and float(retries.max()) > 0:
        first = int(mem.loc[retries > 0, "step"].iloc[0])
        ev.append(f"{int(retries.max())} cudaMalloc retries (the allocator freed its cache and tried again), "
                  f"first at step {first}")
    frag = fragmentation_pct(run.memory)  # the same number as the run's facts and its light
    if frag is not None and frag >= FRAG_WARN_PCT:  # the amber fragmentation light's threshold
        ev.append(f"up to {frag:.0f} % of reserved memory sat in inactive split blocks"
                  + (f" ({human_bytes(float(split.max()))})" if split is not None and split.notna().any() else ""))
    if ev and not has_oom:
        out.append(Verdict(kind="fragmentation", title="Allocator fragmentation", severity="warn", evidence=ev,
                           recommendation="set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so freed blocks "
                                          "can be reused for larger requests (retries stall the step)",
                           steps=(first, first) if first is not None else None,
                           numbers={"split_bytes": float(split.max()) if split is not None else 0.0}))
    if "non_pytorch_bytes" in mem and mem["non_pytorch_bytes"].notna().any():
        other = float(mem["non_pytorch_bytes"].max())
        total = cap or other
        if other > _CONTEXT_ALLOWANCE + 0.05 * total:
            out.append(Verdict(kind="other-processes", title="Device memory held outside this process's allocator",
                               severity="warn",
                               evidence=[f"up to {human_bytes(other)} of the device was used by something other than "
                                         "this process's PyTorch allocator (other processes, NCCL, CUDA context)"],
                               recommendation="check nvidia-smi for other processes on this GPU; give the job a "
                                              "GPU of its own",
                               numbers={"outside_bytes": other}))
    return out
