"""Runs that provoke each verdict for real, recorded once per session.

Two sources: gpudash's trainer with its own switches and testing aids (the
sample-run recipes in scripts/make_sample_runs.py, shortened), and the toy loop
of :mod:`gpudash.testing` with faults for what the trainer has no switch for (a
corrupted batch, fp16 gradient overflow, host copies, a barrier wait).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpudash.testing import ToyLoop

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("make_sample_runs", ROOT / "scripts" / "make_sample_runs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


class FaultLoop(ToyLoop):
    """An MLP on a learnable task whose data, backward and optimizer parts can
    misbehave for real: a corrupted batch, an fp16 gradient overflow under a loss scaler."""

    def __init__(self, *, batch: int, slow_data_ms: float, bad_batch_at: tuple[int, ...],
                 fp16_overflow_at: tuple[int, ...]) -> None:
        super().__init__((64, 256, 8), activation="gelu", lr=3e-3, batch=batch, tokens_per_sample=1)
        torch = self.torch
        self.w_true = torch.randn(64, 8)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16) if fp16_overflow_at else None
        self.slow_data_ms = slow_data_ms
        self.bad_batch_at = bad_batch_at
        self.fp16_overflow_at = fp16_overflow_at
        self.finite = True

    def batch(self, step: int) -> tuple[Any, Any]:
        torch = self.torch
        if self.slow_data_ms:
            time.sleep(self.slow_data_ms / 1e3)
        x = torch.randn(self.batch_size, 64)
        y = (x @ self.w_true).argmax(1)
        if step in self.bad_batch_at:  # a corrupted batch: huge inputs, random labels
            x, y = x * 50.0, torch.randint(0, 8, (self.batch_size,))
        return x, y

    def forward(self, x: Any, y: Any) -> Any:
        torch = self.torch
        with torch.autocast("cpu", dtype=torch.float16, enabled=self.scaler is not None):
            return torch.nn.functional.cross_entropy(self.model(x).float(), y)

    def backward(self, loss: Any, step: int) -> None:
        scaler = self.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if scaler is not None and step in self.fp16_overflow_at:
            self.model[0].weight.grad.fill_(float("inf"))  # what an fp16 overflow leaves behind

    def optimize(self, step: int) -> Any:
        torch, scaler, opt = self.torch, self.scaler, self.opt
        self.finite = True
        if scaler is not None:
            scaler.unscale_(opt)
            self.finite = all(bool(torch.isfinite(p.grad).all()) for p in self.model.parameters())
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return None


def monitor_loop(run_dir: Path, *, steps: int = 60, batch: int = 32, slow_data_ms: float = 0.0,
                 bad_batch_at: tuple[int, ...] = (), fp16_overflow_at: tuple[int, ...] = (),
                 fallback_after: int = 3, offload_mb: float = 0.0, barrier_wait_ms: float = 0.0) -> Path:
    """:class:`FaultLoop` trained on CPU under a real Monitor, with the scenario's fault done for real
    (plus host copies in an ``offload`` phase and a barrier wait outside any phase)."""
    import torch

    from gpudash.monitor import Monitor

    torch.set_num_threads(1)
    loop = FaultLoop(batch=batch, slow_data_ms=slow_data_ms, bad_batch_at=bad_batch_at,
                     fp16_overflow_at=fp16_overflow_at)
    nonfinite_run = 0
    host = torch.empty(int(offload_mb * 2**20) // 4) if offload_mb else None
    dev = torch.randn(host.numel()) if host is not None else None
    barrier = threading.Barrier(2) if barrier_wait_ms else None
    stop = threading.Event()

    def straggler() -> None:  # the other "rank": arrives late at every step's barrier
        assert barrier is not None
        while not stop.is_set():
            time.sleep(barrier_wait_ms / 1e3)
            try:
                barrier.wait(timeout=5)
            except threading.BrokenBarrierError:
                return

    peer = threading.Thread(target=straggler, daemon=True) if barrier else None
    if peer is not None:
        peer.start()
    with Monitor(run_dir, name=run_dir.name, host_hz=1.0) as mon:
        mon.watch(loop.model, loop.opt)
        for _ in range(steps):
            with loop.step(mon) as s:
                if host is not None and dev is not None:
                    with mon.phase("offload"):
                        for _ in range(4):
                            host.copy_(dev)
                            dev.copy_(host)
                if barrier is not None:
                    barrier.wait(timeout=5)  # outside any phase, like an all-reduce wait
                log: dict[str, Any] = {"loss": s.loss if loop.finite else float("nan")}
                if loop.scaler is not None:
                    log["loss_scale"] = loop.scaler.get_scale()
                mon.log(**log)
                nonfinite_run = 0 if loop.finite else nonfinite_run + 1
                if loop.scaler is not None and nonfinite_run >= fallback_after:  # inside the step: the event carries it
                    mon.event("precision_fallback", f"{nonfinite_run} non-finite steps in a row: fp16 -> fp32",
                              old="fp16", new="fp32")
                    loop.scaler = None
    stop.set()
    if barrier is not None:
        barrier.abort()
    return run_dir


@pytest.fixture(scope="session")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Any]:
    """``recorded(name)``: a trainer sample run (shortened) or ``recorded(name, loop=dict(...))``,
    recorded once per session and loaded with ``gpudash.load_run``."""
    import gpudash

    cache: dict[str, Path] = {}
    script = load_script()
    base = tmp_path_factory.mktemp("analysis-runs")
    # input-bound: a longer data sleep than the sample's 150 ms, so that a loaded machine's slower compute (CI
    # runs two workers on two cores) does not bring the data phase's share below the verdict's threshold
    shorter = {"healthy": {"steps": 30}, "oom-recovered": {"steps": 50},
               "input-bound": {"steps": 12, "slow_data_ms": 400},
               "precision-fallback": {"steps": 28}}

    def get(name: str, loop: dict[str, Any] | None = None) -> Any:
        if name not in cache:
            if loop is not None:
                cache[name] = monitor_loop(base / name, **loop)
            else:
                sample = script.SAMPLES[name]
                sample.config = {**sample.config, **shorter.get(name, {})}
                cache[name] = script.record(base / name, sample)
        return gpudash.load_run(cache[name])

    return get
