"""Text from a run (snapshot reason, block state, column and phase names) reaches a figure only
through :func:`gpudash.server.layouts.common.plot_text`: plotly renders a subset of HTML in titles,
legends and hovers, so markup there would become live links."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pandas as pd

from gpudash.server.layouts import device, memory, throughput

LINK = '<a xlink:href="https://evil.example">click</a>'
TAG = re.compile(r"<(?!br>)[A-Za-z/!?]")  # any tag but the <br> the views put in hovers themselves


def _strings(x: Any) -> list[str]:
    """Every string plotly may render (a trace's ``uid`` is an identifier, never shown)."""
    if isinstance(x, dict):
        return [s for k, v in x.items() if k != "uid" for s in _strings(v)]
    if isinstance(x, list | tuple):
        return [s for v in x for s in _strings(v)]
    return [x] if isinstance(x, str) else []


def _markup(fig: Any) -> list[str]:
    return [s for s in _strings(json.loads(json.dumps(fig, default=str))) if TAG.search(s)]


def test_snapshot_reason_and_block_state_escaped() -> None:
    snap = SimpleNamespace(
        step=f"7 {LINK}", reason=f"manual {LINK}",
        segments=pd.DataFrame({"address": [0], "total_size": [100]}),
        blocks=pd.DataFrame({"address": [0, 60], "size": [60, 40], "state": [LINK, "inactive"],
                             "frame": [LINK, "x.py:1"]}))
    fig = memory.segment_map_figure(snap)
    assert not _markup(fig)
    assert "&lt;a xlink:href" in fig.layout.title["text"]
    assert fig.data[1].name.startswith("&lt;a") or fig.data[0].name.startswith("&lt;a")


def test_column_names_escaped_in_device_panels() -> None:
    col = f"{LINK}_w"
    df = pd.DataFrame({"time": [0.0, 1.0], "rank": [0, 0], "gpu": [0, 0], col: [1.0, 2.0], "x&y_pct": [1.0, 2.0]})
    specs = device.device_series(df)
    fig = device.panels_figure("Device", {"device": df}, specs, 0.0)
    assert not _markup(fig)
    names = {t.name for t in fig.data}
    assert "x&amp;y" in names and any("&lt;a" in n for n in names)  # legend names lose the unit suffix


def test_phase_names_escaped() -> None:
    steps = pd.DataFrame({"step": [0, 1], "rank": [0, 0], "time": [0.0, 1.0], "duration_s": [1.0, 1.0],
                          "<b onmouseover=x>data_s": [0.5, 0.5]})
    specs = throughput.phase_series(steps, meta={"phases": ["<b onmouseover=x>data"]})  # phases the run opened
    assert specs, "phase column not picked up"
    fig = throughput.phase_figure(steps, specs)
    assert not _markup(fig)


def test_whole_run_page_has_no_markup_in_figures(runs_dir: Any) -> None:
    from gpudash.server.layouts.callbacks import ReaderCache, page_for

    page = page_for("/run/rich", "", runs_dir, ReaderCache(runs_dir))
    figures = []

    def walk(node: Any) -> None:
        fig = getattr(node, "figure", None)
        if isinstance(fig, dict):
            figures.append(fig)
        children = getattr(node, "children", None)
        for child in children if isinstance(children, list) else [children]:
            if child is not None and not isinstance(child, str | int | float):
                walk(child)

    walk(page)
    assert len(figures) >= 8
    assert not [m for f in figures for m in _markup(f)]
