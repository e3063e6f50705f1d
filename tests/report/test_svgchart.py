"""The report's SVG charts: nice ticks, distinct labels, units, axis titles, read back from the SVG."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudash.report import render_html
from gpudash.report.svgchart import nice_ticks, svg_chart, tick_labels

_SUFFIX = {"k": 1e3, "M": 1e6, "G": 1e9}


def _value(label: str) -> float:
    return float(label[:-1]) * _SUFFIX[label[-1]] if label[-1] in _SUFFIX else float(label)


@st.composite
def _ranges(draw: st.DrawFn) -> tuple[float, float]:
    lo = draw(st.floats(-1e9, 1e9, allow_nan=False, allow_infinity=False))
    span = max(abs(lo), 1.0) * 10 ** draw(st.floats(-6, 3))  # spans a float can tell apart from lo
    return lo, lo + draw(st.floats(0.1, 1.0)) * span


@settings(max_examples=300, deadline=None)
@given(_ranges(), st.booleans())
def test_nice_ticks_cover_evenly_and_print_distinctly(bounds: tuple[float, float], integer: bool) -> None:
    lo, hi = bounds
    ticks = nice_ticks(lo, hi, integer=integer)
    assert 3 <= len(ticks) <= 8
    step = ticks[1] - ticks[0]
    tol = step * 1e-6 + max(abs(lo), abs(hi)) * 1e-12
    assert ticks[0] <= lo + tol and ticks[-1] >= hi - tol  # cover the data
    assert all(abs((b - a) - step) <= tol for a, b in zip(ticks, ticks[1:], strict=False))  # evenly spaced
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-6)
    assert min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-5, step  # 1, 2 or 5 x 10^k
    if integer:
        assert step >= 1 and all(t == int(t) for t in ticks)
    labels = tick_labels(ticks)
    assert len(set(labels)) == len(labels), labels  # never two alike
    assert all(abs(_value(lab) - t) < step / 2 for lab, t in zip(labels, ticks, strict=True)), labels


def test_tick_examples() -> None:
    assert nice_ticks(0, 1.5, integer=True) == [0, 1, 2]  # fractional x never prints 0, 0, 1, 1
    assert tick_labels(nice_ticks(107_000, 200_000, integer=True))[:2] == ["100k", "120k"]
    assert tick_labels(nice_ticks(2.1, 3.9)) == ["2.0", "2.5", "3.0", "3.5", "4.0"]
    assert tick_labels(nice_ticks(0, 0.00516)) == ["0.000", "0.002", "0.004", "0.006"]


def _chart(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def _texts(root: ET.Element, cls: str) -> list[ET.Element]:
    return [t for t in root.iter("text") if t.get("class") == cls]


def _ticks(root: ET.Element, axis: str) -> tuple[list[str], list[float]]:
    els = _texts(root, f"{axis}tick")
    return [e.text or "" for e in els], [float(e.get("x" if axis == "x" else "y") or "nan") for e in els]


def _linear(labels: list[str], pos: list[float], scale: float = 1.0) -> tuple[float, float]:
    """Slope and intercept from tick value to pixel, after checking the ticks are evenly placed."""
    vals = [_value(x) * scale for x in labels]
    gaps = np.diff(pos)
    assert np.allclose(gaps, gaps[0], atol=0.11), pos
    slope = (pos[-1] - pos[0]) / (vals[-1] - vals[0])
    return slope, pos[0] - slope * vals[0]


def test_loss_chart_reads_back_from_the_svg() -> None:
    x = np.arange(0, 1000, dtype=float)
    loss = np.linspace(4.2, 2.6, len(x))
    root = _chart(svg_chart(x, [("loss", loss, "#000")], y_title="loss", max_points=2000))
    ylab, ypos = _ticks(root, "y")
    xlab, xpos = _ticks(root, "x")
    assert xlab == ["0", "200", "400", "600", "800", "1000"]
    assert _value(ylab[0]) > 0 and _value(ylab[0]) <= 2.6 and _value(ylab[-1]) >= 4.2  # not from 0
    assert len(set(ylab)) == len(ylab)
    titles = {t.get("class"): t.text for t in root.iter("text")
              if (t.get("class") or "").startswith("axis-title")}
    assert titles == {"axis-title x": "step", "axis-title y": "loss"}
    # the line's points sit where the tick labels say those values are
    sy, cy = _linear(ylab, ypos)
    sx, cx = _linear(xlab, xpos)
    line = next(root.iter("polyline")).get("points", "").split()
    for i in (0, 500, 999):
        px, py = map(float, line[i].split(","))
        assert abs(px - (sx * x[i] + cx)) < 0.2 and abs(py + 4 - (sy * loss[i] + cy)) < 0.2


def test_bytes_axis_ticks_in_binary_units() -> None:
    x = np.arange(10, dtype=float)
    mem = np.full(10, 20 * 2**20, dtype=float)  # 20 MiB
    root = _chart(svg_chart(x, [("activations", mem, "#000")], stacked=True, y_fmt="bytes", y_title="memory"))
    ylab, ypos = _ticks(root, "y")
    assert _texts(root, "axis-title y")[0].text == "memory (MiB)"
    assert ylab[0] == "0" and _value(ylab[-1]) >= 20
    sy, cy = _linear(ylab, ypos)
    top = float(next(root.iter("polygon")).get("points", "").split()[0].split(",")[1])
    assert abs(top + 4 - (sy * 20 + cy)) < 0.2  # a 20 MiB band ends at the "20" tick's height


def test_seconds_axis_in_ms_and_short_runs_get_integer_steps() -> None:
    root = _chart(svg_chart([0.0, 0.5, 1.0, 1.5], [("forward", [0.004, 0.005, 0.006, 0.00516], "#000")],
                            stacked=True, y_fmt="s", y_title="step time"))
    xlab, xpos = _ticks(root, "x")
    assert xlab == ["0", "1", "2"] and len(set(xpos)) == 3
    assert _texts(root, "axis-title y")[0].text == "step time (ms)"


def _report_svgs(tmp_path: Path) -> list[tuple[str, ET.Element]]:
    import torch

    import gpudash
    from gpudash.monitor import Monitor

    with Monitor(tmp_path / "r", host_hz=0) as mon:
        for i in range(30):
            with mon.step(samples=1):
                with mon.phase("forward"):
                    torch.ones(4).sum()
                mon.log(loss=5.0 - i / 15)
                mon.memory_row(i, {"params_bytes": 3 * 2**30, "activations_bytes": (1 + i % 3) * 2**29})
    page = render_html(gpudash.load_run(tmp_path / "r"))
    out = []
    for m in re.finditer(r"<figcaption>(.*?)</figcaption>.*?(<svg.*?</svg>)", page, re.S):
        out.append((m.group(1), _chart(m.group(2))))
    return out


def test_every_report_chart_has_axis_titles_and_readable_ticks(tmp_path: Path) -> None:
    charts = dict(_report_svgs(tmp_path))
    assert {"Step time by phase", "Loss", "Memory by category"} <= set(charts)
    for name, root in charts.items():
        assert _texts(root, "axis-title x")[0].text == "step", name
        assert _texts(root, "axis-title y")[0].text, name
        for axis in ("x", "y"):
            labels, pos = _ticks(root, axis)
            assert 3 <= len(labels) <= 8 and len(set(labels)) == len(labels), (name, labels)
            width = max(len(s) for s in labels) * 7  # 11 px font: labels do not touch
            assert min(abs(np.diff(pos))) > (width if axis == "x" else 12), (name, labels, pos)
    assert _texts(charts["Memory by category"], "axis-title y")[0].text == "memory (GiB)"
    assert _texts(charts["Loss"], "axis-title y")[0].text == "loss"
    loss_ticks = [_value(s) for s in _ticks(charts["Loss"], "y")[0]]
    assert 2 < loss_ticks[0] <= 3.07 and loss_ticks[-1] >= 5.0  # the data's range, not from 0
