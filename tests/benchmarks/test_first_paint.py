"""benchmarks/first_paint.py: the run it writes and how it reads pages, without servers or a browser."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fp() -> Any:
    """The benchmark's three modules (first_paint, paint_page, paint_run) as one namespace."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    names: dict[str, Any] = {}
    for mod in ("paint_run", "paint_page", "first_paint"):
        names.update(vars(importlib.import_module(mod)))
    return SimpleNamespace(**names)


def test_the_run_has_eight_scalars_and_one_x8_spike_with_the_loss_sorted_first(fp: Any) -> None:
    values = fp.series(1000)
    assert list(values) == list(fp.SCALARS) and len(fp.SCALARS) == 8
    assert sorted(fp.SCALARS)[0] == "loss"  # the peers lay their charts out by name
    k = fp.spike_step(1000)
    assert 100 < k < 900
    assert values["loss"][k] == pytest.approx(8 * np.median(values["loss"][k - 5:k + 5]), rel=0.1)
    assert fp.spike_value(1000) == values["loss"][k] == fp.series(1000)["loss"][k]  # same values every time


def test_the_gpudash_run_shows_the_one_spike_to_the_analysis(fp: Any, tmp_path: Path) -> None:
    from gpudash.analysis.facts import run_facts
    from gpudash.store.run import load_run

    fp.write_gpudash(tmp_path / "run", 400)
    run = load_run(tmp_path / "run")
    facts = run_facts(run)
    assert facts.steps == 400 and facts.loss_spike_steps == (fp.spike_step(400),)
    assert set(fp.SCALARS) <= set(run.steps.columns) and len(run.memory) == 400
    assert facts.phases == ("data", "forward", "backward", "optimizer")


def _entry(name: str, end: float, transfer: int, decoded: int = 0, start: float = 0.0) -> dict[str, Any]:
    return {"name": name, "type": "fetch", "start": start, "req": start, "res": start, "end": end,
            "transfer": transfer, "encoded": transfer, "decoded": decoded}


def test_bytes_count_the_document_and_what_ended_before_the_chart(fp: Any) -> None:
    page = {"nav": _entry("/", 10, 1000), "resources": [_entry("a.js", 50, 300), _entry("b", 99.5, 20),
                                                        _entry("late", 120, 5000)]}
    assert fp.bytes_until(page, 100.0) == 1320
    assert fp.bytes_until(page, float("inf")) == 6320


def test_axis_top_from_tick_positions(fp: Any) -> None:
    ticks = [[0.5, 214.66], [1, 168.0], [2.5, 28.0]]
    assert fp.axis_top(ticks) == pytest.approx(2.8, abs=0.01)
    assert fp.axis_top([[1, 10.0]]) is None and fp.axis_top([]) is None


def _tb_body(values: list[float]) -> str:
    return json.dumps([{"plugin": "scalars", "tag": "loss", "runToSeries": {
        "run": [{"wallTime": 1.0, "step": i, "value": v} for i, v in enumerate(values)]}}])


def test_spike_verdicts_read_what_each_chart_was_given(fp: Any) -> None:
    spike = 6.0
    gd = {"drawn": 1.0, "snap": {"ymax": 6.0000001, "marker_ymax": 6.0}}
    assert fp.spike_verdict("gpudash", gd, spike)[0] == "yes"
    assert fp.spike_verdict("gpudash", {"drawn": 1.0, "snap": {"ymax": 2.0}}, spike)[0] == "no"
    assert fp.spike_verdict("gpudash", {"drawn": None}, spike)[0] == "n/a"

    rows = {"data": [{"run": "run", "logs": [{"loss": 1.0, "step": 0}, {"loss": 6.0, "step": 4}]}]}
    early = {"t": 1.0, "body": json.dumps({"data": [{"logs": [{"loss": 1.0}]}]})}
    tr = {"drawn": 5.0, "bodies": [early, {"t": 4.0, "body": json.dumps(rows)}]}
    assert fp.spike_verdict("trackio", tr, spike)[0] == "yes"
    tr["bodies"][1]["t"] = 9.0  # arrived after the chart was drawn: not what it drew
    assert fp.spike_verdict("trackio", tr, spike)[0] == "no"
    assert fp.spike_verdict("trackio", {"drawn": 5.0, "bodies": []}, spike)[0] == "n/a"

    axis = [[0.5, 200.0], [2.5, 20.0]]  # top of the axis: 2.72
    tb = {"drawn": 5.0, "bodies": [{"t": 1.0, "body": _tb_body([1.0, 6.0, 1.0])}], "snap": {"tb_ticks": axis}}
    assert fp.spike_verdict("tensorboard", tb, spike)[0] == "clipped"
    tb["snap"]["tb_ticks"] = [[0, 200.0], [5, 20.0]]  # top 5.56: still below 6
    assert fp.spike_verdict("tensorboard", tb, spike)[0] == "clipped"
    tb["snap"]["tb_ticks"] = [[0, 200.0], [6, 20.0]]
    assert fp.spike_verdict("tensorboard", tb, spike)[0] == "yes"
    tb["bodies"] = [{"t": 1.0, "body": _tb_body([1.0, 2.0])}]
    assert fp.spike_verdict("tensorboard", tb, spike)[0] == "no"


def test_callback_outputs_are_named_short(fp: Any) -> None:
    assert fp._outputs("..page.children...shown-page.data..") == "page.children, shown-page.data"
    assert fp._outputs("loss-graph.figure") == "loss-graph.figure"
