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
