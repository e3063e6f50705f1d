"""Runs that provoke each verdict for real, recorded once per session.

Two sources: gpudash's trainer with its own switches and testing aids (the
sample-run recipes in scripts/make_sample_runs.py, shortened), and a small
hand-written Monitor loop for what the trainer has no switch for (a corrupted
batch, fp16 gradient overflow, host copies, a barrier wait).
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

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> Any:
    spec = importlib.util.spec_from_file_location("make_sample_runs", ROOT / "scripts" / "make_sample_runs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def monitor_loop(run_dir: Path, *, steps: int = 60, batch: int = 32, slow_data_ms: float = 0.0,
                 bad_batch_at: tuple[int, ...] = (), fp16_overflow_at: tuple[int, ...] = (),
                 fallback_after: int = 3, offload_mb: float = 0.0, barrier_wait_ms: float = 0.0) -> Path:
    """A residual MLP trained on CPU under a real Monitor, with the scenario's fault done for real."""
    import torch

    from gpudash.monitor import Monitor

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dim, classes = 64, 8
    model = torch.nn.Sequential(torch.nn.Linear(dim, 256), torch.nn.GELU(), torch.nn.Linear(256, classes))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    w_true = torch.randn(dim, classes)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16) if fp16_overflow_at else None
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
        mon.watch(model, opt)
        for step in range(steps):
            with mon.step(samples=batch, tokens=batch):
                with mon.phase("data"):
                    if slow_data_ms:
                        time.sleep(slow_data_ms / 1e3)
                    x = torch.randn(batch, dim)
                    y = (x @ w_true).argmax(1)
                    if step in bad_batch_at:  # a corrupted batch: huge inputs, random labels
                        x, y = x * 50.0, torch.randint(0, classes, (batch,))
                with mon.phase("forward"):
                    with torch.autocast("cpu", dtype=torch.float16, enabled=scaler is not None):
                        loss = torch.nn.functional.cross_entropy(model(x).float(), y)
                with mon.phase("backward"):
                    (scaler.scale(loss) if scaler is not None else loss).backward()
                    if scaler is not None and step in fp16_overflow_at:
                        model[0].weight.grad.fill_(float("inf"))  # what an fp16 overflow leaves behind
                with mon.phase("optimizer"):
                    finite = True
                    if scaler is not None:
                        scaler.unscale_(opt)
                        finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
                        scaler.step(opt)
                        scaler.update()
                    else:
                        opt.step()
                    opt.zero_grad(set_to_none=True)
                if host is not None and dev is not None:
                    with mon.phase("offload"):
                        for _ in range(4):
                            host.copy_(dev)
                            dev.copy_(host)
                if barrier is not None:
                    barrier.wait(timeout=5)  # outside any phase, like an all-reduce wait
                log: dict[str, Any] = {"loss": loss if finite else float("nan")}
                if scaler is not None:
                    log["loss_scale"] = scaler.get_scale()
                mon.log(**log)
                nonfinite_run = 0 if finite else nonfinite_run + 1
                if scaler is not None and nonfinite_run >= fallback_after:  # inside the step: the event carries it
                    mon.event("precision_fallback", f"{nonfinite_run} non-finite steps in a row: fp16 -> fp32",
                              old="fp16", new="fp32")
                    scaler = None
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
    shorter = {"healthy": {"steps": 30}, "oom-recovered": {"steps": 50}, "input-bound": {"steps": 20},
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
