"""Progress and ETA, derived once (gpudash.analysis.progress): hand-made runs and the Monitor's total."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpudash.analysis.facts import run_facts
from gpudash.analysis.progress import eta_text, fmt_eta, progress, progress_text, run_progress, step_period
from gpudash.store.run import Run


def _run(n: int, *, total: int | None, status: str = "live", first_s: float = 1.0, step_s: float = 1.0,
         ranks: tuple[int, ...] = (0,)) -> Run:
    """``n`` steps: the first takes ``first_s``, every other ``step_s`` (end times as the Monitor records)."""
    rows: list[dict[str, Any]] = []
    for rank in ranks:
        t = 1000.0
        for s in range(n):
            d = first_s if s == 0 else step_s
            t += d
            rows.append({"rank": rank, "step": s, "time": t, "duration_s": d * 0.9})
    meta: dict[str, Any] = {"total_steps": total} if total is not None else {}
    return Run(path=Path("."), meta=meta, status=status, steps=pd.DataFrame(rows), memory=pd.DataFrame(),
               events=pd.DataFrame())


def test_unknown_total_has_no_progress() -> None:
    run = _run(10, total=None)
    assert run_facts(run).progress is None
    assert progress_text(None) == "" and eta_text(None) == ""


def test_live_run_eta_from_the_recent_step_rate() -> None:
    facts = run_facts(_run(10, total=100, step_s=2.0))
    p = facts.progress
    assert p is not None
    assert (p.done, p.total, p.steps_left) == (10, 100, 90)
    assert p.fraction == pytest.approx(0.1)
    assert p.step_s == pytest.approx(2.0)  # the gap between step ends, not the 1.8 s inside each step
    assert p.eta_s == pytest.approx(180.0)
    assert progress_text(p) == "step 10 of 100 · ETA 3 min"
    assert facts.to_json()["progress"]["eta_s"] == pytest.approx(180.0)


def test_slow_first_step_does_not_count() -> None:
    p = run_progress(_run(5, total=1005, first_s=600.0, step_s=0.5), 5)
    assert p is not None and p.step_s == pytest.approx(0.5)
    assert p.eta_s == pytest.approx(500.0)
    two = run_progress(_run(2, total=12, first_s=600.0, step_s=0.5), 2)
    assert two is not None and two.eta_s == pytest.approx(5.0)


def test_finished_run_has_progress_but_no_eta() -> None:
    p = run_facts(_run(40, total=40, status="finished")).progress
    assert p is not None and p.fraction == 1.0 and p.steps_left == 0 and p.eta_s is None
    assert progress_text(p) == "step 40 of 40"
    crashed = run_facts(_run(10, total=40, status="crashed")).progress
    assert crashed is not None and crashed.eta_s is None and crashed.steps_left == 30


def test_rate_from_the_last_steps_only_and_the_lowest_rank() -> None:
    rows = [{"rank": 0, "step": s, "time": float(s if s < 100 else 100 + 3 * (s - 100))} for s in range(110)]
    rows += [{"rank": 1, "step": s, "time": 10.0 * s} for s in range(110)]  # another rank's clock
    run = Run(path=Path("."), meta={"total_steps": 120}, status="live", steps=pd.DataFrame(rows),
              memory=pd.DataFrame(), events=pd.DataFrame())
    p = run_progress(run, 110)
    assert p is not None and p.step_s == pytest.approx(1.0)  # median of the last 50 gaps: 40 of 1 s, 10 of 3 s
    assert p.eta_s == pytest.approx(10.0)


def test_step_period_edge_cases() -> None:
    assert step_period([], []) is None
    assert step_period([0], [5.0], [0.25]) == pytest.approx(0.25)  # one step: its duration
    assert step_period([0, 4], [0.0, 8.0]) == pytest.approx(2.0)  # dropped rows: the gap over the steps it spans
    assert step_period([3, 1, 2], [30.0, 10.0, 20.0]) == pytest.approx(10.0)  # any order
    assert progress(5, 0) is None and progress(5, None) is None
    assert progress(12, 10, [0, 1], [0.0, 1.0]) == progress(12, 10, [0, 1], [0.0, 1.0])
    over = progress(12, 10, [0, 1], [0.0, 1.0])
    assert over is not None and over.fraction == 1.0 and over.steps_left == 0 and over.eta_s == 0.0


def test_eta_said_as_people_say_it() -> None:
    assert [fmt_eta(s) for s in (0.2, 45, 180, 7500, 3 * 86400 + 4 * 3600)] == \
        ["< 1 s", "45 s", "3 min", "2 h 05 min", "3 d 4 h"]


def test_monitor_records_total_steps(tmp_path: Path) -> None:
    from gpudash.monitor import Monitor
    from gpudash.store import load_run

    with pytest.raises(ValueError, match="total_steps"):
        Monitor(tmp_path / "bad", total_steps=0, host_hz=0.0, handle_signals=False)
    with Monitor(tmp_path / "r", total_steps=50, host_hz=0.0, device_hz=0.0, handle_signals=False) as mon:
        with mon.step():
            pass
        mon.set_total_steps(60)
        with pytest.raises(ValueError):
            mon.set_total_steps(2.5)  # type: ignore[arg-type]
    run = load_run(tmp_path / "r")
    assert run.meta["total_steps"] == 60
    p = run_facts(run).progress
    assert p is not None and (p.done, p.total, p.eta_s) == (1, 60, None)


def test_progress_from_a_stored_summary() -> None:
    from gpudash.analysis.progress import Progress

    p = run_facts(_run(10, total=100, step_s=2.0)).progress
    assert p is not None and Progress.from_json(run_facts(_run(10, total=100, step_s=2.0)).to_json()["progress"]) == p
    assert Progress.from_json(None) is None and Progress.from_json({"done": "x"}) is None
