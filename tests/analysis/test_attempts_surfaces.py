"""A resumed run on every surface: the attempts fact and each step once in ``gpudash info``, the report, ``/api``,
``/metrics`` and the run page's charts (their resume marker); no spike or leak read from the restart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpudash.analysis.facts import run_facts
from gpudash.cli import main
from gpudash.monitor import Monitor
from gpudash.store import load_run

KW = {"flush_interval": 0.05, "host_hz": 0.0, "handle_signals": False}


def _resumed(run_dir: Path) -> None:
    """Attempt 1 records steps 0..39 (a flat loss, memory that grows in its warm-up); attempt 2 resumes at 30 with
    a warm-up step 20x slower than the rest and a fresh allocator (less memory held) -- neither is a finding."""
    for attempt, steps in ((1, range(40)), (2, range(30, 60))):
        with Monitor(run_dir, resume=attempt == 2, **KW) as mon:
            for n, i in enumerate(steps):
                with mon.step(step=30 if attempt == 2 and n == 0 else None):
                    mon.log(loss=2.0 + 0.01 * (i % 3) + (0.5 if attempt == 2 and n == 0 else 0.0))
                    held = 1e6 * (1 + min(n, 5)) / attempt  # warm-up, then flat
                    mon.log_memory(allocated_bytes=held, reserved_bytes=2 * held)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_a_resumed_run_says_the_same_on_every_surface(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "runs" / "resumed"
    _resumed(run_dir)
    run = load_run(run_dir)
    try:
        facts = run_facts(run)
        assert run.steps["step"].tolist() == list(range(60))
        assert run.memory["step"].tolist() == list(range(60))
    finally:
        run.close()
    assert facts.steps == 60 and facts.attempts == 2 and len(facts.resumes) == 1
    assert facts.loss_spike_steps == () and facts.leak is None
    truth = facts.to_json()
    assert truth["resumes"][0]["step"] == 30 and truth["resumes"][0]["previous_end"] == "finished"
    assert json.loads(_cli(capsys, "info", str(run_dir), "--json"))["facts"] == truth
    assert json.loads(_cli(capsys, "report", str(run_dir), "--format", "json"))["facts"] == truth
    assert re.search(r"^attempts +2 attempts: attempt 2 resumed at step 30 after \d+ s \(attempt 1 finished at step "
                     r"39\)$", _cli(capsys, "info", str(run_dir)), re.M)

    from gpudash.server.app import create_app
    from gpudash.server.layouts.data import load_view
    from gpudash.server.layouts.run_page import build_graph
    from gpudash.server.layouts.xaxis import XAxis
    from gpudash.store.reader import RunReader

    client: Any = create_app(run_dir.parent, metrics=True).server.test_client()
    assert client.get("/api/runs/resumed/summary").get_json()["facts"] == truth
    metrics = client.get("/metrics").get_data(as_text=True)
    assert re.search(r'^gpudash_step\{[^}]*run="resumed"[^}]*\} 59(\.0)?$', metrics, re.M), metrics[:2000]
    reader = RunReader(run_dir)
    try:
        view = load_view(reader)
        for graph in ("loss-graph", "step-time-graph", "memory-graph"):
            fig, _ = build_graph(graph, view)
            marks = [str(a.text) for a in fig.layout.annotations or () if "resumed" in str(a.text)]
            assert len(marks) == 1 and re.fullmatch(r"attempt 2 resumed at step 30 after \d+ s", marks[0]), graph
        fig, _ = build_graph("loss-graph", view, x=XAxis("relative", view.t0))
        assert any("attempt 2 resumed" in str(a.text) for a in fig.layout.annotations or ())  # on the time axis too
    finally:
        reader.close()
