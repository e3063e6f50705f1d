"""Training stability: loss spikes, non-finite steps, loss-scale collapses,
precision fallbacks and batch-size oscillation, each with its step range.

Signals come from the step columns (``loss``, ``loss_scale``, ``batch_size``
or ``micro_batch``, ``nonfinite``/``skipped``) and from events the trainer
records (``loss_spike``, ``nonfinite``/``nan``, ``precision_fallback``,
``batch_size``). NaN is stored as SQL NULL, so a missing loss between logged
losses counts as non-finite when the run logs its loss on most steps.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from gpudash.analysis.attempts import attempt_bounds
from gpudash.analysis.ranks import lowest_rank
from gpudash.analysis.verdict import Verdict
from gpudash.store.run import Run

__all__ = ["SPIKE_MIN_HISTORY", "SPIKE_RATIO", "SPIKE_WINDOW", "SPIKE_Z", "batch_oscillation", "loss_scale_collapses",
           "loss_series", "loss_spikes", "nonfinite_steps", "precision_fallbacks", "ranges", "settled_batch",
           "spike_mask", "spike_scores", "stability_verdicts", "trailing_spike"]

SPIKE_WINDOW = 50
"""Losses before a step that form its baseline (the trailing window)."""
SPIKE_MIN_HISTORY = 10
"""Finite losses the trailing window must hold before a spike can be called."""
SPIKE_Z = 6.0
"""Robust z-score (median / MAD of the trailing window) above which a loss is a spike..."""
SPIKE_RATIO = 1.2
"""... and the loss must also be this many times the trailing median (20 % above it)."""
_CHUNK = 65_536


def _medians(rows_values: np.ndarray) -> np.ndarray:
    """Median of each row, NaN left out (every row holds a finite value): ``nanmedian``'s numbers, with
    numpy's plain median on the rows without a NaN (most of them, and many times faster)."""
    holes = np.isnan(rows_values).any(axis=1)
    out = np.empty(len(rows_values))
    out[~holes] = np.median(rows_values[~holes], axis=1)
    if holes.any():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out[holes] = np.nanmedian(rows_values[holes], axis=1)
    return out


def _below_counts(padded: np.ndarray, bound: np.ndarray, window: int) -> np.ndarray:
    """How many of the ``window`` values before each one lie below its ``bound`` (NaN never does):
    one pass over the run per window position, on contiguous arrays."""
    n = len(bound)
    out = np.zeros(n, dtype=np.int32)
    for j in range(window):
        out += padded[j:j + n] < bound
    return out


