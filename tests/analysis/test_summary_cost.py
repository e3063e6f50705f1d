"""summarize(): the one entry point, its ordering, the cost model, and the layer rule."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from gpudash.analysis import Verdict, summarize
from gpudash.analysis.cost import run_cost


def test_summarize_worst_first_cost_last(recorded: Any) -> None:
    vs = summarize(recorded("oom-crash"))
    assert all(isinstance(v, Verdict) for v in vs)
    assert vs[0].severity == "bad" and vs[-1].kind == "cost"
    order = {"bad": 0, "warn": 1, "ok": 2}
    assert [order[v.severity] for v in vs[:-1]] == sorted(order[v.severity] for v in vs[:-1])
    assert all(v.as_dict()["title"] for v in vs)


def test_cost_scales_with_price_and_counts_savings(recorded: Any) -> None:
    run = recorded("input-bound")
    run.meta["device"] = "cuda:0"  # recorded on the CI CPU; priced as the GPU run its meta now says it was
    a, b = run_cost(run, price_per_hour=1.0), run_cost(run, price_per_hour=4.0)
    assert a.gpu_hours > 0 and b.dollars == pytest.approx(4 * a.dollars)
    cost = summarize(run, price_per_hour=3.0)[-1]
    assert cost.numbers["price_per_hour"] == 3.0 and cost.numbers["saved_gpu_hours"] > 0
    assert cost.saving and "GPU-" in cost.saving


def test_a_cpu_run_shows_its_time_not_a_gpu_price(recorded: Any) -> None:
    run = recorded("input-bound")
    assert run.meta["device"] == "cpu"
    assert run_cost(run).gpu_hours == 0.0
    cost = summarize(run, price_per_hour=3.0)[-1]
    assert cost.kind == "cost" and cost.title.startswith("Time: ") and "on the CPU" in cost.title
    text = " ".join([cost.title, *cost.evidence, cost.saving or ""])
    assert "GPU-" not in text and "$" not in text and cost.numbers["dollars"] == 0.0
    assert cost.numbers["saved_s"] > 0 and cost.saving  # what the input-bound fix would save, in time


def test_analysis_imports_without_torch_or_dash() -> None:
    code = ("import sys, gpudash.analysis, gpudash.analysis.report, gpudash.report, gpudash.commands.report;"
            "bad=[m for m in ('torch','dash','plotly') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_run_that_died_before_its_first_step(tmp_path: Any) -> None:
    import gpudash
    from gpudash.monitor import Monitor
    from gpudash.report import render_html, render_markdown

    Monitor(tmp_path / "early", host_hz=0).close("crashed", "exception: RuntimeError: no data")
    run = gpudash.load_run(tmp_path / "early")
    vs = summarize(run)
    assert vs[0].title == "Crashed after 0 steps" and "no data" in vs[0].evidence[0]
    assert "No steps recorded" in render_html(run, vs) and "Crashed" in render_markdown(run, vs)


def test_one_failing_analysis_does_not_hide_the_others(recorded: Any) -> None:
    run = recorded("input-bound")
    run.steps = run.steps.assign(duration_s="not a number")  # what a damaged column could look like
    kinds = {v.kind for v in summarize(run)}
    assert "analysis-error" in kinds and "status" in kinds and "cost" in kinds
