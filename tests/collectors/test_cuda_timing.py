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
from gpudash.collectors.cuda_timing import CudaTimer, CudaTimingCollector
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


def attach(m: Monitor, event_cls: Any = None, **options: Any) -> CudaTimer:
    """The timer as the Monitor starts it: a collector whose hooks time each step."""
    collector = CudaTimingCollector(event_cls or HostEvent, **options)
    m.add_collector(collector)
    assert collector.timer is not None
    return collector.timer


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
        timer = attach(m, HostEvent, poll_interval=0.01)
        run_steps(m, 3)
        time.sleep(0.1)
        assert timer.pending == 3  # the "GPU" has not finished: nothing written, nothing waited for
        gpu_done()
        deadline = time.monotonic() + 10
        while timer.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        run_steps(m, 2)  # still in flight at close: the Monitor stops its collectors, and the timer's
        threading.Timer(0.2, gpu_done).start()  # drain resolves them once the "GPU" is done
    steps = gpudash.load_run(tmp_path / "r").steps
    assert steps["step"].tolist() == [0, 1, 2, 3, 4]
    assert (steps["forward_gpu_s"] >= 0.002).all()
    assert (steps["backward_gpu_s"] >= 0.001).all()
    assert (steps["gpu_s"] >= steps["forward_gpu_s"] + steps["backward_gpu_s"]).all()


def test_pending_is_bounded(tmp_path: Path) -> None:
    HostEvent.completed_upto = HostEvent.seq
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = attach(m, HostEvent, max_pending=4, poll_interval=0.01)
        run_steps(m, 10)
        assert timer.pending == 4 and timer.dropped == 6
        gpu_done()
    steps = gpudash.load_run(tmp_path / "r").steps
    assert len(steps) == 10
    assert steps["gpu_s"].notna().sum() == 4


def test_a_cuda_error_disables_timing_not_training(tmp_path: Path) -> None:
    class Broken(HostEvent):
        def record(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = attach(m, Broken, poll_interval=0.01)
        run_steps(m, 3)
        timer.close()
    run = gpudash.load_run(tmp_path / "r")
    assert len(run.steps) == 3 and "gpu_s" not in run.steps
    ev = run.events[run.events["kind"] == "collector_unavailable"]
    assert [d["source"] for d in ev["data"]].count("cuda_timing") == 1


def test_drain_gives_up_on_a_hung_gpu(tmp_path: Path) -> None:
    HostEvent.completed_upto = HostEvent.seq
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = attach(m, HostEvent, poll_interval=0.01)
        run_steps(m, 3)
        timer.drain(timeout=0.2)  # the events never complete
        assert timer.pending == 0 and timer.dropped == 3
        timer.close()
    steps = gpudash.load_run(tmp_path / "r").steps
    assert len(steps) == 3 and "gpu_s" not in steps


def test_flush_drains_the_rows_in_flight(tmp_path: Path) -> None:
    """``Monitor.flush`` reaches the timer as it reaches every collector: held rows are written."""
    HostEvent.completed_upto = HostEvent.seq
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = attach(m, poll_interval=60)  # the poller never runs: only drain can write them
        run_steps(m, 3)
        assert timer.pending == 3
        gpu_done()
        assert m.flush()
        assert timer.pending == 0
        steps = gpudash.load_run(tmp_path / "r").steps
        assert steps["step"].tolist() == [0, 1, 2] and steps["gpu_s"].notna().all()


def test_a_failed_step_is_not_held_and_later_steps_are(tmp_path: Path) -> None:
    HostEvent.completed_upto = HostEvent.seq
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = attach(m, poll_interval=0.01)
        try:
            with m.step():
                with m.phase("forward"):
                    raise MemoryError("CUDA out of memory (simulated)")
        except MemoryError:
            pass
        assert timer.pending == 0
        run_steps(m, 2)
        assert timer.pending == 2
        gpu_done()
    steps = gpudash.load_run(tmp_path / "r").steps
    assert steps["step"].tolist() == [0, 1] and steps["forward_gpu_s"].notna().all()


def test_after_close_the_monitor_writes_the_rows_itself(tmp_path: Path) -> None:
    HostEvent.completed_upto = HostEvent.seq
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=False) as m:
        timer = attach(m, poll_interval=0.01)
        timer.close()
        run_steps(m, 2)
        assert timer.pending == 0
    steps = gpudash.load_run(tmp_path / "r").steps
    assert steps["step"].tolist() == [0, 1] and "gpu_s" not in steps


def test_without_cuda_no_timer_hook_runs(tmp_path: Path) -> None:
    """The CPU path: the collector records why and registers nothing on the training thread."""
    with Monitor(tmp_path / "r", host_hz=0, cuda_timing=True, device_hz=0, allocator=False) as m:
        assert not any(isinstance(getattr(h, "__self__", None), CudaTimer)
                       for h in [*m._start_hooks, *m._end_hooks, *m._phase_start_hooks, *m._phase_end_hooks])
        run_steps(m, 1)
    run = gpudash.load_run(tmp_path / "r")
    assert "cuda_timing" in [d["source"] for d in run.events[run.events["kind"] == "collector_unavailable"]["data"]]
