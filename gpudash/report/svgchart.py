"""Line and stacked-area charts as inline SVG for the offline report.

Axes get "nice" ticks (steps of 1, 2 or 5 x 10^k, 3 to 8 of them, covering the
data), labels that never print two ticks alike, a unit chosen once per axis
(KiB/MiB/GiB for bytes, µs/ms/s for durations) and a title on both axes.
No JavaScript: the page must open offline and without a CDN.

The geometry (ticks, points, positions) is computed here; the markup is
``templates/chart.svg.j2``, rendered with autoescaping on (labels come from the run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from markupsafe import Markup
from numpy.typing import ArrayLike

from gpudash.report.templating import html_env
from gpudash.units import byte_unit

__all__ = ["AxisScale", "axis_scale", "nice_ticks", "svg_chart", "tick_labels"]

_NICE = (1.0, 2.0, 5.0)
MIN_TICKS, MAX_TICKS = 3, 8


def _nice_steps(span: float, integer: bool) -> list[float]:
    """Candidate steps of 1/2/5 x 10^k around ``span / 5``, smallest first."""
    k = math.floor(math.log10(span / 5))
    out = [m * 10.0**e for e in range(k - 1, k + 2) for m in _NICE]
    return [1.0, *(s for s in out if s > 1)] if integer else out  # whole steps: at least 1


def nice_ticks(lo: float, hi: float, *, integer: bool = False, target: int = 5) -> list[float]:
    """Evenly spaced ticks at multiples of a 1/2/5 x 10^k step that cover ``[lo, hi]``:
    the first tick <= lo, the last >= hi, between 3 and 8 of them (near ``target``, with
    little axis beyond the data).
    ``integer``: whole-number steps only (step numbers, byte counts)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError("nice_ticks needs finite bounds")
    lo, hi = min(lo, hi), max(lo, hi)
    if hi - lo < max(abs(lo), abs(hi), 1e-300) * 1e-9:  # one value: a range around it
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
        if integer:
            lo, hi = math.floor(lo), math.ceil(hi)
    best: tuple[float, list[float]] | None = None
    for step in _nice_steps(hi - lo, integer):
        first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
        n = last - first + 1
        if n > MAX_TICKS:
            continue
        while n < MIN_TICKS:  # integer steps over a short range: widen upwards
            last, n = last + 1, n + 1
        ticks = [_tick(i, step) for i in range(first, last + 1)]
        # near the wanted count, and little axis beyond the data (2..3 on 1.8..3.2, not 1.5..3.5)
        score = abs(n - target) + 20 * (1 - (hi - lo) / (ticks[-1] - ticks[0]))
        if best is None or score < best[0]:
            best = (score, ticks)
    assert best is not None, (lo, hi)  # a 1/2/5 step always lies in [span/5, span/2]: 3..8 ticks
    return best[1]


def _tick(i: int, step: float) -> float:
    """``i * step`` without the float noise of 0.1 * 3 (a step < 1 is 1/2/5 divided by a power of ten)."""
    if step >= 1:
        return float(i * step)
    div = 10.0 ** math.ceil(-math.log10(step) - 1e-12)
    return i * round(step * div) / div


def _decimals(step: float) -> int:
    return max(0, math.ceil(-math.log10(step) - 1e-12))


def tick_labels(ticks: Sequence[float]) -> list[str]:
    """Labels for evenly spaced nice ticks: as many decimals as the step needs, no more
    (``0.5, 1, 1.5`` -> ``0.5, 1.0, 1.5``); thousands as ``k``, millions as ``M`` when
    the step is that coarse, so the labels stay short and never repeat."""
    if len(ticks) < 2:
        return [f"{t:g}" for t in ticks]
    step = abs(ticks[1] - ticks[0])
    scale, suffix = 1.0, ""
    for s, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if step >= s:
            scale, suffix = s, name
            break
    d = _decimals(step / scale)
    out = []
    for t in ticks:
        v = t / scale
        v = 0.0 if abs(v) < step / scale * 1e-6 else v  # no "-0"
        out.append(f"{v:.{d}f}{suffix}")
    return out


class AxisScale:
    """How one axis prints: values are divided by ``div`` and read in ``unit``."""

    def __init__(self, div: float, unit: str, integer: bool = False) -> None:
        self.div, self.unit, self.integer = div, unit, integer


def axis_scale(kind: str, biggest: float) -> AxisScale:
    """The unit for an axis whose largest absolute value is ``biggest``: ``bytes`` in
    B/KiB/MiB/GiB/TiB (binary, as torch's OOM message), ``s`` in µs/ms/s, else plain."""
    biggest = abs(biggest) if math.isfinite(biggest) else 0.0
    if kind == "bytes":
        unit, size = byte_unit(biggest)
        return AxisScale(size, unit, integer=unit == "B")
    if kind == "s":
        if 0 < biggest < 1e-3:
            return AxisScale(1e-6, "µs")
        if 0 < biggest < 1:
            return AxisScale(1e-3, "ms")
        return AxisScale(1.0, "s")
    return AxisScale(1.0, "")


