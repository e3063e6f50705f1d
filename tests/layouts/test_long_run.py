"""A 200,000-step run of short steps is drawn whole: x from step 0, its spike at step 150,000 on the charts,
the header's step the same as the facts'."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import plotly
import pytest
from helpers.runmaker import long_run

from gpudash.server.layouts import run_page
from gpudash.server.layouts.data import load_view
from gpudash.server.layouts.downsample import MAX_POINTS
from gpudash.server.layouts.pages import build_run_page, range_view
from gpudash.server.runcache import shared_cache
from gpudash.store.reader import RunReader


@pytest.fixture(scope="module")
def long(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = long_run(tmp_path_factory.mktemp("long") / "long")
    reader = RunReader(path)
    yield reader, load_view(reader)
    reader.close()


def test_drawn_whole_with_its_spike(long: Any) -> None:
    _, view = long
    facts = shared_cache().get(view.path).facts
    assert facts.steps == 200_000 and 150_000 in facts.loss_spike_steps
    mem, specs = run_page.build_graph("memory-graph", view)
    acts = next(t for t in mem.data if t.name == "activations")
    assert acts.x[0] == 0 and acts.x[-1] == 199_999 and len(acts.x) <= MAX_POINTS
    top = acts.y[acts.x.index(150_000)] * specs[0].scale
    assert top == pytest.approx(4.03e8, rel=1e-4)  # the one-step memory spike, at its height
    loss, _ = run_page.build_graph("loss-graph", view, spikes=list(facts.loss_spike_steps))
    line = next(t for t in loss.data if t.name == "loss")
    marker = next(t for t in loss.data if t.name == "spike")
    assert line.x[0] == 0 and 150_000 in line.x and marker.x == [150_000]


def test_header_step_is_the_facts(long: Any) -> None:
    reader, view = long
    page = json.dumps(build_run_page("long", reader, view=view), cls=plotly.utils.PlotlyJSONEncoder)
    assert '"children": "199999", "id": "last-step"' in page or '"id": "last-step", "children": "199999"' in page


def test_zoom_reads_full_detail_by_step(long: Any) -> None:
    reader, view = long
    zoomed = range_view(reader, view, 149_900, 150_100)
    steps = zoomed.frame("steps")["step"].tolist()
    assert steps == list(range(149_900, 150_101))  # every step of the range, none averaged away


def test_step_charts_are_never_time_rollups(long: Any) -> None:
    _, view = long
    assert view.levels["steps"] == 0 and view.levels["memory"] == 0
    assert Path(view.path).name == "long"


def test_ema_over_every_step_of_a_long_run(long: Any) -> None:
    """The EMA line of a downsampled chart averages every step (not the few thousand rows drawn)."""
    import numpy as np
    import pandas as pd

    _, view = long
    fig, _ = run_page.build_graph("loss-graph", view, smooth=0.99)
    trace = next(t for t in fig.data if t.name.startswith("loss (EMA"))
    full = view.full["steps"]["loss"].to_numpy(dtype=float)
    want = pd.Series(full).ewm(alpha=0.01, adjust=False).mean().to_numpy()
    got = dict(zip(trace.x, trace.y, strict=True))
    assert len(trace.x) <= MAX_POINTS and got[199_999] == pytest.approx(want[-1], rel=1e-5)
    assert got[150_000] == pytest.approx(want[150_000], rel=1e-5) and np.isfinite(list(got.values())).all()