def _spikes(values: Sequence[float] | np.ndarray, window: int, all_scores: bool) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(values, dtype=float)
    n = len(x)
    mask = np.zeros(n, dtype=bool)
    z = np.full(n, np.nan)
    if n <= SPIKE_MIN_HISTORY or window < SPIKE_MIN_HISTORY:  # no window can hold enough history
        return mask, z
    hist = np.where(np.isfinite(x), x, np.nan)
    padded = np.concatenate([np.full(window, np.nan), hist[:-1]])
    windows = np.lib.stride_tricks.sliding_window_view(padded, window)  # row i: the values before i
    finite = np.concatenate([[0], np.cumsum(~np.isnan(padded))])
    count = finite[window:window + n] - finite[:n]
    ok = count >= SPIKE_MIN_HISTORY
    if all_scores or not 1.0 <= SPIKE_RATIO < 2.0:
        rows = np.flatnonzero(ok)
    else:
        # A spike lies above SPIKE_RATIO x its median, i.e. its median lies below x / SPIKE_RATIO (x / (2 -
        # SPIKE_RATIO) for a negative x), so at least half of its window does (a bound loosened past any
        # rounding): only the values passing that count are scored. A long run costs one comparison per value.
        with np.errstate(invalid="ignore"):
            bound = np.where(hist >= 0, hist / SPIKE_RATIO, hist / (2.0 - SPIKE_RATIO))
            bound = bound + 1e-6 * np.abs(bound) + 1e-300
            rows = np.flatnonzero(ok & ~np.isnan(hist) & (_below_counts(padded, bound, window) >= (count + 1) // 2))
    if not len(rows):
        return mask, z
    med, mad = np.empty(len(rows)), np.empty(len(rows))
    for a in range(0, len(rows), _CHUNK):
        w = windows[rows[a:a + _CHUNK]]
        med[a:a + len(w)] = m = _medians(w)
        mad[a:a + len(w)] = _medians(np.abs(w - m[:, None]))
    scale = np.maximum(np.maximum(1.4826 * mad, 1e-3 * np.abs(med)), 1e-12)
    xs = hist[rows]
    zz = (xs - med) / scale
    z[rows] = zz
    with np.errstate(invalid="ignore"):
        mask[rows] = (zz > SPIKE_Z) & (xs - med > (SPIKE_RATIO - 1.0) * np.abs(med))
    return mask, z


def spike_scores(values: Sequence[float] | np.ndarray, window: int = SPIKE_WINDOW) -> tuple[np.ndarray, np.ndarray]:
    """(spike mask, robust z-score) of each value against the ``window`` values before it.

    The one loss-spike rule of gpudash (chart markers, the stability light, the
    summary, the trainer's live ``loss_spike`` events all call it): value ``i``
    is a spike when, over the previous ``window`` values (non-finite ones left
    out, at least ``SPIKE_MIN_HISTORY`` finite), ``(x - median) / (1.4826 MAD)``
    exceeds ``SPIKE_Z`` *and* ``x`` is more than ``SPIKE_RATIO`` times the
    median. The MAD is floored at 0.1 % of the median so that a perfectly flat
    loss still has a scale. A non-finite value is never a spike (it is a
    non-finite step). Each value depends only on the values before it, so the
    result on the trailing ``window + 1`` values is the live verdict.
    """
    return _spikes(values, window, all_scores=True)


def spike_mask(values: Sequence[float] | np.ndarray, window: int = SPIKE_WINDOW) -> np.ndarray:
    """True where a value is a loss spike (:func:`spike_scores`); scores only the values that can be one."""
    return _spikes(values, window, all_scores=False)[0]


def trailing_spike(recent: Sequence[float]) -> float | None:
    """The live check: the z-score of the newest of ``recent`` (the last ``SPIKE_WINDOW + 1`` losses, NaN
    for a non-finite one) when it is a spike, else None. Same answer as :func:`spike_mask` on the whole run."""
    mask, z = spike_scores(list(recent)[-(SPIKE_WINDOW + 1):])
    return float(z[-1]) if len(mask) and mask[-1] else None


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
    if "step" not in steps:  # no steps recorded (a run that died at once)
        return pd.DataFrame({"step": pd.Series(dtype="int64")})
    steps = lowest_rank(steps)
    step = steps["step"]
    if pd.api.types.is_numeric_dtype(step) and bool((np.diff(step.to_numpy()) > 0).all()):
        return steps.reset_index(drop=True)  # already in step order (as the writer stores one rank's steps)
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


def nan_loss_rows(loss: np.ndarray) -> np.ndarray:
    """Which rows of a step-ordered loss column (NaN where the row has none: SQLite stores a NaN as NULL)
    held a NaN, judged from every step's loss: a missing loss after the first logged one is a NaN when the
    loss was logged on most steps while it was finite (a run NaN from step k on has every row from k on
    missing, however many that is); when it was logged every N steps, a missing run longer than any gap
    seen before is (the loss stopped being finite), the ordinary gaps are not."""
    present = ~np.isnan(loss)
    idx = np.flatnonzero(present)
    out = np.zeros(len(loss), dtype=bool)
    if not len(idx):
        return out
    first, last = int(idx[0]), int(idx[-1])
    after = np.arange(len(loss)) > first
    if len(idx) / (last - first + 1) >= 0.5:  # logged on most steps while finite: every gap is a NaN
        return ~present & after
    gap = int(np.diff(idx).max()) if len(idx) > 1 else 1
    tail = np.arange(len(loss)) > last + gap  # sparse logging, and then nothing for longer than ever before
    return ~present & tail


def nonfinite_steps(run: Run) -> list[int]:
    s = _one_rank(run.steps)
    out: set[int] = set()
    if "loss" in s and len(s):
        loss = pd.to_numeric(s["loss"], errors="coerce").astype(float)
        out.update(s.loc[np.isinf(loss), "step"].astype(int))
        out.update(s.loc[nan_loss_rows(loss.to_numpy()), "step"].astype(int))
    for col in ("nonfinite", "non_finite", "skipped", "skipped_step", "found_inf"):
        if col in s:
            out.update(s.loc[s[col].fillna(0).astype(float) > 0, "step"].astype(int))
    if "skipped_steps" in s:  # a running total: each rise is a skipped step
        total = pd.to_numeric(s["skipped_steps"], errors="coerce").ffill().fillna(0.0)
        out.update(s.loc[total.diff().fillna(total).to_numpy() > 0, "step"].astype(int))
    ev = _events(run, "nonfinite", "non_finite", "nan")
    if len(ev):
        out.update(int(x) for x in ev["step"].dropna())
    return sorted(out)


def loss_series(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """(steps, loss) of the lowest rank, in step order (NaN where no finite loss was logged)."""
    s = _one_rank(run.steps)
    if "loss" not in s or not len(s):
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    loss = pd.to_numeric(s["loss"], errors="coerce").to_numpy(dtype=float)
    return s["step"].to_numpy(dtype=np.int64), loss


def loss_spikes(run: Run) -> list[int]:
    """Steps whose logged loss is a spike by :func:`spike_scores` (the loss column is the record; the
    trainer's live ``loss_spike`` events come from the same rule on the trailing window, which never holds
    two attempts of a resumed run either)."""
    steps, loss = loss_series(run)
    # each attempt of a resumed run on its own: the step it resumed at is compared with its own steps only
    cuts = [0, *attempt_bounds(_one_rank(run.steps)).tolist(), len(loss)]
    mask = np.concatenate([spike_mask(loss[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)]) \
        if len(loss) else np.zeros(0, dtype=bool)
    return sorted(int(s) for s in steps[mask])


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
              f"{SPIKE_RATIO:g}× the median of the previous {SPIKE_WINDOW} steps)"]
        steps, loss = loss_series(run)
        i = int(np.searchsorted(steps, spikes[0]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            before = float(np.nanmedian(loss[max(0, i - SPIKE_WINDOW):i])) if i else float("nan")
        if np.isfinite(before):
            ev.append(f"step {spikes[0]}: loss {loss[i]:.3g} against a recent median of {before:.3g}")
        out.append(Verdict(kind="loss-spike", title=f"{len(spikes)} loss spike(s)", severity="warn", evidence=ev,
                           steps=(spikes[0], spikes[-1]), numbers={"count": float(len(spikes))}))
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