def _downsample(x: np.ndarray, ys: list[np.ndarray], max_points: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Bucket maxima down to ``max_points`` (a report shows a shape, not every step)."""
    n = len(x)
    if n <= max_points:
        return x, ys
    edges = np.linspace(0, n, max_points + 1).astype(int)
    xs = np.array([x[a:b].mean() for a, b in zip(edges[:-1], edges[1:], strict=True)])
    out = [np.array([np.nanmax(y[a:b]) if np.isfinite(y[a:b]).any() else np.nan
                     for a, b in zip(edges[:-1], edges[1:], strict=True)]) for y in ys]
    return xs, out


def _y_bounds(ys_plot: list[np.ndarray], zero: bool, hline: float | None) -> tuple[float, float]:
    finite = np.concatenate([y[np.isfinite(y)] for y in ys_plot] + [np.array([], dtype=float)])
    if not len(finite):
        return 0.0, 1.0
    lo, hi = float(finite.min()), float(finite.max())
    if hline is not None and math.isfinite(hline):
        lo, hi = min(lo, hline), max(hi, hline)
    if zero:
        return min(lo, 0.0), max(hi, 0.0)
    pad = (hi - lo) * 0.02
    # padded data range; a quantity that is never negative does not get a negative axis
    return (max(lo - pad, 0.0) if lo >= 0 else lo - pad), hi + pad


@dataclass(frozen=True)
class _Shape:
    """One series drawn: a stacked band (``polygon``) or a line (``polyline``)."""

    tag: str
    points: str
    color: str
    label: str


def svg_chart(x: ArrayLike, series: Sequence[tuple[str, ArrayLike, str]], *, stacked: bool = False,
              markers: Sequence[tuple[float, str, str]] = (), hline: tuple[float, str] | None = None,
              y_fmt: str = "num", y_title: str = "", x_title: str = "step", y_zero: bool | None = None,
              width: int = 900, height: int = 220, max_points: int = 400) -> Markup:
    """A line (or stacked area) chart as inline SVG. ``markers``: (x, color, label)
    vertical lines; ``hline``: (y, label) dashed horizontal line; ``y_fmt``:
    ``num``, ``bytes`` or ``s`` (the unit joins ``y_title``: "memory (GiB)");
    ``y_zero``: the y axis includes 0 (default: for stacked charts; a loss axis
    shows its padded data range). x values are step numbers (integer ticks)."""
    chart = html_env().get_template("chart.svg.j2")
    xa = np.asarray(x, dtype=float)
    ys = [np.asarray(v, dtype=float) for _, v, _ in series]
    if len(xa) == 0 or not ys:
        return Markup(chart.render(empty=True))
    xa, ys = _downsample(xa, ys, max_points)
    if stacked:
        acc = np.zeros(len(xa))
        ys_plot = []
        for y in ys:
            acc = acc + np.nan_to_num(y)
            ys_plot.append(acc.copy())
    else:
        ys_plot = ys
    href = hline[0] if hline is not None and math.isfinite(hline[0]) else None
    lo, hi = _y_bounds(ys_plot, stacked if y_zero is None else y_zero, href)
    scale = axis_scale(y_fmt, max(abs(lo), abs(hi)))
    y_ticks = [t * scale.div for t in nice_ticks(lo / scale.div, hi / scale.div, integer=scale.integer)]
    y_labels = tick_labels([t / scale.div for t in y_ticks])
    x_ticks = nice_ticks(float(np.nanmin(xa)), float(np.nanmax(xa)), integer=True)
    x_labels = tick_labels(x_ticks)
    y_min, y_max, x0, x1 = y_ticks[0], y_ticks[-1], x_ticks[0], x_ticks[-1]
    title = f"{y_title} ({scale.unit})" if scale.unit and y_title else (y_title or scale.unit)
    left, right, top, bottom = 78, 12, 10, 40
    pw, ph = width - left - right, height - top - bottom

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + ph - (v - y_min) / (y_max - y_min) * ph

    shapes = []
    prev = np.zeros(len(xa))
    for (label, _, color), y in zip(series, ys_plot, strict=True):
        pts = [(px(a), py(b)) for a, b in zip(xa, y, strict=True) if math.isfinite(b)]
        if not pts:
            continue
        line = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
        if stacked:
            base = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in reversed(list(zip(xa, prev, strict=True))))
            shapes.append(_Shape("polygon", f"{line} {base}", color, label))
            prev = y
        else:
            shapes.append(_Shape("polyline", line, color, label))
    return Markup(chart.render(
        empty=False, width=width, height=height, left=left, right=right, top=top, plot_bottom=top + ph,
        y_ticks=[(f"{py(v):.1f}", f"{py(v) + 4:.1f}", text) for v, text in zip(y_ticks, y_labels, strict=True)],
        x_ticks=[(f"{px(v):.1f}", text) for v, text in zip(x_ticks, x_labels, strict=True)],
        x_title=x_title, x_title_x=f"{left + pw / 2:.1f}", y_title=title, y_title_y=f"{top + ph / 2:.1f}",
        shapes=shapes,
        hline=None if href is None or hline is None else (f"{py(href):.1f}", f"{py(href) - 3:.1f}", hline[1]),
        markers=[(f"{px(mx):.1f}", color, label) for mx, color, label in markers if x0 <= mx <= x1]))
