"""Issue 41: what gpudash keeps in the watched process is bounded by construction, whatever the loop logs.

A loop that logs ever-new names (``log(**{f"x{step}": ...})``), opens ever-new phases and logs names gpudash
renames (each a problem said once) must not grow the Monitor's or the writer's memory with them: every cache
of names, the phase table and the said-once problems stop at their bound, and the values are still recorded
where SQLite has room. (The soak benchmark, ``benchmarks/soak.py``, measures the process over 100,000 steps.)
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.monitor import Monitor, core
from gpudash.monitor.names import MAX_NAMES as MONITOR_NAMES
from gpudash.store.failures import MAX_REPORTS
from gpudash.store.tables import MAX_NAMES


def test_ever_new_names_phases_and_problems_stay_within_their_bounds(tmp_path: Path) -> None:
    steps = 620
    per_step = 8  # 4,960 names in all: past the writer's bound and SQLite's 2,000 columns
    timed: list[float | None] = []
    with Monitor(tmp_path / "r", handle_signals=False, host_hz=0, leak_poll_s=0, flush_interval=60) as mon:
        mon.add_step_hooks(end=lambda step, row: timed.append(row.get(f"part{step}_s")))
        for i in range(steps):
            with mon.step():
                with mon.phase(f"part{i}"):
                    pass
                mon.log(**{f"x{i}_{j}": float(j) for j in range(per_step)})
                mon.log(**{f"y{i}__min": 1.0})  # a roll-up's name: renamed by the writer, said once each
            if i % 100 == 99:
                assert mon.flush(30.0)
        tables = mon.recorder._tables
        assert len(mon._phases) == core.MAX_PHASES
        assert all(len(c) <= MAX_NAMES for c in tables._colnames.values())
        assert len(tables._colnames["steps"]) == MAX_NAMES  # (it did fill: the bound is what held it)
        assert all(len(c) <= MAX_NAMES for c in tables._ignored.values())
        assert len(mon.recorder._report.said) <= MAX_REPORTS and len(mon.recorder.errors) <= MAX_REPORTS
        assert mon.recorder.unreported > 0
        assert all(len(n) <= MONITOR_NAMES for n in mon._names._names.values())
    assert None not in timed  # a phase past the bound is still timed
    run = gpudash.load_run(tmp_path / "r")
    try:
        assert len(run.steps) == steps
        assert run.steps["x0_0"].iloc[0] == 0.0 and run.steps["part0_s"].notna().iloc[0]  # still recorded
        assert 0 < int(run.meta["unreported_problems"]) <= mon.recorder.unreported  # (counted as they come)
    finally:
        run.close()


def test_optimizers_made_again_and_again_are_not_kept_alive_by_gpudash_run() -> None:
    """``gpudash run`` watches the optimizers a script steps; one made anew every epoch (and its state's tensors)
    is let go once the script drops it, not kept for the whole run."""
    torch = pytest.importorskip("torch")
    from gpudash.zerocode.steps import Watched

    model = torch.nn.Linear(64, 64)
    watched = Watched()
    watched.add_root(model)
    states: list[weakref.ref[Any]] = []
    for _ in range(20):
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(2, 64)).sum().backward()
        opt.step()  # Adam's state: two tensors per parameter
        watched.add_optimizer(opt)
        states.append(weakref.ref(opt.state[model.weight]["exp_avg"]))
        del opt
        gc.collect()
    assert len(watched.state.maps) <= 2
    assert sum(r() is not None for r in states) <= 1  # only the last optimizer's state is alive
