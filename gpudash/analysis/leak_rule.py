"""The leak rule (on numbers: no pandas, so the live watch judges with it in the watched process): memory held between steps that grows step after step, its rate, since when, what grows,
and the step at which the card (or the host) runs out at that rate.

One judge, called on the trailing window while the run goes (the Monitor's leak watch records a ``leak``
event, the alerts read it) and on the whole run afterwards (``run_facts(run).leak``: the run page's header,
the report, ``gpudash info``, ``gpudash check --no-leak``).

What is "held between steps": on GPU the allocator's ``allocated_bytes`` at each step's end (not
``reserved_bytes``: the caching allocator keeps what it once needed, a plateau that is no leak); on CPU,
where there is no allocator to ask, malloc's in-use bytes read at step ends (the memory rows'
``malloc_used_bytes``, :class:`gpudash.collectors.host.HeldSampler`), so a leak is judged by steps, whenever a
timer fires; runs recorded before that fall back to the host samples (malloc's in-use bytes, else the RSS),
each placed at the step it was taken in. The rule looks at the floor of that series, not its every value: the window after warm-up is cut
into :data:`BLOCKS` blocks of equal steps and each block contributes its lowest value. An evaluation or a
checkpoint that holds more memory for a while lifts a block's top, never its floor; a leak lifts every
floor. Growth is a leak when the floors rise block after block for at least :data:`MIN_RISING` blocks
(strictly, every one), add up to at least :data:`MIN_GROWTH_BYTES` and :data:`MIN_GROWTH_SHARE` of the floor,
and do not slow down (the allocator's or malloc's warm-up grows fast and then settles); and the step's size
(``tokens``) did not grow with them (a run whose sequence length grows by bucketing needs more memory as it
goes, which is no leak). The rate is the Theil–Sen slope through the rising floors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import numpy as np

from gpudash.store.schema import MEMORY_PARTS
from gpudash.units import human_bytes

__all__ = ["BLOCKS", "LEAK_EVENT", "MIN_GROWTH_BYTES", "MIN_GROWTH_SHARE", "MIN_RISING", "RULE_COLUMNS",
           "TRAIL_STEPS", "WARMUP_STEPS", "Columns", "Growth", "Leak", "LeakFrame", "floor_growth", "judge",
           "leak_text"]

Columns = Mapping[str, "np.ndarray"]  # (a string: the dashboard builds its app before numpy loads)
"""One table's rows as numbers, column by column (rows in the order they were recorded; NaN: not recorded)."""

LEAK_EVENT = "leak"
"""The event kind the live watch records a leak under (once per episode)."""
BLOCKS = 12
"""Blocks of equal steps the judged window is cut into; each gives its floor (lowest value)."""
MIN_RISING = 4
"""Consecutive blocks (the newest included) whose floors must each rise for a leak."""
MIN_GROWTH_BYTES = 8 * 2**20
"""The rising floors must add up to at least this many bytes ..."""
MIN_GROWTH_SHARE = 0.01
"""... and to at least this share of the floor where they start."""
WARMUP_STEPS = 10
"""Steps left out at the start of a run (optimizer state made, caches filled) ..."""
WARMUP_SHARE = 0.1
"""... or this share of the steps seen so far, whichever is more."""
MIN_POINTS_PER_BLOCK = 2
"""Samples a block needs for its floor to count (fewer: the window is too short to judge)."""
_SLOWDOWN = 0.3
"""The newer half of the rising floors must grow at least this share of what the older half grew."""
_TOKENS_RISE = 1.05
"""The step's size grew with the memory when the blocks' largest step rose by this much or more ..."""
_CATEGORY_SHARE = 0.5
"""A category owns the growth when its floor grows at least this share of the rate."""
#: On CPU, what the process holds: malloc's in-use bytes where recorded (glibc), else its resident memory.
_HOST_HELD = ("malloc_used_bytes", "rss_bytes")
_SOURCE_NAMES = {"allocated_bytes": "held on the GPU", "malloc_used_bytes": "held by the process (malloc in use)",
                 "rss_bytes": "held by the process (RSS)"}
