"""Figure builders on real run directories written by a real Monitor."""

from __future__ import annotations

import json
from pathlib import Path

import plotly
import pytest

from gpudash.server.layouts import compare, events, hotspots, memory, run_page, runs, stability, throughput
from gpudash.server.layouts.common import fmt_s, source_reason
from gpudash.server.layouts.data import load_view
from gpudash.server.layouts.pages import build_run_page, facts_for, load_snapshots, pick_snapshot, range_view
from gpudash.server.layouts.series import Series, series_xy, spike_mask
from gpudash.store.reader import RunReader


@pytest.fixture(scope="module")
def rich(runs_dir: Path):  # type: ignore[no-untyped-def]
    reader = RunReader(runs_dir / "rich")
    yield reader, load_view(reader)
    reader.close()


def _points(fig) -> int:  # type: ignore[no-untyped-def]
    return max((len(t.x) for t in fig.data if t.x is not None), default=0)


def test_every_live_graph_has_traces(rich) -> None:  # type: ignore[no-untyped-def]
    _, view = rich
    for g in run_page.LIVE_GRAPHS:
        fig, specs = run_page.build_graph(g, view)
        if g == "device-graph":
            assert specs == []  # no GPU here: the page shows the reason instead
            continue
        assert specs, g
        assert len(fig.data) == len(specs)
        assert [t.uid for t in fig.data] == [s.key for s in specs]
        assert fig.layout.uirevision == "gpudash"


def test_memory_by_category(rich) -> None:  # type: ignore[no-untyped-def]
    _, view = rich
    fig, specs = run_page.build_graph("memory-graph", view)
    names = [s.name for s in specs]
    assert names[:3] == ["parameters", "gradients", "optimizer state"]
    assert "allocator cache" in names and "activations" in names
    cache = next(s for s in specs if s.name == "allocator cache")
    x, y = series_xy(cache, view.frame("memory"))
    assert cache.unit == "KiB" and fig.layout["yaxis"]["ticksuffix"] == " KiB"  # binary units, not plotly's SI "kB"
    assert y and all(v * cache.scale == pytest.approx(200_000, rel=1e-5) for v in y)  # reserved - allocated
    texts = [a.text for a in fig.layout.annotations]
    assert any("budget" in t for t in texts) and any("estimate" in t for t in texts)
    assert any(t == "OOM" for t in texts)


def test_memory_at_cursor(rich) -> None:  # type: ignore[no-untyped-def]
    _, view = rich
    at = memory.memory_at(view.frame("memory"), 10)
    assert at["step"] == 10
    assert at["parameters"] > 0 and at["allocator cache"] == 200_000
    assert memory.memory_at(view.frame("memory"), -1) == {}


def test_segment_map_from_stored_snapshot(rich) -> None:  # type: ignore[no-untyped-def]
    reader, _ = rich
    maps = load_snapshots(reader)
    assert len(maps) == 1
    assert pick_snapshot(maps, 5) is maps[0] and pick_snapshot([], 5) is None
    fig = memory.segment_map_figure(maps[0])
    states = {t.name for t in fig.data}
    assert "active_allocated" in states and "inactive" in states
    assert any("largest free block" in a.text for a in fig.layout.annotations)
    assert sum(len(t.x) for t in fig.data) == len(maps[0].blocks)


def test_throughput_stats_and_phases(rich) -> None:  # type: ignore[no-untyped-def]
    reader, _ = rich
    facts = facts_for(reader.path)
    st = throughput.throughput_stats(facts.recent)  # the header renders the run's facts (analysis/rates.py)
    assert st["median_s"] > 0 and st["p95_s"] >= st["median_s"]
    assert st["samples_per_s"] > 0 and st["tokens_per_s"] == pytest.approx(8 * st["samples_per_s"])
    assert set(st["phases"]) == {"data", "forward", "backward", "optimizer"}
    lines = throughput.stats_lines(facts)
    assert any("MFU: device peak unknown" in line for line in lines)  # a CPU run: no peak to measure against
    assert throughput.throughput_stats(facts.to_json()["recent"]) == st  # the API's JSON says the same


def test_stability_spike_and_lights(rich) -> None:  # type: ignore[no-untyped-def]
    reader, view = rich
    fig, specs = run_page.build_graph("loss-graph", view)
    spikes = next(t for t in fig.data if t.name == "spike")
    assert list(spikes.x) == [20]
    facts = facts_for(reader.path)
    assert facts is not None and list(facts.loss_spike_steps) == list(spikes.x)  # markers and facts agree
    lights = {name: color for name, color, _ in stability.stability_lights(facts)}
    assert lights["loss spikes"] == "amber" and lights["OOMs"] == "red"
    assert lights["allocator retries"] == "green" and lights["fragmentation"] == "green"


