"""The page of an imported snapshot (nothing empty on it), the timeline's zoom (drawn again from every
event in the window) and the diff view, as pure functions of the run and the browser's payloads."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import plotly
import pytest
from helpers.snapshot_files import in_order

from gpudash.cli import main as cli
from gpudash.server.layouts import snapshot_views
from gpudash.server.layouts.fig import wire
from gpudash.server.layouts.pages import build_run_page
from gpudash.server.layouts.snapshot_diff_view import diff_children
from gpudash.server.layouts.snapshot_page import pick_pair
from gpudash.store.reader import RunReader

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real-snapshot" / "cs336_assignment2_memory_snapshot.pickle"
SYNTH = ROOT / "tests" / "fixtures" / "snapshot_synthetic.pickle"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("snap-page")
    synth, real = in_order([SYNTH, REAL], root / "files")  # (a snapshot's time is its file's)
    assert cli(["import-snapshot", str(synth), str(root / "imported"), "--step", "1"]) == 0
    assert cli(["import-snapshot", str(real), str(root / "imported"), "--step", "3"]) == 0
    return root / "imported"


def _json(component: Any) -> str:
    return json.dumps(component.to_plotly_json(), cls=plotly.utils.PlotlyJSONEncoder)


def test_the_page_of_an_imported_snapshot_shows_its_views_and_nothing_empty(run: Path) -> None:
    page = _json(build_run_page("imported", RunReader(run)))
    for want in ('"snap-pick"', '"snap-diff-pick"', '"segment-map"', '"alloc-timeline"', '"largest-allocations"',
                 "Largest live allocations", "model.py:"):
        assert want in page, want
    for empty in ("step-time-graph", "memory-graph", "loss-graph", "Finished", "Cost", "cursor-slider",
                  "throughput-view", "summary-panel"):
        assert empty not in page, empty


def test_zoom_payloads() -> None:
    assert snapshot_views.zoom_window({"xaxis.range[0]": 10, "xaxis.range[1]": 2010.5}) == (10.0, 2010.5)
    assert snapshot_views.zoom_window({"xaxis.autorange": True}) is True
    assert snapshot_views.zoom_window({"autosize": True}) is None
    assert snapshot_views.shown_map([1, 2], [2, 1]) == 2
    assert snapshot_views.shown_map([1, 2], [3, 1]) is None  # the run changed since the page was drawn


def test_a_zoomed_window_is_drawn_from_every_event_in_it(run: Path) -> None:
    maps = snapshot_views.load_snapshots(RunReader(run))
    mm = maps[-1]
    whole = snapshot_views.timeline_of(mm)
    assert whole is not None and whole.window is None
    fig = snapshot_views.alloc_timeline_figure(mm, window=(1000, 1400))
    tl = snapshot_views.timeline_of(mm, (1000, 1400))
    assert tl is not None and tl.window == (1000, 1400)
    assert list(tl.x) == list(range(1000, 1401))  # every event of the window sampled
    assert fig.layout.xaxis["range"] == [1000.0, 1400.0] and fig.layout["meta"]["window"] == [1000, 1400]
    assert "events 1,000-1,400" in fig.layout.title["text"]
    assert len(json.dumps(wire(fig), cls=plotly.utils.PlotlyJSONEncoder)) < 2_000_000


def test_the_diff_view_says_what_grew(run: Path) -> None:
    maps = snapshot_views.load_snapshots(RunReader(run))
    shown, before = pick_pair(maps, "1", "0")
    assert (shown.step, before.step) == (3, 1)
    text = _json_children(diff_children(maps, before, shown))
    assert "snapshot-diff-table" in text and "snapshot-diff-graph" in text and "model.py:" in text
    assert "pick a snapshot" in _json_children(diff_children(maps, None, shown))
    assert "same snapshot" in _json_children(diff_children(maps, shown, shown))


def _json_children(children: list[Any]) -> str:
    return json.dumps([c.to_plotly_json() if hasattr(c, "to_plotly_json") else c for c in children],
                      cls=plotly.utils.PlotlyJSONEncoder)


def test_a_run_with_steps_keeps_its_page_and_gets_the_diff_picker(tmp_path: Path) -> None:
    from helpers.runmaker import train

    train(tmp_path / "rich", 12, rich=True)
    page = _json(build_run_page("rich", RunReader(tmp_path / "rich")))
    assert "step-time-graph" in page and "snap-pick" not in page and '"largest-box"' in page
    assert '"snapshot-diff-pick"' in page  # always there: its callback needs every input
    _ = pickle  # the fixtures are pickles; the page never unpickles anything


def test_snapshots_that_cannot_be_read_say_why(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpudash.store import snapshot

    def boom(df: Any, problems: list[str]) -> list[Any]:
        raise MemoryError

    monkeypatch.setattr(snapshot, "snapshots_from_frame", boom)
    problems: list[str] = []
    assert snapshot_views._decode_snapshots(RunReader(run), problems) == []
    assert problems == ["snapshots unreadable: too large for the memory this server has"]


def test_the_page_and_the_cli_show_the_same_diff(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One fact, one place: the run page's diff table and ``gpudash diff-snapshots --json`` agree."""
    from gpudash.units import human_bytes

    maps = snapshot_views.load_snapshots(RunReader(run))
    page = _json_children(diff_children(maps, maps[0], maps[1]))
    assert cli(["diff-snapshots", f"{run}@1", f"{run}@3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for s in data["stacks"][:5]:
        sign = "+" if s["delta_bytes"] > 0 else "-"
        assert sign + human_bytes(abs(s["delta_bytes"])) in page
    assert ("+" + human_bytes(data["allocated_delta_bytes"])) in page