_CATEGORY_NAMES = {"params_bytes": "parameters", "grads_bytes": "gradients", "optimizer_bytes": "optimizer state",
                   "activations_bytes": "activations", "other_bytes": "other (allocated outside the categories)"}


TRAIL_STEPS = 96
"""When the whole window shows no leak, its newest this many steps are judged as well: a leak that starts late in
a long window lifts too few of the whole window's block floors to be named for hundreds of steps; in the trailing
part it lifts four within about forty steps (a leak of 1 MiB a step or more is named within 100 steps of its start
wherever it starts)."""
RULE_COLUMNS: dict[str, tuple[str, ...]] = {
    "memory": ("step", "allocated_bytes", "malloc_used_bytes", "peak_bytes", "allocated_peak_bytes",
               *MEMORY_PARTS),
    "host": ("step", "time", *_HOST_HELD, "available_bytes", "total_bytes"),
    "steps": ("step", "time", "tokens"),
}
"""Every column :func:`judge` reads, by table (what the live watch's window keeps)."""


@dataclass(frozen=True)
class Growth:
    """What :func:`floor_growth` finds in one series."""

    per_step_bytes: float
    since_step: int
    last_step: int
    start_bytes: float
    """The floor where the growth starts."""
    held_bytes: float
    """The floor of the newest block."""
    grown_bytes: float


@dataclass(frozen=True)
class Leak:
    """A leak: memory held between steps growing at ``per_step_bytes`` since ``since_step``."""

    source: str
    """``allocated_bytes`` (GPU, at step ends), ``malloc_used_bytes`` (CPU: what malloc has handed out) or
    ``rss_bytes`` (CPU without glibc: the process's resident memory)."""
    per_step_bytes: float
    since_step: int
    last_step: int
    held_bytes: float
    grown_bytes: float
    rank: int | None = None
    category: str | None = None
    """The memory category that grows (``activations``...), None when none of them does."""
    category_per_step_bytes: float | None = None
    limit_bytes: float | None = None
    """What runs out: the card's capacity, or the host memory available to the process."""
    full_at_step: int | None = None
    """The step at which, growing at this rate, the held memory (plus the step's own peak above it on GPU)
    reaches ``limit_bytes``."""
    seen: str = ""
    """What could be seen of the cause, and what could not."""
    frames: tuple[LeakFrame, ...] = field(default_factory=tuple)
    """On GPU with allocation history: the stacks whose live bytes grew between a snapshot from before the
    growth and one taken when it was found (``stack``, ``delta_bytes``), most grown first."""

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["frames"] = [f._asdict() for f in self.frames]  # stored as JSON objects
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Leak | None:
        """A leak event's data back as a Leak (None when it is not one)."""
        try:
            frames = tuple(LeakFrame.from_dict(f) for f in d.get("frames") or () if isinstance(f, dict))
            return cls(source=str(d["source"]), per_step_bytes=float(d["per_step_bytes"]),
                       since_step=int(d["since_step"]), last_step=int(d["last_step"]),
                       held_bytes=float(d["held_bytes"]), grown_bytes=float(d["grown_bytes"]),
                       rank=_opt_int(d.get("rank")), category=d.get("category") or None,
                       category_per_step_bytes=_opt_float(d.get("category_per_step_bytes")),
                       limit_bytes=_opt_float(d.get("limit_bytes")), full_at_step=_opt_int(d.get("full_at_step")),
                       seen=str(d.get("seen") or ""), frames=frames)
        except (KeyError, TypeError, ValueError):
            return None