def test_spike_mask_ignores_noise() -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    loss = 2.0 + 0.01 * rng.standard_normal(200)
    assert not spike_mask(loss).any()
    loss[150] = 6.0
    loss[170] = float("nan")
    assert list(np.flatnonzero(spike_mask(loss))) == [150]


def test_unrecorded_sources_say_why(runs_dir: Path) -> None:
    reader = RunReader(runs_dir / "plain")
    view = load_view(reader)
    assert "no CUDA device" in source_reason("allocator", view.meta, view.frame("events"))
    assert "NVML" in source_reason("device", view.meta, view.frame("events"))
    assert "py-spy" in source_reason("stacks", {}, None) or "stacks" in source_reason("stacks", {}, None)
    page = json.dumps(build_run_page("plain", reader), cls=plotly.utils.PlotlyJSONEncoder)
    assert "device-graph-reason" in page and "NVML" in page
    assert "no CUDA device: allocator snapshots" in page
    reader.close()


def test_events_table_click_and_neighbors(rich) -> None:  # type: ignore[no-untyped-def]
    _, view = rich
    rows = events.event_rows(view.frame("events"))
    kinds = [r["kind"] for r in rows]
    assert "oom" in kinds and "batch_size_change" in kinds
    oom = next(r for r in rows if r["kind"] == "oom")
    assert "<img" in oom["message"]  # kept as text: a DataTable cell never renders HTML
    fig = events.events_figure(view.frame("events"))
    hover = [h for t in fig.data for h in t.hovertext]
    assert not any("<img" in h for h in hover) and any("&lt;img" in h for h in hover)
    assert events.event_step({"points": [{"x": 35, "customdata": 35}]}) == 35
    assert events.event_step(None, {"row": rows.index(oom)}, rows) == oom["step"]
    assert events.neighbor_event([3, 10, 35], 10, 1) == 35
    assert events.neighbor_event([3, 10, 35], 10, -1) == 3
    assert events.neighbor_event([3, 10, 35], 35, 1) is None


def test_hotspots(rich) -> None:  # type: ignore[no-untyped-def]
    _, view = rich
    rows = hotspots.hotspot_rows(view.frame("stacks"))
    assert rows[0]["frame"] == "torch:backward" and rows[0]["self_pct"] == 75.0
    main = next(r for r in rows if r["frame"] == "train.py:main")
    assert main["total_pct"] == 100.0 and main["self_pct"] == 0.0


def test_runs_list_and_page(runs_dir: Path) -> None:
    rows = runs.list_runs(runs_dir)
    assert [r["id"] for r in rows] == ["plain", "rich"]  # newest first
    rich = rows[1]
    assert rich["status"] == "finished" and rich["steps"] == 40 and rich["device"] == "cpu"
    assert rich["peak_bytes"] == 600_000 + 1000 * 39 + 200_000
    assert rich["tokens_per_s"] > 0 and rich["duration_s"] > 0
    page = runs.runs_page(runs_dir, rows)
    assert "/run/rich" in json.dumps(page.to_plotly_json(), cls=plotly.utils.PlotlyJSONEncoder)


def test_compare(runs_dir: Path) -> None:
    from gpudash.server.runcache import shared_cache

    views = [(rid, load_view(RunReader(runs_dir / rid))) for rid in ("rich", "plain")]
    facts = [shared_cache().get(runs_dir / rid).facts for rid in ("rich", "plain")]
    rows = compare.compare_rows(views, facts)
    assert rows[0]["peak vs baseline"] == "1.00x" and rows[0]["step time vs baseline"] == "1.00x"
    assert rows[0]["run"] == "rich (baseline)"
    assert rows[1]["run"] == "plain" and rows[1]["parameters"] == rows[0]["parameters"]
    # the table renders the facts: the same median step time as every other surface
    assert rows[1]["median step"] == fmt_s(facts[1].headline["step_time_median_s"])
    other = compare.compare_rows(views, facts, baseline=1)
    assert other[1]["run"] == "plain (baseline)" and other[1]["step time vs baseline"] == "1.00x"
    ratio = facts[0].headline["step_time_median_s"] / facts[1].headline["step_time_median_s"]
    assert other[0]["step time vs baseline"] == f"{ratio:.2f}x"
    loss, rate, mem, st = compare.compare_figures(views)
    assert len(loss.data) == len(rate.data) == len(mem.data) == len(st.data) == 2
    assert mem.layout["yaxis"]["ticksuffix"].endswith("iB")


