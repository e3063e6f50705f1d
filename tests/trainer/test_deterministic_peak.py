"""Issue 41: a run's peak and the gate on it come from what was measured at steps, never from when a timer fired.
Two identical short CPU runs of the trainer under the default (adaptive) activation rule give the same peak to the
byte, ``gpudash check --max-peak-increase 5%`` passes the rerun and fails a bigger batch; the rule that makes it
so (the first :data:`FULL_STEPS` steps after the first are always measured) holds for any cost and step time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudash.analysis.facts import run_facts
from gpudash.cli import main
from gpudash.collectors.categories import FULL_STEPS, AdaptiveEvery
from gpudash.options import MonitorOptions

# the default activation rule (adaptive, budgeted by measured time): what a user gets
DEFAULT_RULE = MonitorOptions(host_hz=0.0, handle_signals=False)


def test_identical_runs_have_the_same_peak_and_the_gate_holds_them(run_train: Any, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    common = {"preset": "tiny", "steps": 6, "monitor": DEFAULT_RULE, "progress": False}
    a = run_train("a", batch=8, **common)
    b = run_train("b", batch=8, **common)
    big = run_train("big", batch=12, **common)
    peaks = [run_facts(r).headline["peak_memory_bytes"] for r in (a, b, big)]
    assert peaks[0] is not None and peaks[0] == peaks[1], peaks  # to the byte
    assert peaks[2] > 1.05 * peaks[0]
    acts = a.memory.set_index("step")["activations_bytes"]
    assert acts.loc[1:FULL_STEPS].notna().all()  # every step measured: none left to the clock
    base = str(tmp_path / "a")
    assert main(["check", str(tmp_path / "b"), "--baseline", base, "--max-peak-increase", "5%"]) == 0
    assert main(["check", str(tmp_path / "big"), "--baseline", base, "--max-peak-increase", "5%"]) == 1
    assert "FAIL max_peak_increase" in capsys.readouterr().out


@settings(max_examples=60, deadline=None)
@given(first=st.integers(0, 5), costs=st.lists(st.floats(1e-6, 1.0), min_size=FULL_STEPS + 4,
                                               max_size=FULL_STEPS + 4),
       durations=st.lists(st.floats(1e-5, 2.0), min_size=FULL_STEPS + 4, max_size=FULL_STEPS + 4))
def test_the_first_steps_are_measured_whatever_they_cost(first: int, costs: list[float], durations: list[float]) -> None:
    s = AdaptiveEvery(0, 0.005, first=first + 1)
    s.until = first + 1 + FULL_STEPS
    sampled = []
    for i, (cost, dur) in enumerate(zip(costs, durations, strict=True)):
        step = first + i
        if s.due(step):
            sampled.append(step)
            s.done(step, cost, dur)
        else:
            s.observe_step(dur)
    assert sampled[:FULL_STEPS] == list(range(first + 1, first + 1 + FULL_STEPS))
