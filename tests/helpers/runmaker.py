"""Real run directories for the dashboard tests: a small model trained on CPU under a real Monitor.

``rich_run`` adds what a GPU run would record through the same Monitor API
(allocator columns via ``log_memory``, an OOM event, a stored allocator
snapshot from the synthetic fixture, py-spy style stacks), so every view has
real rows to draw on a machine without a GPU.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOSTILE = "<img src=x onerror=alert(1)>"


def train(run_dir: Path, steps: int = 40, *, rich: bool = False, name: str | None = None, delay: float = 0.0,
          stop: threading.Event | None = None, flush_interval: float = 0.2, hostile: bool = True,
          total_steps: int | None = None) -> Path:
    from gpudash.monitor import Monitor
    from gpudash.testing import ToyLoop

    loop = ToyLoop((32, 64, 4), lr=1e-2, batch=16, tokens_per_sample=8, clip_grad_norm=10.0)
    with Monitor(run_dir, name=name, flush_interval=flush_interval, host_hz=5.0, total_steps=total_steps,
                 config={"memory_budget_gb": 0.001} if rich else None) as mon:
        mon.watch(loop.model, loop.opt)
        if rich:
            mon.set_meta(estimate={"peak_bytes": 900_000})
            _store_snapshot(mon, step=0)
            mon.put("stacks", {"time": time.time(), "stack": "train.py:main;train.py:step;torch:backward", "count": 30})
            mon.put("stacks", {"time": time.time(), "stack": "train.py:main;train.py:data", "count": 10})
        step = 0
        while step < steps or (stop is not None and not stop.is_set()):
            with loop.step(mon) as s:
                scalars: dict[str, Any] = {"loss": s.loss, "lr": 1e-2}
                if rich:
                    scalars["grad_norm"] = s.grad_norm
                    if step == steps // 2:
                        scalars["loss"] = 50.0  # a loss spike for the detector
                    alloc = 600_000 + 1000 * step
                    mon.log_memory(allocated_bytes=alloc, reserved_bytes=alloc + 200_000, alloc_retries=0,
                                   fragmentation_pct=5.0)
                mon.log(**scalars)
            if rich and step == steps - 5:
                mon.event("oom", "CUDA out of memory at batch 32" + (f" {HOSTILE}" if hostile else ""), batch_size=32)
                mon.event("batch_size_change", "batch 32 -> 16", old=32, new=16)
            step += 1
            if delay:
                time.sleep(delay)
    return run_dir


def _store_snapshot(mon: Any, step: int) -> None:
    from gpudash.store.snapshot import read_snapshot_pickle, snapshot_row, summarize

    raw = read_snapshot_pickle((FIXTURES / "snapshot_synthetic.pickle").read_bytes())
    mon.put("snapshots", snapshot_row(summarize(raw), time=time.time(), step=step, reason="test"))


class LiveRun:
    """A run being written by a real Monitor in a background thread until :meth:`stop`."""

    def __init__(self, run_dir: Path, delay: float = 0.05, name: str | None = None,
                 total_steps: int | None = None) -> None:
        self.run_dir = run_dir
        self._stop = threading.Event()
        self._thread = threading.Thread(target=train, args=(run_dir, 1),
                                        kwargs={"delay": delay, "stop": self._stop, "name": name,
                                                "total_steps": total_steps}, daemon=True)

    def __enter__(self) -> LiveRun:
        self._thread.start()
        deadline = time.time() + 30
        while not (self.run_dir / "rank0.db").exists() and time.time() < deadline:
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def long_run(run_dir: Path, steps: int = 200_000, spike: int = 150_000, step_s: float = 0.001) -> Path:
    """A run of many short steps (a roll-up by time would hold a handful of buckets) with one loss spike and
    one activation-memory spike at step ``spike``, written through the real Recorder."""
    from gpudash.store.writer import Recorder

    rec = Recorder(run_dir, flush_interval=0.2, capacity=2 * steps + 10, meta={"name": run_dir.name, "device": "cpu"})
    for s in range(steps):
        t = 1000.0 + step_s * s
        rec.put("steps", {"step": s, "time": t, "duration_s": step_s,
                          "loss": 2.0 + 0.01 * ((s * 7919) % 13) / 13 + (30.0 if s == spike else 0.0)})
        rec.put("memory", {"step": s, "time": t, "params_bytes": 1e6,
                           "activations_bytes": 3e6 + (4e8 if s == spike else 0.0)})
    rec.close()
    return run_dir
