from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import gpudash  # noqa: E402
from gpudash.options import MonitorOptions  # noqa: E402
from gpudash.trainer import TrainConfig, train  # noqa: E402

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
