"""The live tick against a run a real Monitor is writing."""

from __future__ import annotations

import time
from pathlib import Path

from helpers.runmaker import LiveRun

from gpudash.server.layouts import run_page
from gpudash.server.layouts.data import load_view
from gpudash.server.layouts.live import initial_state, live_tick
from gpudash.store.reader import RunReader


def _specs(view):  # type: ignore[no-untyped-def]
    return {g: run_page.build_graph(g, view)[1] for g in run_page.LIVE_GRAPHS}


def _spec_fn(g, f):  # type: ignore[no-untyped-def]
    return run_page.graph_specs(g, f, 0)


def test_live_ticks_append_each_step_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "live"
    with LiveRun(run_dir, delay=0.02) as live:
        reader = RunReader(run_dir)
        deadline = time.time() + 30
        view = load_view(reader)
        while (view.last_step or 0) < 5 and time.time() < deadline:
            time.sleep(0.2)
            view = load_view(reader)
        assert view.status == "live"
        specs = _specs(view)
        state = initial_state("live", view, specs, 0)
        seen = [int(s) for s in view.frame("steps")["step"]]
        assert "step-time-graph" in run_page.LIVE_GRAPHS, "the step-time chart follows the live tick"
        for _ in range(6):
            time.sleep(0.4)
            res = live_tick(reader, state, _spec_fn)
            state = res.state
            ext = res.extends.get("step-time-graph")
            if "step-time-graph" in res.rebuild:
                break
            if ext is not None:
                data, idx = ext
                assert idx[0] == 0  # the raw step-time trace
                seen += data["x"][0]
                # appended values are plain lists, never numpy buffers (extendData concatenates lists)
                assert all(isinstance(v, float) for v in data["y"][0])
        live.stop()
        res = live_tick(reader, state, _spec_fn)
        if res.extends.get("step-time-graph"):
            seen += res.extends["step-time-graph"][0]["x"][0]
        state = res.state
        reader.close()
    assert seen == list(range(len(seen))), "each step drawn exactly once, in order"
    assert state["last_step"] == seen[-1]
    assert state["status"] == "finished"
    assert len(seen) > 10


def test_new_column_triggers_rebuild(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor

    run_dir = tmp_path / "grow"
    mon = Monitor(run_dir, flush_interval=0.1, host_hz=0)
    for _ in range(5):
        with mon.step(samples=4):
            mon.log(loss=1.0)
    mon.flush()
    reader = RunReader(run_dir)
    view = load_view(reader)
    state = initial_state("grow", view, _specs(view), 0)
    assert not state["specs"]["signals-graph"]
    for i in range(3):
        with mon.step(samples=4):
            mon.log(loss=1.0, grad_norm=0.5 + i)
    mon.flush()
    res = live_tick(reader, state, _spec_fn)
    assert "signals-graph" in res.rebuild
    assert "step-time-graph" in res.extends
    assert res.state["last_step"] == 7
    mon.close()
    res = live_tick(reader, res.state, _spec_fn)
    assert res.state["status"] == "finished" and not res.extends
    reader.close()


def test_empty_live_run_then_first_steps(tmp_path: Path) -> None:
    import json

    import plotly

    from gpudash.monitor import Monitor
    from gpudash.server.layouts.pages import build_run_page

    mon = Monitor(tmp_path / "fresh", flush_interval=0.1, host_hz=0)
    mon.flush()
    reader = RunReader(tmp_path / "fresh")
    view = load_view(reader)
    assert view.status == "live" and view.last_step is None
    page = json.dumps(build_run_page("fresh", reader), cls=plotly.utils.PlotlyJSONEncoder)
    assert "waiting for the first records" in page
    state = initial_state("fresh", view, _specs(view), 0)
    for _ in range(3):
        with mon.step(samples=2):
            mon.log(loss=1.0)
    mon.flush()
    res = live_tick(reader, state, _spec_fn)
    assert {"step-time-graph", "loss-graph"} <= res.rebuild  # first rows: whole figures, then extends
    assert res.state["last_step"] == 2
    mon.close()
    reader.close()


def test_killed_run_reads_crashed(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = ("import os, sys; from gpudash.monitor import Monitor\n"
            "m = Monitor(sys.argv[1], flush_interval=0.1, host_hz=0)\n"
            "for i in range(5):\n"
            "    with m.step(samples=1): m.log(loss=1.0)\n"
            "m.flush(); os._exit(1)\n")
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "dead")], check=False, timeout=120)
    reader = RunReader(tmp_path / "dead")
    view = load_view(reader)
    reader.close()
    assert view.status == "crashed" and view.last_step == 4
    assert view.meta["end_reason"] == "process died (no heartbeat)"


def test_a_new_attempt_redoing_drawn_steps_rebuilds_the_step_charts(tmp_path: Path) -> None:
    """A page drawn during attempt 1 (steps 0..9): attempt 2 resumes at step 5, so its rows supersede drawn ones:
    the step charts are drawn again from the store (each step once, the new values), not extended."""
    from gpudash.monitor import Monitor

    run_dir = tmp_path / "resumed"
    kw = {"flush_interval": 0.05, "host_hz": 0.0, "handle_signals": False}
    with Monitor(run_dir, **kw) as mon:
        for i in range(10):
            with mon.step():
                mon.log(loss=float(i))
    reader = RunReader(run_dir)
    view = load_view(reader)
    state = initial_state("live", view, _specs(view), 0)
    with Monitor(run_dir, resume=True, **kw) as mon:
        for i in range(5, 8):
            with mon.step(step=5 if i == 5 else None):
                mon.log(loss=100.0 + i)
    res = live_tick(reader, state, _spec_fn)
    assert "step-time-graph" in res.rebuild and "loss-graph" in res.rebuild
    again = load_view(reader)
    assert again.frame("steps")["loss"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 105.0, 106.0, 107.0]
    reader.close()
