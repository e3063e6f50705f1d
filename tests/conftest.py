"""Shared fixtures: a real tiny training loop under a real Monitor."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Two CI cores: torch's intra-op threads fighting each other (and pytest's
# child processes) make tiny models 10-30x slower. Children inherit this.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# run summaries cached on disk (gpudash.store.summarystore) go to a folder of this session, not ~/.cache
os.environ.setdefault("GPUDASH_CACHE_DIR", tempfile.mkdtemp(prefix="gpudash-test-cache-"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``make test`` runs two workers) the tests that drive a real Chromium run one
    after another on one worker, as a user's one browser would: two Chromiums beside two torch processes
    on two cores starve each other's page loads past the tests' waits. The rest spread over both."""
    for item in items:
        if item.get_closest_marker("browser") or "tests/browser/" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("browser"))


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


def tiny_loop(run_dir: Path, steps: int = 20, *, watch: bool = True, close: bool = True,
              **monitor_kwargs: Any) -> Any:
    """Train a small MLP on CPU for ``steps`` steps under a Monitor; returns the Monitor."""
    from gpudash.monitor import Monitor
    from gpudash.testing import ToyLoop

    loop = ToyLoop((32, 64, 4), lr=1e-2, batch=16, tokens_per_sample=8)
    mon = Monitor(run_dir, **monitor_kwargs)
    if watch:
        mon.watch(loop.model, loop.opt)
    loop.train(mon, steps, lr=1e-2)
    if close:
        mon.close()
    return mon


@pytest.fixture
def train_tiny() -> Callable[..., Any]:
    return tiny_loop
