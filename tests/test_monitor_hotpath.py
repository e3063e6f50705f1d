"""The per-step path: plain values go in as they are, tensors are detached, names are checked once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import gpudash
from gpudash.monitor import Monitor
from gpudash.store import tables


class _Detachable:
    """Stands in for a tensor: log() must call detach() on the training thread, once."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.detached = 0

    def detach(self) -> float:
        self.detached += 1
        return self.value


def test_log_stores_plain_values_and_detaches_tensors(tmp_path: Path) -> None:
    t = _Detachable(0.25)
    with Monitor(tmp_path / "run", handle_signals=False, flush_interval=0.05) as mon:
        mon.log(before=1.5)  # outside a step: lands in the next one
        with mon.step(samples=4):
            with mon.phase("forward"):
                pass
            mon.log(loss=2.0, ok=True, count=3, none=None)
            mon.log(grad=t, loss2=0.5)  # one tensor among plain values
    assert t.detached == 1
    steps = gpudash.load_run(tmp_path / "run").steps
    row = steps.iloc[0]
    assert (row["before"], row["loss"], row["ok"], row["count"], row["grad"], row["loss2"]) == (1.5, 2.0, 1, 3, 0.25, 0.5)
    assert row["samples"] == 4 and row["forward_s"] >= 0


def test_each_name_is_mapped_to_its_column_once_not_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = tables.column_name

    def counting(key: str) -> str:
        calls.append(key)
        return real(key)

    monkeypatch.setattr(tables, "column_name", counting)
    names = [f"m{i}" for i in range(8)]
    with Monitor(tmp_path / "run", handle_signals=False, flush_interval=0.05) as mon:
        for i in range(60):
            with mon.step():
                with mon.phase("forward"):
                    pass
                mon.log(**{n: float(i) for n in names})
            if i % 20 == 0:
                assert mon.flush()
    steps = gpudash.load_run(tmp_path / "run").steps
    assert len(steps) == 60 and list(steps["m7"])[-1] == 59.0
    # every name once (per table), over 60 steps and 4 flushes
    assert {n: calls.count(n) for n in [*names, "forward_s", "duration_s"]} == dict.fromkeys(
        [*names, "forward_s", "duration_s"], 1)


def test_a_phase_between_steps_and_a_second_exit_record_nothing(tmp_path: Path) -> None:
    with Monitor(tmp_path / "run", handle_signals=False, host_hz=0.0) as mon:
        with mon.phase("eval"):  # between steps: timed into nowhere
            pass
        ctx = mon.step()
        with ctx:
            with mon.phase("forward"):
                pass
        ctx.__exit__(None, None, None)  # a second exit (an integration's cleanup) writes nothing more
        with mon.phase("eval"):
            pass
        mon.log(after=1.0)  # lands in the next step, with nothing a between-steps phase timed
        with mon.step():
            pass
    steps = gpudash.load_run(tmp_path / "run").steps
    assert steps["step"].tolist() == [0, 1]
    assert "eval_s" not in steps or steps["eval_s"].isna().all()
    assert steps["after"].isna().tolist() == [True, False]


FIRST_STEP = """
import sys
import torch
from gpudash.options import MonitorOptions
from gpudash.zerocode.agent import Agent

agent = Agent(sys.argv[1], {"options": MonitorOptions(handle_signals=False)})
agent.install(torch)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(4, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()
assert agent.monitor is not None and agent.monitor.step_index >= 1, "nothing recorded"
loaded = [m for m in ("pandas", "pyarrow", "dash", "plotly") if m in sys.modules]
agent.stop()
print(loaded)
sys.exit(bool(loaded))
"""


def test_the_training_process_never_loads_the_reading_side(tmp_path: Path) -> None:
    """Issue 41: under ``gpudash run`` the first step opens the Monitor on the training thread; importing pandas
    there (the attempts module's reading half) took 0.5-2 s of that step. Recording needs none of it."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, "-c", FIRST_STEP, str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
