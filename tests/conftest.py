"""Shared fixtures: a real tiny training loop under a real Monitor."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Two CI cores: torch's intra-op threads fighting each other (and pytest's
# child processes) make tiny models 10-30x slower. Children inherit this.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


def tiny_loop(run_dir: Path, steps: int = 20, *, watch: bool = True, close: bool = True,
              **monitor_kwargs: Any) -> Any:
    """Train a small MLP on CPU for ``steps`` steps under a Monitor; returns the Monitor."""
    import torch

    from gpudash.monitor import Monitor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = Monitor(run_dir, **monitor_kwargs)
    if watch:
        mon.watch(model, opt)
    for _ in range(steps):
        with mon.step(samples=16, tokens=16 * 8):
            with mon.phase("data"):
                x = torch.randn(16, 32)
                y = x[:, :4].argmax(1)
            with mon.phase("forward"):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            with mon.phase("backward"):
                loss.backward()
            with mon.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            mon.log(loss=loss, lr=1e-2)
    if close:
        mon.close()
    return mon


@pytest.fixture
def train_tiny() -> Callable[..., Any]:
    return tiny_loop
