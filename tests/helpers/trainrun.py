"""The `run_train` fixture: gpudash's trainer on the CPU into a fresh folder, loaded back (tests of the trainer
and of the memory model against it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import gpudash
from gpudash.options import MonitorOptions
from gpudash.trainer import TrainConfig, train

# the CI box is small and shared: one intra-op thread avoids OpenMP spin contention
torch.set_num_threads(1)

# small and quiet: no host sampling thread, activations measured on every step
FAST_MONITOR = MonitorOptions(host_hz=0.0, activations_every=1, handle_signals=False)


@pytest.fixture
def run_train(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    runs: list[Any] = []

    def go(name: str = "run", **kw: Any) -> Any:
        kw.setdefault("monitor", FAST_MONITOR)
        kw.setdefault("device", "cpu")
        cfg = TrainConfig(run_dir=tmp_path / name, **kw)
        r = gpudash.load_run(train(cfg))
        runs.append(r)
        return r

    yield go
    for r in runs:
        r.close()
