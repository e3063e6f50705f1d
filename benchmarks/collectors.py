"""Cost of the GPU collectors (issue 3).

    .venv/bin/python benchmarks/collectors.py            # print the table
    .venv/bin/python benchmarks/collectors.py --write    # also update benchmarks/RESULTS.md
    .venv/bin/python benchmarks/collectors.py --fixtures $OUT/fixtures   # on a GPU: real fixtures too

Rows that need a GPU or an NVML driver print "n/a (no GPU)" where there is
none. On CPU it measures what gpudash adds on top of the torch/NVML calls:
the allocator hook's Python side, the device sampler's logic per tick
(replaying the NVML recording fixture), the sampler thread's CPU share at
20 Hz, snapshot summarising, and py-spy's effect on a CPU-bound loop.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import results  # noqa: E402  (benchmarks/results.py, next to this script)

from gpudash.collectors.allocator import AllocatorCollector, allocator_row  # noqa: E402
from gpudash.collectors.device import DeviceCollector, DeviceSampler  # noqa: E402
from gpudash.collectors.nvml import NvmlSource, ReplaySource, Unsupported  # noqa: E402
from gpudash.store.snapshot import encode_summary, summarize  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
RECORDING = next(p for p in (FIXTURES / "nvml_recording_h200.json", FIXTURES / "nvml_recording_synthetic.json")
                 if p.exists())
SECTION = "## Collectors (issue 3)"
NA = "n/a (no GPU)"


def per_call_us(fn: Callable[[], Any], n: int, repeat: int = 5) -> float:
    """Median over ``repeat`` runs of the mean µs per call."""
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def torch_cuda() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def bench_allocator(rows: list[tuple[str, str, str]]) -> None:
    torch = torch_cuda()
    if torch is None:
        rows.append(("`torch.cuda.memory_stats()` read", NA, ""))
        rows.append(("the allocator row's read (nested stats, the keys it uses)", NA, ""))
        rows.append(("`reset_peak_memory_stats()`", NA, ""))
        rows.append(("`mem_get_info()` (every ~1 s)", NA, ""))
    else:
        x = torch.empty(1 << 20, device="cuda")  # noqa: F841 - initialise the allocator
        rows.append(("`torch.cuda.memory_stats()` read", f"{per_call_us(torch.cuda.memory_stats, 2000):.1f} µs", ""))
        from gpudash.collectors.allocator import TorchAllocatorSource

        read = TorchAllocatorSource(torch).memory_stats
        rows.append(("the allocator row's read (nested stats, the keys it uses)", f"{per_call_us(read, 2000):.1f} µs",
                     "TorchAllocatorSource.memory_stats: what the training thread pays a step"))
        rows.append(("`reset_peak_memory_stats()`", f"{per_call_us(torch.cuda.reset_peak_memory_stats, 2000):.1f} µs",
                     ""))
        rows.append(("`mem_get_info()` (every ~1 s)", f"{per_call_us(torch.cuda.mem_get_info, 500):.1f} µs", ""))
    stats = {f"{k}.all.{c}": 123456789 for k in ("allocated_bytes", "reserved_bytes", "active_bytes",
                                                   "inactive_split_bytes", "requested_bytes")
             for c in ("current", "peak", "allocated", "freed")}
    stats.update(num_alloc_retries=0, num_ooms=0, num_device_alloc=3, num_device_free=1)

    class Src:
        def memory_stats(self) -> dict[str, Any]:
            return stats

        def reset_peaks(self) -> None:
            pass

        def mem_get_info(self) -> tuple[int, int]:
            return 1, 2

    class Sink:
        def memory_row(self, step: int, values: dict[str, Any]) -> None:
            pass

        def add_step_hooks(self, **kw: Any) -> None:
            pass

    col = AllocatorCollector(Src(), device_info_interval=3600)
    col.start(Sink())  # type: ignore[arg-type]
    row = {"time": 0.0}
    us = per_call_us(lambda: col.on_step_end(1, row), 20000)
    rows.append(("allocator hook, gpudash side (stats dict → memory row)", f"{us:.1f} µs",
                 f"{us / 20000 * 100:.3f} % of a 20 ms step"))
    rows.append(("`allocator_row()` alone", f"{per_call_us(lambda: allocator_row(stats), 20000):.1f} µs", ""))


def bench_nvml(rows: list[tuple[str, str, str]]) -> None:
    try:
        src = NvmlSource()
    except Unsupported as exc:
        rows.append(("NVML sample, one GPU, all supported metrics", NA, f"NVML: {exc}"))
    else:
        sampler = DeviceSampler(src, [0])
        sampler.probe()
        us = per_call_us(sampler.sample, 200)
        rows.append(("NVML sample, one GPU, all supported metrics", f"{us:.0f} µs",
                     f"metrics: {', '.join(sampler.supported[0])}"))
        src.close()
    rec = json.loads(RECORDING.read_text())
    gpus = [int(g) for g in rec["probe"]]
    src_r = ReplaySource(rec)
    sampler = DeviceSampler(src_r, gpus, pid=rec.get("pid"))
    sampler.probe()

    def one() -> None:
        if src_r.exhausted:
            src_r._i = -1
        sampler.sample()

    rows.append(("device sampler logic per tick (replay, no NVML calls)", f"{per_call_us(one, 5000):.1f} µs",
                 f"fixture {RECORDING.name}"))


def bench_sampler_share(rows: list[tuple[str, str, str]], seconds: float) -> None:
    rec = json.loads(RECORDING.read_text())
    gpus = [int(g) for g in rec["probe"]]

    class Loop(ReplaySource):
        def tick(self) -> float:
            if self.exhausted:
                self._i = -1
            return super().tick()

    from gpudash.monitor import Monitor

    with tempfile.TemporaryDirectory() as tmp:
        col = DeviceCollector(hz=20, source_factory=lambda: Loop(rec), gpus=gpus)
        with Monitor(Path(tmp) / "r", host_hz=0, device_hz=0, allocator=False, cuda_timing=False) as m:
            m.add_collector(col)
            t0 = time.perf_counter()
            time.sleep(seconds)
            wall = time.perf_counter() - t0
    share = col.busy_s / wall * 100
    rows.append(("device sampler thread at 20 Hz, replay (CPU share of one core)", f"{share:.3f} %",
                 f"{col.samples} ticks in {wall:.1f} s; real NVML adds its call cost per tick"))
    torch = torch_cuda()
    if torch is None:
        rows.append(("device sampler thread at 20 Hz, real NVML", NA, ""))


def bench_snapshot(rows: list[tuple[str, str, str]]) -> None:
    frames = [{"filename": "/home/me/train.py", "line": 10 + i, "name": "f"} for i in range(8)]
    blocks = [{"address": 1000 + i * 512, "size": 512, "requested_size": 500,
               "state": "active_allocated" if i % 3 else "inactive", "frames": frames} for i in range(200)]
    snap = {"segments": [{"address": s * (1 << 21), "total_size": 1 << 21, "blocks": blocks, "stream": 0,
                          "segment_type": "small"} for s in range(250)],
            "device_traces": [[{"action": "alloc", "addr": i, "size": 512, "stream": 0, "frames": frames,
                                "time_us": i} for i in range(20000)]]}
    nblocks = 250 * 200
    t0 = time.perf_counter()
    summary = summarize(snap)
    t1 = time.perf_counter()
    blob = encode_summary(summary)
    t2 = time.perf_counter()
    raw = len(pickle.dumps(snap))
    rows.append((f"snapshot summary ({nblocks} blocks, 20k trace entries)", f"{(t1 - t0) * 1e3:.0f} ms",
                 f"collector thread; zlib {(t2 - t1) * 1e3:.0f} ms; pickle {raw / 2**20:.1f} MiB → "
                 f"stored {len(blob) / 2**20:.2f} MiB"))
    torch = torch_cuda()
    rows.append(("`torch.cuda.memory._snapshot()` (training thread)", NA if torch is None else "see GPU script", ""))


def bench_stacks(rows: list[tuple[str, str, str]], seconds: float) -> None:
    from gpudash.collectors.stacks import StackCollector, find_py_spy

    if find_py_spy() is None:
        rows.append(("py-spy at 100 Hz: CPU-bound loop slowdown", "n/a (no py-spy)", ""))
        return

    def work() -> float:
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < seconds / 3:
            sum(range(2000))
            n += 1
        return n / (seconds / 3)

    from gpudash.monitor import Monitor

    off: list[float] = []
    on: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        c0 = os.times()
        col = StackCollector(hz=100, window_s=max(1.0, seconds))
        with Monitor(Path(tmp) / "r", host_hz=0, device_hz=0, allocator=False, cuda_timing=False) as m:
            m.add_collector(col)
            time.sleep(1.0)  # py-spy attaches
            t0 = time.perf_counter()
            for _ in range(3):
                on.append(work())
            wall = time.perf_counter() - t0 + 1.0
        c1 = os.times()
    for _ in range(3):
        off.append(work())
    spy_cpu = (c1.children_user + c1.children_system - c0.children_user - c0.children_system) / wall * 100
    slow = (1 - statistics.median(on) / statistics.median(off)) * 100
    rows.append(("py-spy at 100 Hz (--nonblocking): py-spy's own CPU", f"{spy_cpu:.1f} % of one core",
                 f"{col.samples} samples in {wall:.0f} s"))
    rows.append(("py-spy at 100 Hz: CPU-bound Python loop slowdown", f"{slow:.1f} %",
                 "median of 3 runs each; 2 cores shared with other work here, so noisy"))


def record_fixtures(out: Path, seconds: float) -> None:
    """On a GPU: a real allocator snapshot pickle and a real NVML recording, taken while a
    small model trains, into ``out`` (copy them to tests/fixtures/ as *_h200.*)."""
    import threading

    import torch

    from gpudash.collectors.device import record_nvml
    from gpudash.testing import ToyLoop

    out.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def train() -> None:
        # busy enough to show on NVML (the first H200 recording, with a 1,024-wide loop and a fresh pinned
        # 64 MiB tensor drawn on the CPU every step, saw the GPU at most 4 % busy)
        loop = ToyLoop([4096] * 9, activation=None, batch=1024, labels=None, device="cuda")
        host = torch.randn(64 << 20 >> 2).pin_memory()  # made once: the copy is the PCIe traffic, not the CPU RNG
        torch.cuda.memory._record_memory_history(max_entries=3000, stacks="python")
        step = 0
        while not stop.is_set():
            loop.bare_step()
            host.to("cuda", non_blocking=True)  # PCIe traffic for the recording
            step += 1
            if step == 20:
                torch.cuda.memory._dump_snapshot(str(out / "snapshot_h200.pickle"))
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(enabled=None)

    worker = threading.Thread(target=train)
    worker.start()
    time.sleep(2.0)  # warm up, so the recording sees a busy GPU
    from gpudash.collectors.device import resolve_nvml_index, torch_device_identity

    src = NvmlSource()
    devices = src.devices()
    src.close()
    idx = torch.cuda.current_device()
    uuid, pci = torch_device_identity(torch, idx)
    nvml = resolve_nvml_index(devices, idx, uuid=uuid, pci=pci, visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
    rec = record_nvml(out / "nvml_recording_h200.json", seconds=seconds, hz=20.0,
                      gpus=[nvml if nvml is not None else idx])
    stop.set()
    worker.join()
    print(f"wrote {out}/snapshot_h200.pickle and {out}/nvml_recording_h200.json "
          f"({len(rec['ticks'])} ticks, median NVML sample {rec.get('sample_cost_us') or 0:.0f} µs)")
    run_under_all_collectors(out / "run")


def run_under_all_collectors(run_dir: Path, steps: int = 60) -> None:
    """A short real training loop on the GPU with every collector on (stacks too, snapshots every
    20 steps, one on request) -> a run directory to commit as a sample run."""
    import torch

    from gpudash.collectors.oom import record_oom
    from gpudash.monitor import Monitor
    from gpudash.store.schema import SNAPSHOT_REQUEST_FILE
    from gpudash.testing import ToyLoop

    loop = ToyLoop([2048] * 7, activation=None, batch=128, labels=None, pin_memory=True, device="cuda")
    with Monitor(run_dir, device_hz=20, stacks_hz=20, snapshot_every=20) as m:
        m.watch(loop.model, loop.opt)
        for i in range(steps):
            with loop.step(m) as s:
                m.log(loss=s.loss)
            if i == 10:
                (run_dir / SNAPSHOT_REQUEST_FILE).write_text("")
            time.sleep(0.02)
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        try:
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as exc:
            record_oom(m, exc)
    print(f"wrote the run directory {run_dir}")


def table(rows: list[tuple[str, str, str]]) -> str:
    out = ["| what | cost | notes |", "|---|---|---|"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(out)


def write_section(text: str) -> None:
    results.write_section(SECTION, text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of the threaded measurements")
    ap.add_argument("--write", action="store_true", help="update the section in benchmarks/RESULTS.md")
    ap.add_argument("--fixtures", type=Path, default=None,
                    help="GPU only: also write a real snapshot pickle and NVML recording into this folder")
    args = ap.parse_args()
    if args.fixtures is not None:
        if torch_cuda() is None:
            print("--fixtures needs a CUDA GPU", file=sys.stderr)
            return 2
        record_fixtures(args.fixtures, args.seconds)
    rows: list[tuple[str, str, str]] = []
    bench_allocator(rows)
    bench_nvml(rows)
    bench_sampler_share(rows, args.seconds)
    bench_snapshot(rows)
    bench_stacks(rows, args.seconds)
    torch = torch_cuda()
    device = torch.cuda.get_device_name(0) if torch is not None else f"CPU only ({platform.processor() or 'cpu'})"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    text = (f"{SECTION}\n\nMeasured {time.strftime('%Y-%m-%d')} on {device}, {os.cpu_count()} cores "
            f"(load average {load:.1f} while measuring), Python {platform.python_version()}: "
            "`.venv/bin/python benchmarks/collectors.py --write`.\n\n"
            f"{table(rows)}\n")
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
