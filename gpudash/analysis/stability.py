"""Training stability: loss spikes, non-finite steps, loss-scale collapses,
precision fallbacks and batch-size oscillation, each with its step range.

Signals come from the step columns (``loss``, ``loss_scale``, ``batch_size``
or ``micro_batch``, ``nonfinite``/``skipped``) and from events the trainer
records (``loss_spike``, ``nonfinite``/``nan``, ``precision_fallback``,
``batch_size``). NaN is stored as SQL NULL, so a missing loss between logged
losses counts as non-finite when the run logs its loss on most steps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpudash.analysis.verdict import Verdict
from gpudash.store.run import Run

__all__ = ["batch_oscillation", "loss_scale_collapses", "loss_spikes", "nonfinite_steps", "precision_fallbacks",
           "ranges", "settled_batch", "stability_verdicts"]

SPIKE_Z = 6.0
"""Robust z-score (median/MAD over the previous window) above which a loss is a spike."""
SPIKE_RATIO = 1.5
"""... and the loss must also be this many times the recent median."""


def ranges(steps: list[int], gap: int = 1) -> list[tuple[int, int]]:
    """Sorted steps grouped into inclusive ranges (steps closer than ``gap`` join)."""
    out: list[tuple[int, int]] = []
    for s in sorted(set(steps)):
        if out and s - out[-1][1] <= gap:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _fmt_ranges(rs: list[tuple[int, int]], limit: int = 6) -> str:
    parts = [f"{a}" if a == b else f"{a}–{b}" for a, b in rs[:limit]]
    more = f" and {len(rs) - limit} more" if len(rs) > limit else ""
    return ", ".join(parts) + more


def _one_rank(steps: pd.DataFrame) -> pd.DataFrame:
    if "rank" in steps and steps["rank"].nunique() > 1:
        steps = steps[steps["rank"] == steps["rank"].min()]
    return steps.sort_values("step").reset_index(drop=True)


def _events(run: Run, *kinds: str) -> pd.DataFrame:
    ev = run.events
    if ev.empty:
        return ev
    k = ev["kind"].astype(str).str.lower()
    mask = pd.Series(False, index=ev.index)
    for kind in kinds:
        mask |= k.str.contains(kind, regex=False)
    return ev[mask]


def nonfinite_steps(run: Run) -> list[int]:
    s = _one_rank(run.steps)
    out: set[int] = set()
    if "loss" in s and len(s):
        loss = s["loss"].astype(float)
        out.update(s.loc[np.isinf(loss), "step"].astype(int))
        if loss.notna().mean() >= 0.5:
            # the loss is logged on most steps: a NULL after the first logged one was a NaN
            after_first = loss.notna().cumsum().to_numpy() > 0
            inside = after_first
            out.update(s.loc[loss.isna().to_numpy() & inside, "step"].astype(int))
    for col in ("nonfinite", "non_finite", "skipped", "skipped_step"):
        if col in s:
            out.update(s.loc[s[col].fillna(0).astype(float) > 0, "step"].astype(int))
    ev = _events(run, "nonfinite", "non_finite", "nan")
    if len(ev):
        out.update(int(x) for x in ev["step"].dropna())
    return sorted(out)


def loss_spikes(run: Run, window: int = 20) -> list[int]:
    s = _one_rank(run.steps)
    out: set[int] = set()
    if "loss" in s and len(s) > window // 2:
        loss = s["loss"].astype(float).where(lambda x: np.isfinite(x))
        prev = loss.shift(1).rolling(window, min_periods=max(5, window // 4))
        med = prev.median()
        mad = (loss.shift(1) - med).abs().rolling(window, min_periods=max(5, window // 4)).median()
        scale = (1.4826 * mad).clip(lower=1e-3 * med.abs().clip(lower=1e-6))
        z = (loss - med) / scale
        hit = (z > SPIKE_Z) & (loss > SPIKE_RATIO * med)
        out.update(s.loc[hit.fillna(False).to_numpy(), "step"].astype(int))
    ev = _events(run, "loss_spike", "spike")
    if len(ev):
        out.update(int(x) for x in ev["step"].dropna())
    return sorted(out)


def loss_scale_collapses(run: Run, factor: float = 16.0, floor: float = 1.0) -> list[tuple[int, int, float, float]]:
    """(first step, last step, scale before, lowest scale) where the fp16 loss scale fell by ``factor`` or below ``floor``."""
    s = _one_rank(run.steps)
    col = next((c for c in ("loss_scale", "grad_scale", "scale") if c in s), None)
    if col is None:
        return []
    sc = s[col].astype(float)
    peak = sc.cummax()
    bad = ((sc <= peak / factor) | (sc < floor)) & sc.notna()
    out: list[tuple[int, int, float, float]] = []
    for a, b in ranges(s.loc[bad.to_numpy(), "step"].astype(int).tolist(), gap=1):
        seg = s[(s["step"] >= a) & (s["step"] <= b)]
        before = s[s["step"] < a][col].astype(float)
        out.append((a, b, float(before.max()) if before.notna().any() else float("nan"), float(seg[col].min())))
    return out


def precision_fallbacks(run: Run) -> list[tuple[int, str]]:
    ev = _events(run, "fallback")
    return [(int(e["step"]) if not pd.isna(e["step"]) else -1, str(e["message"])) for _, e in ev.iterrows()]


def _batch_series(run: Run) -> list[tuple[int, float]]:
    """(step, batch size) at every change: from batch-size events (a shrink and
    re-grow inside one step never shows in the step rows) or else the step column."""
    out: list[tuple[int, float]] = []
    ev = _events(run, "batch_size", "batch-size")
    for _, e in ev.iterrows():
        d = e["data"] if isinstance(e.get("data"), dict) else {}
        old, new = d.get("old"), d.get("new")
        if isinstance(new, (int, float)) and not pd.isna(e["step"]):
            if isinstance(old, (int, float)) and (not out or out[-1][1] != old):
                out.append((int(e["step"]), float(old)))
            out.append((int(e["step"]), float(new)))
    if out:
        return out
    s = _one_rank(run.steps)
    col = next((c for c in ("micro_batch", "micro_batch_size", "batch_size") if c in s), None)
    if col is None:
        return []
    bs = s[["step", col]].dropna()
    keep = bs[col].diff().fillna(1) != 0
    return [(int(a), float(b)) for a, b in zip(bs.loc[keep, "step"], bs.loc[keep, col], strict=True)]


def batch_oscillation(run: Run, min_reversals: int = 3) -> tuple[list[tuple[int, int]], list[int]]:
    """Step ranges where the batch size went up and down ``min_reversals`` times or more, and the sizes seen."""
    series = _batch_series(run)
    sizes = sorted({int(b) for _, b in series})
    if len(series) < min_reversals + 2:
        return [], sizes
    sizes_seq = [b for _, b in series]
    signs = np.sign(np.diff(sizes_seq))
    flips = [i for i in range(1, len(signs)) if signs[i] != 0 and signs[i] != signs[i - 1]]
    if len(flips) < min_reversals:
        return [], sizes
    return [(series[flips[0]][0], series[-1][0])], sizes


def settled_batch(run: Run) -> int | None:
    """The largest batch size the run fell back to after a shrink (what held), if any."""
    series = _batch_series(run)
    after_shrink = [b for (_, a), (_, b) in zip(series, series[1:], strict=False) if b < a]
    return int(min(after_shrink)) if after_shrink else None


def stability_verdicts(run: Run) -> list[Verdict]:
    out: list[Verdict] = []
    nf = nonfinite_steps(run)
    if nf:
        rs = ranges(nf)
        total = len(run.steps["step"].unique()) if len(run.steps) else 0
        out.append(Verdict(kind="non-finite", title=f"{len(nf)} non-finite step(s) (NaN/Inf loss or gradients)",
                           severity="bad" if len(nf) > max(3, 0.05 * total) else "warn",
                           evidence=[f"non-finite at steps {_fmt_ranges(rs)}"], steps=(nf[0], nf[-1]),
                           numbers={"count": float(len(nf)), "steps_total": float(total)}))
    spikes = [s for s in loss_spikes(run) if s not in set(nf)]
    if spikes:
        rs = ranges(spikes, gap=2)
        ev = [f"loss spiked at steps {_fmt_ranges(rs)} (more than {SPIKE_Z:g} robust σ and "
              f"{SPIKE_RATIO:g}× the median of the previous 20 steps)"]
        s = _one_rank(run.steps)
        if "loss" in s:
            first = s[s["step"] == spikes[0]]["loss"]
            before = s[(s["step"] < spikes[0]) & (s["step"] >= spikes[0] - 20)]["loss"].median()
            if len(first) and pd.notna(before):
                ev.append(f"step {spikes[0]}: loss {float(first.iloc[0]):.3g} against a recent median of {float(before):.3g}")
        out.append(Verdict(kind="loss-spike", title=f"{len(rs)} loss spike(s)", severity="warn", evidence=ev,
                           steps=(spikes[0], spikes[-1]), numbers={"count": float(len(rs))}))
    for a, b, before, low in loss_scale_collapses(run):
        out.append(Verdict(kind="loss-scale-collapse", title=f"fp16 loss scale collapsed (steps {a}–{b})",
                           severity="bad" if low < 1.0 else "warn",
                           evidence=[f"loss scale fell from {before:g} to {low:g} between steps {a} and {b}"],
                           steps=(a, b), numbers={"scale_before": before, "scale_low": low}))
    fb = precision_fallbacks(run)
    if fb:
        step, msg = fb[0]
        out.append(Verdict(kind="precision-fallback", title=f"Precision fallback at step {step}", severity="warn",
                           evidence=[f"step {st}: {m}" for st, m in fb[:5]], steps=(fb[0][0], fb[-1][0]),
                           numbers={"count": float(len(fb))}))
    osc, sizes = batch_oscillation(run)
    if osc:
        a, b = osc[0]
        out.append(Verdict(kind="batch-oscillation", title="Batch size oscillates", severity="warn",
                           evidence=[f"micro-batch moved up and down between steps {a} and {b}, sizes seen: "
                                     + ", ".join(map(str, sizes)),
                                     "each re-grow ran into the limit again: the headroom target is above "
                                     "what the largest batches need"],
                           steps=(a, b), numbers={"min_batch": float(min(sizes)), "max_batch": float(max(sizes)),
                                                  "settled_batch": float(settled_batch(run) or min(sizes))}))
    return out
