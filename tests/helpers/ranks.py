"""A two-rank run recorded in two threads, one rank straggling (the Ranks section's tests, page and browser)."""

from __future__ import annotations

import threading
from pathlib import Path

__all__ = ["STEPS", "STRAGGLE_S", "record_two_ranks"]

STEPS = 12
STRAGGLE_S = 0.03


def _rank(run_dir: Path, rank: int, steps: int, straggle_s: float, barrier: threading.Barrier | None) -> None:
    import torch

    from gpudash.monitor import Monitor

    torch.manual_seed(rank)
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # activations measured every step on both ranks: sampled adaptively, one rank's step would count them and
    # the other's not, which the memory comparison (gpudash.analysis.ranks) reads as imbalance
    with Monitor(run_dir, rank=rank, world_size=2, flush_interval=0.2, host_hz=0.0, handle_signals=False,
                 activations_every=1) as mon:
        mon.watch(model, opt)
        for _ in range(steps):
            with mon.step(samples=8, tokens=8 * 4):
                with mon.phase("data"):
                    x = torch.randn(8, 16)
                    if straggle_s:
                        threading.Event().wait(straggle_s)
                with mon.phase("forward"):
                    loss = model(x).square().mean()
                with mon.phase("backward"):
                    loss.backward()
                    if barrier is not None:
                        barrier.wait(30)  # the all-reduce: the fast rank waits here for the slow one
                with mon.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                mon.log(loss=loss)


def record_two_ranks(run_dir: Path, steps: int = STEPS, straggle_rank: int = 1,
                     straggle_s: float = STRAGGLE_S, sync: bool = True) -> Path:
    """A finished two-rank run in ``run_dir``: ``straggle_rank`` sleeps ``straggle_s`` in each data phase;
    with ``sync`` the ranks meet in backward each step (as DDP's all-reduce makes them)."""
    barrier = threading.Barrier(2) if sync else None
    threads = [threading.Thread(target=_rank, args=(run_dir, r, steps, straggle_s if r == straggle_rank else 0.0,
                                                     barrier)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return run_dir