def test_range_view_requery(rich) -> None:  # type: ignore[no-untyped-def]
    reader, view = rich
    part = range_view(reader, view, 10, 20, "step")
    steps = part.frame("steps")["step"]
    assert steps.min() >= 10 and steps.max() <= 20 and len(steps) == 11


def test_series_rate_and_elapsed(rich) -> None:  # type: ignore[no-untyped-def]
    _, view = rich
    x, y = series_xy(Series("steps", "samples", "s/s", fn="rate"), view.frame("steps"))
    assert len(x) == 40 and all(v > 0 for v in y)
    hx, _ = series_xy(Series("host", "cpu_pct", "cpu", x="elapsed"), view.frame("host"), view.t0)
    assert hx and 0 <= hx[0] < 60


def test_html_in_names_stays_text(runs_dir: Path) -> None:
    reader = RunReader(runs_dir / "rich")
    page = build_run_page("rich", reader)
    reader.close()
    name = next(c for c in _walk(page) if getattr(c, "id", None) == "run-name")
    assert name.children == "rich <img src=x onerror=alert(1)>"  # a text child: React escapes it


def _walk(c):  # type: ignore[no-untyped-def]
    yield c
    kids = getattr(c, "children", None)
    if isinstance(kids, list | tuple):
        for k in kids:
            yield from _walk(k)
    elif kids is not None and hasattr(kids, "children"):
        yield from _walk(kids)


def test_downsampled_big_frame_bounded(tmp_path: Path) -> None:
    import numpy as np
    import pandas as pd

    from gpudash.server.layouts.data import downsample_frame

    n = 200_000
    df = pd.DataFrame({"rank": 0, "step": np.arange(n), "time": np.arange(n) * 0.1,
                       "duration_s": np.r_[np.full(n - 1, 0.1), 5.0]})
    small = downsample_frame(df, "steps", 4000)
    assert len(small) <= 4000 and small["duration_s"].max() == 5.0


