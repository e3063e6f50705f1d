"""Issue 41: a run's peak and the gate on it come from what was measured at steps, never from when a timer fired.
Two identical short CPU runs of the trainer under the default (adaptive) activation rule give the same peak to the
byte, ``gpudash check --max-peak-increase 5%`` passes the rerun and fails a bigger batch; the rule that makes it
so (:class:`StepSchedule`: which steps are measured is a rule of step numbers alone) holds for any step time, and
two identical Monitor runs with varying batch sizes give the same peak when one of them runs much slower."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudash import load_run
from gpudash.analysis.facts import run_facts
from gpudash.cli import main
from gpudash.collectors.categories import FULL_STEPS, StepSchedule
from gpudash.monitor import Monitor
from gpudash.options import MonitorOptions

# the default activation rule (StepSchedule: by step number, whatever the timing): what a user gets
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
@given(first=st.integers(0, 5), fixed=st.sampled_from([0, 0, 1, 3, 7]), budget=st.floats(1e-5, 0.5),
       steps=st.integers(FULL_STEPS + 2, 3000))
def test_the_schedule_is_a_rule_of_steps(first: int, fixed: int, budget: float, steps: int) -> None:
    s = StepSchedule(fixed, budget)
    assert not s.due(first)  # not started: nothing measured
    s.first = first
    sampled = [k for k in range(first, first + steps) if s.due(k)]
    assert first not in sampled  # the first step (compile, warm-up) is never measured
    if fixed:
        assert sampled == list(range(first + 1, first + steps, fixed))
    else:
        assert sampled[:FULL_STEPS] == list(range(first + 1, first + 1 + FULL_STEPS))
        # the gaps never shrink, never pass the cap, and each measured step says the gap to the next one
        gaps = [b - a for a, b in zip(sampled, sampled[1:], strict=False)]
        assert gaps == sorted(gaps) and max(gaps) <= s.cap
        assert all(s.every(a) == g for a, g in zip(sampled, gaps, strict=False))
        assert len(sampled) <= FULL_STEPS + s.cap.bit_length() + steps // s.cap
        assert s.cap & (s.cap - 1) == 0 and s.cap <= 1024


BATCHES = {12: 64, 16: 32}  # steps whose batch is bigger than the usual 16


def _varying_run(run_dir: Path, slow: bool) -> tuple[float | None, list[int]]:
    """20 steps of a small MLP whose batch size varies; ``slow``: every step waits 20 ms more (a loaded
    machine), which the old cost-budgeted rule turned into measuring other steps."""
    import torch

    from gpudash.testing import ToyLoop

    torch.manual_seed(0)
    loop = ToyLoop((32, 256, 4), lr=1e-2, batch=16)
    with Monitor(run_dir, host_hz=0.0, handle_signals=False) as mon:
        mon.watch(loop.model, loop.opt)
        for i in range(20):
            loop.batch_size = BATCHES.get(i, 16)
            with loop.step(mon) as st:
                mon.log(loss=st.loss)
                if slow:
                    time.sleep(0.02)
    run = load_run(run_dir)
    try:
        mem = run.memory
        measured = mem.loc[mem["activations_bytes"].notna(), "step"].astype(int).tolist()
        return run_facts(run).headline["peak_memory_bytes"], measured
    finally:
        run.close()


def test_identical_runs_with_varying_batches_have_the_same_peak_however_slow(tmp_path: Path) -> None:
    fast = _varying_run(tmp_path / "fast", slow=False)
    slow = _varying_run(tmp_path / "slow", slow=True)
    assert fast[1] == slow[1] == [*range(1, FULL_STEPS + 1), 16]  # the same steps, by the step rule
    assert fast[0] is not None and fast[0] == slow[0]  # to the byte
