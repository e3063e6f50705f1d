"""GPU phase timing: rows wait for their events, go out in order, and never block the loop.

The CPU build of torch has no events (``torch.cuda.Event`` and
``torch.Event("cpu")`` both refuse), so ``HostEvent`` below stands in for
``torch.cuda.Event`` with the same methods; ``gpu_done`` plays the GPU
finishing its queue. On a GPU the timer runs with the real class (issue 7).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import gpudash
from gpudash.collectors.cuda_timing import CudaTimer
from gpudash.monitor import Monitor


class HostEvent:
    completed_upto = 0  # events with seq <= this are "done on the GPU"
    seq = 0

    def __init__(self, enable_timing: bool = False) -> None:
        self.t = 0.0
        self.n = 0

    def record(self) -> None:
        HostEvent.seq += 1
        self.n = HostEvent.seq
        self.t = time.perf_counter()

    def query(self) -> bool:
        return self.n <= HostEvent.completed_upto

    def elapsed_time(self, end: HostEvent) -> float:
        assert self.query() and end.query(), "elapsed_time on an event that has not completed"
        return (end.t - self.t) * 1e3


def gpu_done() -> None:
    HostEvent.completed_upto = HostEvent.seq


def run_steps(m: Monitor, n: int) -> None:
    for _ in range(n):
        with m.step():
            with m.phase("forward"):
                time.sleep(0.002)
            with m.phase("backward"):
                time.sleep(0.001)
            with m.phase("forward"):
                pass


def test_rows_wait_for_events_then_carry_gpu_times(tmp_path: Path) -> None:
    HostEvent.completed_upto = HostEvent.seq
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = CudaTimer(m, HostEvent, poll_interval=0.01)
        m.cuda_timer = timer
        run_steps(m, 3)
        time.sleep(0.1)
        assert timer.pending == 3  # the "GPU" has not finished: nothing written, nothing waited for
        gpu_done()
        deadline = time.monotonic() + 10
        while timer.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        run_steps(m, 2)  # still in flight at close: drain() resolves them once the "GPU" is done
        threading.Timer(0.2, gpu_done).start()
        timer.close()
        m.cuda_timer = None
    steps = gpudash.load_run(tmp_path / "r").steps
    assert steps["step"].tolist() == [0, 1, 2, 3, 4]
    assert (steps["forward_gpu_s"] >= 0.002).all()
    assert (steps["backward_gpu_s"] >= 0.001).all()
    assert (steps["gpu_s"] >= steps["forward_gpu_s"] + steps["backward_gpu_s"]).all()


def test_pending_is_bounded(tmp_path: Path) -> None:
    HostEvent.completed_upto = HostEvent.seq
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = CudaTimer(m, HostEvent, max_pending=4, poll_interval=0.01)
        m.cuda_timer = timer
        run_steps(m, 10)
        assert timer.pending == 4 and timer.dropped == 6
        gpu_done()
        timer.close()
        m.cuda_timer = None
    steps = gpudash.load_run(tmp_path / "r").steps
    assert len(steps) == 10
    assert steps["gpu_s"].notna().sum() == 4


def test_a_cuda_error_disables_timing_not_training(tmp_path: Path) -> None:
    class Broken(HostEvent):
        def record(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer: Any = CudaTimer(m, Broken, poll_interval=0.01)
        m.cuda_timer = timer
        run_steps(m, 3)
        timer.close()
        m.cuda_timer = None
    run = gpudash.load_run(tmp_path / "r")
    assert len(run.steps) == 3 and "gpu_s" not in run.steps
    ev = run.events[run.events["kind"] == "collector_unavailable"]
    assert [d["source"] for d in ev["data"]].count("cuda_timing") == 1


def test_drain_gives_up_on_a_hung_gpu(tmp_path: Path) -> None:
    HostEvent.completed_upto = HostEvent.seq
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = CudaTimer(m, HostEvent, poll_interval=0.01)
        m.cuda_timer = timer
        run_steps(m, 3)
        timer.drain(timeout=0.2)  # the events never complete
        assert timer.pending == 0 and timer.dropped == 3
        timer.close()
        m.cuda_timer = None
    steps = gpudash.load_run(tmp_path / "r").steps
    assert len(steps) == 3 and "gpu_s" not in steps