def test_two_ranks_side_by_side(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor

    run_dir = tmp_path / "ddp"
    mons = [Monitor(run_dir, rank=r, world_size=2, host_hz=0, flush_interval=0.1) for r in (0, 1)]
    for step in range(12):
        for r, mon in enumerate(mons):
            with mon.step(samples=8, tokens=64):
                mon.log(loss=1.0 + r + 0.01 * step)
            mon.memory_row(step, {"params_bytes": 1000 * (r + 1)})
    for mon in mons:
        mon.close()
    reader = RunReader(run_dir)
    view = load_view(reader)
    assert view.ranks == [0, 1]
    _, specs = run_page.build_graph("step-time-graph", view)
    assert {s.rank for s in specs} == {0, 1} and any(s.name.endswith("r1") for s in specs)
    fig, mspecs = run_page.build_graph("memory-graph", view, rank=1)
    assert fig.data[0].y[0] * mspecs[0].scale == pytest.approx(2000, rel=1e-5) and mspecs[0].unit == "KiB"
    page = json.dumps(build_run_page("ddp", reader, rank=1), cls=plotly.utils.PlotlyJSONEncoder)
    assert "/run/ddp?rank=0" in page and '"rank": 1' in page
    reader.close()


def test_device_panels_per_gpu_and_unit(tmp_path: Path) -> None:
    """NVML-style rows (as the device collector writes them) through the real Recorder."""
    from gpudash.store.writer import Recorder

    rec = Recorder(tmp_path / "gpu", flush_interval=0.1, meta={"device": "cuda:0", "device_name": "H100"})
    for k in range(50):
        for gpu in (0, 1):
            rec.put("device", {"time": 1000.0 + k * 0.1, "gpu": gpu, "sm_active_pct": 50.0 + gpu,
                               "pcie_tx_mib_s": 10.0 * k, "pcie_rx_mib_s": 5.0, "dram_bw_pct": 30.0,
                               "power_w": 300.0, "temp_c": 60.0, "sm_clock_mhz": 1800.0,
                               "memory_used_bytes": 1e9})
    rec.close()
    reader = RunReader(tmp_path / "gpu")
    view = load_view(reader)
    fig, specs = run_page.build_graph("device-graph", view)
    reader.close()
    assert {s.gpu for s in specs} == {0, 1}
    axes = {s.col: s.yaxis for s in specs}
    assert axes["sm_active_pct"] == axes["dram_bw_pct"] == "y"
    assert axes["pcie_tx_mib_s"] == axes["pcie_rx_mib_s"] != axes["power_w"]
    assert len({axes["power_w"], axes["temp_c"], axes["sm_clock_mhz"], axes["memory_used_bytes"]}) == 4
    titles = {fig.layout[k]["title"]["text"] for k in fig.layout if k.startswith("yaxis")}
    assert titles == {"utilization", "bandwidth", "memory", "power", "temperature", "clock"}
    suffixes = {fig.layout[k].get("ticksuffix") for k in fig.layout if k.startswith("yaxis")}
    assert suffixes == {" %", " MiB/s", " MiB", " W", " °C", " MHz"}  # 1e9 bytes drawn in MiB, not "1G"
    assert len(fig.data) == len(specs) == 16


def test_spike_early_in_a_falling_loss() -> None:
    """Regression: the trailing MAD was NaN for the first window, so an early spike went unseen."""
    import numpy as np

    loss = np.linspace(5.5, 4.0, 30)
    loss[15] = 35.0
    assert list(np.flatnonzero(spike_mask(loss))) == [15]


def test_cpu_time_columns_are_not_phases() -> None:
    import pandas as pd

    steps = pd.DataFrame({"duration_s": [1.0], "forward_s": [0.4], "thread_cpu_s": [0.9], "forward_gpu_s": [0.3]})
    assert [s.col for s in throughput.phase_series(steps)] == ["forward_s"]


def test_runs_filter_and_signature() -> None:
    from gpudash.server.layouts.runs import filter_runs, row_signature

    rows = [{"id": "a", "name": "GPT small", "status": "live", "device": "NVIDIA H100", "steps": 5},
            {"id": "b", "name": "tiny mlp", "status": "finished", "device": "cpu", "steps": 40},
            {"id": "c", "name": "gpt big", "status": "crashed", "device": "NVIDIA A100", "steps": 9}]
    assert [r["id"] for r in filter_runs(rows, "gpt")] == ["a", "c"]  # any case
    assert [r["id"] for r in filter_runs(rows, "gpt a100")] == ["c"]  # every word
    assert [r["id"] for r in filter_runs(rows, "", "finished")] == ["b"]
    assert [r["id"] for r in filter_runs(rows, None, "all")] == ["a", "b", "c"]
    assert filter_runs(rows, "h100", "crashed") == []
    moved = [dict(rows[0], steps=6), *rows[1:]]
    assert row_signature(moved) != row_signature(rows)  # a step more redraws the table


def test_view_in_the_address_round_trips() -> None:
    from urllib.parse import parse_qs

    from gpudash.server.layouts.viewstate import view_params, view_search

    search = view_search("?rank=1", 120, (100.0, 250.5))
    assert parse_qs(search[1:]) == {"rank": ["1"], "cursor": ["120"], "x0": ["100"], "x1": ["250.5"]}
    assert view_params(parse_qs(search[1:])) == (120, (100.0, 250.5), 0.0)
    assert view_search(search, None, True) == "?rank=1"  # zoom reset and a followed live end leave the address
    assert view_search(search, 7, None).count("x0=100") == 1  # a cursor move keeps the zoom
    assert view_params({"cursor": ["abc"], "x0": ["5"], "x1": ["1"], "smooth": ["7"]}) == (None, None, 0.0)  # ignored
    assert view_params(parse_qs(view_search("", None, None, 0.9)[1:]))[2] == 0.9


def test_replay_speed_plays_any_run_in_about_30_s() -> None:
    from gpudash.server.layouts.run_page import REPLAY_S, TICK_MS, replay_speed, speed_options

    for n, step_s in ((40, 0.002), (200_000, 0.001), (10_000_000, 0.3), (12, 5.0)):
        speed = replay_speed(n, step_s)
        per_tick = (TICK_MS / 1000) * speed / step_s  # what the play callback advances per tick
        assert n / per_tick * TICK_MS / 1000 == pytest.approx(REPLAY_S)
        assert any(o["value"] == speed for o in speed_options(speed))


def test_ema_smoothing_of_loss_and_throughput(rich) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    from gpudash.server.layouts.series import ema

    y = np.array([1.0, np.nan, 3.0, 5.0])
    assert ema(y, 0.0) is y
    # TensorBoard's rule: s_t = w * s_{t-1} + (1 - w) * y_t, missing values skipped
    assert ema(y, 0.5).tolist()[2:] == [2.0, 3.5]
    _, view = rich
    fig, specs = run_page.build_graph("loss-graph", view, smooth=0.9)
    names = [t.name for t in fig.data]
    assert names[:2] == ["loss", "loss (EMA 0.9)"] and fig.data[0].line["color"] != fig.data[1].line["color"]
    raw, smooth = fig.data[0].y, fig.data[1].y
    assert np.std(np.diff(smooth)) < np.std(np.diff(raw))  # smoother than what it averages
    rates, rspecs = run_page.build_graph("rates-graph", view, smooth=0.9)
    assert any(s.fn == "rate_ema" for s in rspecs) and len(rates.data) == 2 * len(run_page.build_graph(
        "rates-graph", view)[1])
