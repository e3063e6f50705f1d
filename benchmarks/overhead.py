"""What gpudash costs the training loop, next to wandb and trackio, in one run.

    benchmarks/setup_env.sh            # once: .venv-bench with gpudash, wandb, trackio
    .venv-bench/bin/python benchmarks/overhead.py [--steps 3000] [--big-steps 1000000]

Part 1, added cost per step: a loop whose body is a fixed ~50 µs of CPU work,
bare and instrumented with (a) gpudash: step + 4 phases + 8 scalars, (b)
wandb.log of the same 8 scalars (offline), (c) trackio.log of the same 8
scalars. Added µs = percentile of the instrumented loop minus the same
percentile of the bare loop, variants interleaved in rounds so drift hits all.

Part 2, a real training step (~5 ms MLP on CPU): step-time ratio against the
bare loop, gpudash at default settings with memory-by-category on (watch).

Part 4, zero code: the same real step under ``gpudash run``'s in-process agent
(global module/optimizer hooks, backward wrapper, memory by category; what
``gpudash run -- python train.py`` installs) next to the explicit Monitor
(``with loop.step(mon)`` + watch + loss), variants interleaved in rounds.

Part 5, the microbenchmark: the same calls with no body, as CPU time of the training thread
(``time.thread_time``: a loaded machine's waits for a core or the GIL are not counted), next to wandb.log
and trackio.log of the same 8 scalars, interleaved in rounds. Goal (issue 41): gpudash <= 5 µs per step.

Part 3, the store: write throughput (records/s through Monitor.step),
bytes per step on disk, and ``load_run`` time for a run of ``--big-steps``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpudash
from gpudash.monitor import Monitor

SCALARS = ("loss", "grad_norm", "lr", "loss_scale", "tokens_per_s", "batch", "mfu", "skipped")


def busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def scalars(i: int) -> dict[str, float]:
    return {k: float(i % 97) * 0.01 + j for j, k in enumerate(SCALARS)}


# ---- instrumented loop bodies -------------------------------------------------------
def body_bare(ctx: Any, i: int) -> None:
    busy(50)


def body_gpudash(mon: Monitor, i: int) -> None:
    with mon.step(samples=8, tokens=1024):
        with mon.phase("data"):
            busy(5)
        with mon.phase("forward"):
            busy(15)
        with mon.phase("backward"):
            busy(20)
        with mon.phase("optimizer"):
            busy(10)
        mon.log(**scalars(i))


def body_wandb(run: Any, i: int) -> None:
    busy(50)
    run.log(scalars(i))


def body_trackio(tr: Any, i: int) -> None:
    busy(50)
    tr.log(scalars(i))


def timed(body: Callable[[Any, int], None], ctx: Any, n: int, start: int) -> list[float]:
    out = []
    for i in range(start, start + n):
        t0 = time.perf_counter()
        body(ctx, i)
        out.append(time.perf_counter() - t0)
    return out


def part1(steps: int, tmp: Path) -> list[tuple[str, float, float, float]]:
    variants: dict[str, tuple[Callable[[Any, int], None], Any, Callable[[], None]]] = {}
    variants["bare"] = (body_bare, None, lambda: None)
    mon = Monitor(tmp / "overhead", host_hz=1)
    variants["gpudash"] = (body_gpudash, mon, mon.close)
    try:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run = wandb.init(mode="offline", dir=str(tmp), project="bench", settings=wandb.Settings(console="off"))
        variants["wandb (offline)"] = (body_wandb, run, run.finish)
    except Exception as exc:  # noqa: BLE001
        print(f"wandb not available: {exc}")
    try:
        os.environ["TRACKIO_DIR"] = str(tmp / "trackio")
        import trackio

        trackio.init(project="bench", name="overhead")
        variants["trackio"] = (body_trackio, trackio, trackio.finish)
    except Exception as exc:  # noqa: BLE001
        print(f"trackio not available: {exc}")
    times: dict[str, list[float]] = {k: [] for k in variants}
    rounds = 10
    for r in range(rounds):
        for name, (body, ctx, _) in variants.items():
            times[name] += timed(body, ctx, steps // rounds, r * steps)
    for _, (_, _, close) in variants.items():
        close()
    base = times["bare"]
    b50, b99 = np.percentile(base, 50), np.percentile(base, 99)
    rows = []
    for name, t in times.items():
        p50, p99 = np.percentile(t, 50), np.percentile(t, 99)
        rows.append((name, (p50 - b50) * 1e6, (p99 - b99) * 1e6, p50 / b50))
    return rows


class _FloorPhase:
    __slots__ = ("_f", "_key", "_t0")

    def __init__(self, f: _Floor, key: str) -> None:
        self._f, self._key, self._t0 = f, key, 0.0

    def __enter__(self) -> _FloorPhase:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.row[self._key] = time.perf_counter() - self._t0


class _Floor:
    """The least a step + phases + log API can do in Python (part 5's floor): time and fill one dict a step."""

    def __init__(self) -> None:
        self.row: dict[str, Any] = {}
        self._phases: dict[str, _FloorPhase] = {}
        self._t0 = 0.0

    def step(self, samples: Any = None, tokens: Any = None) -> _Floor:
        return self

    def __enter__(self) -> _Floor:
        self.row = {}
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        t1 = time.perf_counter()
        self.row["duration_s"] = t1 - self._t0

    def phase(self, name: str) -> _FloorPhase:
        try:
            return self._phases[name]
        except KeyError:
            ph = self._phases[name] = _FloorPhase(self, f"{name}_s")
            return ph

    def log(self, **values: Any) -> None:
        self.row.update(values)


def part5(steps: int, tmp: Path) -> list[tuple[str, float, float]]:
    """The microbenchmark: each logger's own calls (no body), as CPU time of the training thread
    (``time.thread_time``), so the figure holds on a loaded machine (waiting for a core or the GIL is not
    counted); rounds of ``steps`` steps, loggers interleaved, median and min of the per-round µs per step."""

    def mb_gpudash(mon: Any, i: int) -> None:
        with mon.step(samples=8, tokens=1024):
            with mon.phase("data"):
                pass
            with mon.phase("forward"):
                pass
            with mon.phase("backward"):
                pass
            with mon.phase("optimizer"):
                pass
            mon.log(**scalars(i))

    def mb_other(run: Any, i: int) -> None:
        run.log(scalars(i))

    def mb_bare(ctx: Any, i: int) -> None:
        scalars(i)  # the same dict built: what each logger is handed

    floor = _Floor()

    variants: dict[str, tuple[Callable[[Any, int], None], Any, Callable[[], None]]] = {
        "bare (the scalars' dict only)": (mb_bare, None, lambda: None)}
    mon = Monitor(tmp / "micro", host_hz=1)
    variants["gpudash: step + 4 phases + 8 scalars"] = (mb_gpudash, mon, mon.close)
    # Python's own floor for the same calls: 5 context managers that read the clock and fill a dict, no more
    variants["floor: the same calls, nothing but a dict"] = (mb_gpudash, floor, lambda: None)
    try:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run = wandb.init(mode="offline", dir=str(tmp), project="bench", name="micro",
                         settings=wandb.Settings(console="off"))
        variants["wandb (offline): log of 8 scalars"] = (mb_other, run, run.finish)
    except Exception as exc:  # noqa: BLE001
        print(f"wandb not available: {exc}")
    try:
        os.environ["TRACKIO_DIR"] = str(tmp / "trackio")
        import trackio

        trackio.init(project="bench", name="micro")
        variants["trackio: log of 8 scalars"] = (mb_other, trackio, trackio.finish)
    except Exception as exc:  # noqa: BLE001
        print(f"trackio not available: {exc}")
    per: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(15):
        for name, (body, ctx, _) in variants.items():
            t0 = time.thread_time()
            for i in range(r * steps, (r + 1) * steps):
                body(ctx, i)
            per[name].append((time.thread_time() - t0) / steps * 1e6)
    for _, (_, _, close) in variants.items():
        close()
    return [(name, statistics.median(v), min(v)) for name, v in per.items()]


def part2(steps: int, tmp: Path) -> list[tuple[str, float, float]]:
    import torch

    from gpudash.testing import ToyLoop

    torch.set_num_threads(1)
    loop = ToyLoop((256, 1024, 1024, 16), activation="gelu", lr=1e-4, batch=64, labels="random", fixed_batch=True)

    def train_step(mon: Monitor | None) -> None:
        if mon is None:
            loop.bare_step()
            return
        with loop.step(mon) as s:
            mon.log(loss=s.loss, **{k: v for k, v in scalars(0).items() if k != "loss"})

    mon = Monitor(tmp / "real")
    mon.watch(loop.model, loop.opt)
    for _ in range(20):
        train_step(None)
        train_step(mon)
    bare: list[float] = []
    inst: list[float] = []
    for _ in range(10):
        for target, m in ((bare, None), (inst, mon)):
            for _ in range(steps // 10):
                t0 = time.perf_counter()
                train_step(m)
                target.append(time.perf_counter() - t0)
    mon.close()
    b = statistics.median(bare)
    return [("bare", b * 1e3, 1.0), ("gpudash (default + watch)", statistics.median(inst) * 1e3,
                                     statistics.median(inst) / b)]


def part4(steps: int, tmp: Path, widths: tuple[int, ...]) -> list[tuple[str, float, float, float]]:
    import torch

    from gpudash.testing import ToyLoop
    from gpudash.zerocode.agent import Agent

    torch.set_num_threads(1)
    loop = ToyLoop(widths, activation="gelu", lr=1e-4, batch=64, labels="random", fixed_batch=True)
    tag = "x".join(map(str, widths))
    mon = Monitor(tmp / f"explicit-{tag}", handle_signals=False)
    mon.watch(loop.model, loop.opt)
    agent = Agent(str(tmp / f"zerocode-{tag}"), {"handle_signals": False})

    def explicit() -> None:
        with loop.step(mon) as s:
            mon.log(loss=s.loss)

    def hooks_on() -> None:
        agent.install(torch)

    def hooks_off() -> None:
        agent.uninstall()  # off for the other variants; the agent keeps its Monitor and open step

    def nothing() -> None:
        pass

    variants: dict[str, tuple[Callable[[], None], Callable[[], None], Callable[[], None]]] = {
        "bare": (loop.bare_step, nothing, nothing),
        "explicit Monitor (watch + loss)": (explicit, nothing, nothing),
        "gpudash run (zero code)": (loop.bare_step, hooks_on, hooks_off),
    }
    for fn, on, off in variants.values():
        on()
        for _ in range(20):
            fn()
        off()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(10):
        for name, (fn, on, off) in variants.items():
            on()
            for _ in range(steps // 10):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            off()
    mon.close()
    agent.stop()
    b = statistics.median(times["bare"])
    return [(name, statistics.median(t) * 1e3, (statistics.median(t) - b) * 1e6, statistics.median(t) / b)
            for name, t in times.items()]


def part3(big_steps: int, tmp: Path) -> dict[str, float]:
    run_dir = tmp / "big"
    mon = Monitor(run_dir, host_hz=1, buffer_records=2_000_000)
    t0 = time.perf_counter()
    for i in range(big_steps):
        with mon.step(samples=8, tokens=1024):
            with mon.phase("data"):
                pass
            with mon.phase("forward"):
                pass
            with mon.phase("backward"):
                pass
            with mon.phase("optimizer"):
                pass
            mon.log(**scalars(i))
            mon.log_memory(params_bytes=1e8, grads_bytes=1e8, optimizer_bytes=2e8, activations_bytes=3e8 + i)
    t_loop = time.perf_counter() - t0
    mon.close()
    t_written = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in run_dir.iterdir())
    t1 = time.perf_counter()
    run = gpudash.load_run(run_dir)
    t_load = time.perf_counter() - t1
    assert len(run.steps) == big_steps and len(run.memory) == big_steps, (len(run.steps), run.problems)
    return {
        "steps": big_steps,
        "records": 2 * big_steps,
        "loop_s": t_loop,
        "write_records_per_s": 2 * big_steps / t_written,
        "bytes_per_step": size / big_steps,
        "load_run_s": t_load,
        "dropped": float(run.meta.get("dropped_records", 0)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--real-steps", type=int, default=400)
    ap.add_argument("--big-steps", type=int, default=1_000_000)
    ap.add_argument("--parts", default="1,2,3,4,5", help="which parts to run (default: all)")
    ap.add_argument("--micro-steps", type=int, default=2000, help="steps per round of part 5")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    tmp = Path(tempfile.mkdtemp(prefix="gpudash-bench-"))
    print(f"# gpudash overhead  {time.strftime('%Y-%m-%d')}  {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, python {platform.python_version()}\n")
    if "1" in parts:
        print("## 1. Added cost per step (50 µs body; step + 4 phases + 8 scalars)\n")
        print("| logger | added µs, median | added µs, p99 | step-time ratio |")
        print("|---|---:|---:|---:|")
        for name, d50, d99, ratio in part1(args.steps, tmp):
            print(f"| {name} | {d50:.1f} | {d99:.1f} | {ratio:.3f} |")
    if "2" in parts:
        print("\n## 2. Real training step (MLP, CPU, 1 thread)\n")
        print("| loop | median step ms | ratio |")
        print("|---|---:|---:|")
        for name, ms, ratio in part2(args.real_steps, tmp):
            print(f"| {name} | {ms:.2f} | {ratio:.3f} |")
    if "3" in parts:
        print(f"\n## 3. Store, {args.big_steps:,} steps (steps + memory rows)\n")
        r = part3(args.big_steps, tmp)
        print("| metric | value |")
        print("|---|---:|")
        print(f"| Monitor loop, µs per step (no work) | {r['loop_s'] / r['steps'] * 1e6:.1f} |")
        print(f"| writer throughput, records/s | {r['write_records_per_s']:,.0f} |")
        print(f"| bytes per step on disk | {r['bytes_per_step']:.0f} |")
        print(f"| load_run (steps, memory, events), s | {r['load_run_s']:.2f} |")
        print(f"| dropped records | {r['dropped']:.0f} |")
    if "4" in parts:
        print("\n## 4. Zero code (`gpudash run`) vs the explicit Monitor, same step (MLP, CPU, 1 thread)\n")
        print("| MLP | loop | median step ms | added µs | ratio |")
        print("|---|---|---:|---:|---:|")
        for widths in ((32, 64, 64, 4), (256, 1024, 1024, 16)):
            for name, ms, added, ratio in part4(args.real_steps, tmp, widths):
                print(f"| {'x'.join(map(str, widths))} | {name} | {ms:.2f} | {added:.0f} | {ratio:.3f} |")
    if "5" in parts:
        print("\n## 5. Microbenchmark: the loggers' own calls, CPU µs of the training thread per step "
              f"(15 rounds of {args.micro_steps:,}; load average {os.getloadavg()[0]:.1f})\n")
        print("| logger | µs per step, median | min |")
        print("|---|---:|---:|")
        for name, med, low in part5(args.micro_steps, tmp):
            print(f"| {name} | {med:.2f} | {low:.2f} |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