def _opt_float(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _opt_int(v: Any) -> int | None:
    f = _opt_float(v)
    return None if f is None else int(f)


class LeakFrame(NamedTuple):
    """One stack whose live bytes grew between two snapshots (a leak's cause on GPU)."""

    stack: str
    delta_bytes: int
    before_step: int | None = None
    after_step: int | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LeakFrame:
        return cls(stack=str(d.get("stack") or ""), delta_bytes=int(_opt_float(d.get("delta_bytes")) or 0),
                   before_step=_opt_int(d.get("before_step")), after_step=_opt_int(d.get("after_step")))


# ---- the series rule ---------------------------------------------------------------------------------
def _floors(x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each block's (step of its floor, floor, block start); None when a block holds too few samples."""
    edges = np.linspace(lo, hi, BLOCKS + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, BLOCKS - 1)
    fx, fy = np.empty(BLOCKS), np.empty(BLOCKS)
    for b in range(BLOCKS):
        sel = np.flatnonzero(which == b)
        if len(sel) < MIN_POINTS_PER_BLOCK:
            return None
        i = sel[int(np.argmin(y[sel]))]
        fx[b], fy[b] = x[i], y[i]
    return fx, fy, edges[:-1]


def _theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    i, j = np.triu_indices(len(x), 1)
    dx = x[j] - x[i]
    ok = dx > 0
    return float(np.median((y[j] - y[i])[ok] / dx[ok])) if ok.any() else 0.0


def _clean(steps: Any, values: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(steps, dtype=float)
    y = np.asarray(values, dtype=float)
    ok = np.isfinite(x) & np.isfinite(y)
    order = np.argsort(x[ok], kind="stable")
    return x[ok][order], y[ok][order]


def _window(x: np.ndarray, first_step: float | None) -> tuple[float, float] | None:
    if not len(x):
        return None
    first = float(x[0]) if first_step is None else float(first_step)
    last = float(x[-1])
    lo = max(float(x[0]), first + max(WARMUP_STEPS, WARMUP_SHARE * (last - first)))
    if last - lo < 2 * BLOCKS:  # too few steps to cut into blocks of at least two
        return None
    return lo, last


def _grew_with_size(tok_steps: np.ndarray, tokens: np.ndarray, since: float, lo: float, hi: float) -> bool:
    """Did the step's size grow while the memory rose: the blocks' largest step, over the rising blocks, up by
    :data:`_TOKENS_RISE` or more? Growth a bigger step explains is no leak yet; a leak outlives the size's
    last rise and is named in a later window. (Asking that the size rise in most blocks was a coin toss for a
    bucket that changes every other block, as it did under load.)"""
    if not len(tok_steps):
        return False
    edges = np.linspace(lo, hi, BLOCKS + 1)
    tops = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        if b <= since:
            continue
        sel = (tok_steps >= a) & (tok_steps <= b)
        if sel.any():
            tops.append(float(np.max(tokens[sel])))
    if len(tops) < 2:
        return False
    return max(tops) >= _TOKENS_RISE * tops[0]


def floor_growth(steps: Any, values: Any, *, first_step: float | None = None, tokens_steps: Any = None,
                 tokens: Any = None) -> Growth | None:
    """The leak rule on one series of bytes held between steps (``values`` at ``steps``; several samples at
    one step are fine): the growth when it is a leak, else None. ``first_step``: the run's first step (the
    warm-up counts from it; a trailing window starts later). ``tokens`` at ``tokens_steps``: the step's size,
    when recorded (growth that follows it is no leak)."""
    x, y = _clean(steps, values)
    win = _window(x, first_step)
    if win is None:
        return None
    lo, hi = win
    keep = x >= lo
    floors = _floors(x[keep], y[keep], lo, hi)
    if floors is None:
        return None
    fx, fy, starts = floors
    k = BLOCKS - 1
    while k > 0 and fy[k] > fy[k - 1]:
        k -= 1
    rising = BLOCKS - k
    if rising < MIN_RISING:
        return None
    grown = float(fy[-1] - fy[k])
    if grown < max(MIN_GROWTH_BYTES, MIN_GROWTH_SHARE * max(float(fy[k]), 0.0)):
        return None
    half = k + rising // 2
    older, newer = fy[half] - fy[k], fy[-1] - fy[half]
    span_old, span_new = fx[half] - fx[k], fx[-1] - fx[half]
    if span_old <= 0 or span_new <= 0 or newer / span_new < _SLOWDOWN * older / span_old:
        return None
    if tokens is not None and tokens_steps is not None:
        tx, ty = _clean(tokens_steps, tokens)
        if _grew_with_size(tx, ty, float(starts[k]), lo, hi):
            return None
    rate = _theil_sen(fx[k:], fy[k:])
    if rate <= 0:
        return None
    return Growth(per_step_bytes=rate, since_step=int(starts[k]), last_step=int(x[-1]), start_bytes=float(fy[k]),
                  held_bytes=float(fy[-1]), grown_bytes=grown)


def _floor_rate(steps: Any, values: Any, since: float) -> float | None:
    """The Theil–Sen slope of the block floors of a series from ``since`` on (a category's share of a leak)."""
    x, y = _clean(steps, values)
    keep = x >= since
    x, y = x[keep], y[keep]
    if len(x) < 2 or x[-1] - x[0] < 1:
        return None
    n = min(BLOCKS, len(x) // MIN_POINTS_PER_BLOCK)
    if n < 2:
        return None
    edges = np.linspace(x[0], x[-1], n + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, n - 1)
    fx, fy = [], []
    for b in range(n):
        sel = np.flatnonzero(which == b)
        if len(sel):
            i = sel[int(np.argmin(y[sel]))]
            fx.append(x[i])
            fy.append(y[i])
    return _theil_sen(np.array(fx), np.array(fy)) if len(fx) >= 2 else None


# ---- one rank's rows --------------------------------------------------------------------------------------
def _col(cols: Columns, name: str) -> np.ndarray | None:
    """A column as floats; None when it is absent or holds no number at all (a source that recorded nothing)."""
    v = cols.get(name)
    if v is None:
        return None
    a = np.asarray(v, dtype=float)
    return a if len(a) and not np.isnan(a).all() else None


def _last(cols: Columns, name: str) -> float | None:
    v = _col(cols, name)
    if v is None:
        return None
    v = v[~np.isnan(v)]
    return float(v[-1]) if len(v) else None


def _step_of_time(steps: Columns, times: np.ndarray) -> np.ndarray:
    """The step each time falls in (the first step that ended at or after it); NaN after the last step."""
    st, t = _col(steps, "step"), _col(steps, "time")
    out = np.full(len(times), np.nan)
    if st is None or t is None:
        return out
    ok = ~(np.isnan(st) | np.isnan(t))
    order = np.argsort(t[ok], kind="stable")
    st, t = st[ok][order], t[ok][order]
    if not len(t):
        return out
    i = np.searchsorted(t, times, side="left")
    inside = i < len(t)
    out[inside] = st[i[inside]]
    return out


def _series(mem: Columns, host: Columns, steps: Columns) -> tuple[str, np.ndarray, np.ndarray] | None:
    at = _col(mem, "step")
    for held in ("allocated_bytes", "malloc_used_bytes"):  # read at step ends: the GPU's, else the host's
        v = _col(mem, held)
        if v is not None and at is not None and np.count_nonzero(~np.isnan(v)) >= 2:
            ok = ~np.isnan(v)
            return held, at[ok], v[ok]
    col = next((c for c in _HOST_HELD if _col(host, c) is not None), None)
    if col is None:
        return None
    held_v = _col(host, col)
    assert held_v is not None
    taken = _col(host, "step")  # the step the sample was taken in (recorded since the leak rule)
    if taken is None:
        t = _col(host, "time")
        taken = _step_of_time(steps, t) if t is not None else np.full(len(held_v), np.nan)
    return col, taken, held_v


def _growth(x: np.ndarray, y: np.ndarray, first_step: float | None, tx: np.ndarray | None,
            ty: np.ndarray | None) -> Growth | None:
    """The rule on the whole window, else on its newest :data:`TRAIL_STEPS` steps."""
    g = floor_growth(x, y, first_step=first_step, tokens_steps=tx, tokens=ty)
    if g is not None or not len(x):
        return g
    finite = x[np.isfinite(x)]
    if not len(finite):
        return None
    first = float(finite.min()) if first_step is None else first_step
    since = float(finite.max()) - TRAIL_STEPS
    if since <= first + WARMUP_STEPS:  # the trailing part is the whole window
        return None
    keep = x >= since
    return floor_growth(x[keep], y[keep], first_step=first, tokens_steps=tx, tokens=ty)


def judge(memory: Columns, host: Columns, steps: Columns, *, capacity: float | None = None,
          rank: int | None = None, first_step: float | None = None) -> Leak | None:
    """The leak rule on one rank's rows (a trailing window live, or the whole run), each table a mapping of
    column to numbers (:data:`RULE_COLUMNS` are the ones read): its numbers, the category that grows, and when
    the memory runs out at this rate."""
    found = _series(memory, host, steps)
    if found is None:
        return None
    source, x, y = found
    tokens, tok_steps = _col(steps, "tokens"), _col(steps, "step")
    g = _growth(x, y, first_step, tok_steps if tokens is not None else None, tokens)
    if g is None:
        return None
    best: tuple[str, float] | None = None
    mem_steps = _col(memory, "step")
    for c in MEMORY_PARTS:
        v = _col(memory, c)
        if v is None or mem_steps is None or c == "other_bytes" and source != "allocated_bytes":
            continue
        r = _floor_rate(mem_steps, v, g.since_step)
        if r is not None and r >= _CATEGORY_SHARE * g.per_step_bytes and (best is None or r > best[1]):
            best = (c, r)
    limit, full = _runs_out(source, g, memory, host, capacity)
    category = best[0].removesuffix("_bytes") if best else None
    return Leak(source=source, per_step_bytes=g.per_step_bytes, since_step=g.since_step, last_step=g.last_step,
                held_bytes=g.held_bytes, grown_bytes=g.grown_bytes, rank=rank, category=category,
                category_per_step_bytes=best[1] if best else None, limit_bytes=limit, full_at_step=full,
                seen=_seen(source, category, memory))


def _seen(source: str, category: str | None, mem: Columns) -> str:
    cats = [c for c in MEMORY_PARTS if _col(mem, c) is not None]
    names = ", ".join(_CATEGORY_NAMES[c].split(" (")[0] for c in cats) or "no category"
    if category is not None:
        return f"the growth is in {_CATEGORY_NAMES.get(category + '_bytes', category)} (of {names} recorded)"
    if source == "allocated_bytes":
        return (f"none of {names} grows: tensors the script keeps between steps (a list of losses or outputs "
                "with their graphs, a cache, a metrics dict of tensors)")
    return (f"on CPU: the memory the process holds grows while {names} stay flat, so it is held outside them "
            "(tensors the script keeps between steps with their graphs, a cache, host buffers made per step); "
            "without a CUDA allocator no snapshot can name the frames that hold it")


def _runs_out(source: str, g: Growth, mem: Columns, host: Columns,
              capacity: float | None) -> tuple[float | None, int | None]:
    if source == "allocated_bytes":
        if not capacity:
            return None, None
        peak = next((p for p in (_last(mem, c) for c in ("peak_bytes", "allocated_peak_bytes")) if p is not None),
                    g.held_bytes)
        left = capacity - max(peak, g.held_bytes)
        return capacity, g.last_step + max(0, math.ceil(left / g.per_step_bytes))
    avail, total = _last(host, "available_bytes"), _last(host, "total_bytes")
    if avail is None:
        return total, None
    return total, g.last_step + max(0, math.ceil(avail / g.per_step_bytes))


def leak_text(leak: Leak) -> str:
    """One line, the same on every surface."""
    where = _SOURCE_NAMES.get(leak.source, leak.source)
    who = f" on rank {leak.rank}" if leak.rank is not None else ""
    line = (f"memory {where} grows {human_bytes(leak.per_step_bytes)} per step since step {leak.since_step}{who} "
            f"({human_bytes(leak.grown_bytes)} by step {leak.last_step})")
    if leak.category:
        line += f", in {_CATEGORY_NAMES.get(leak.category + '_bytes', leak.category)}"
    if leak.full_at_step is not None and leak.limit_bytes:
        what = "the card is full" if leak.source == "allocated_bytes" else "host memory runs out"
        line += f"; at this rate {what} at step {leak.full_at_step:,}"
    if leak.frames:
        top = leak.frames[0].stack.split("\n", 1)[0]
        line += f"; most grown: {top} (+{human_bytes(leak.frames[0].delta_bytes)})"
    return line
