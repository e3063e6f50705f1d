"""Dashboard benchmarks (issue 4): live latency, first render of a huge run, cost of open tabs.

    .venv/bin/python benchmarks/dashboard.py            # print the table
    .venv/bin/python benchmarks/dashboard.py --write    # also update benchmarks/RESULTS.md

1. Live latency: a real Monitor trains a small MLP in this process; ``gpudash
   serve`` runs in a subprocess; headless Chromium opens the run page and a
   MutationObserver timestamps every change of ``#last-step``. Latency = the
   time the browser showed step N minus the step's own end time (``steps.time``,
   same clock). It includes the writer's flush interval and the page's poll.
2. First render of a run with 1,000,000 steps and 2,000,000 device samples.
   That run is written straight through ``gpudash.store.writer.Recorder`` (a
   store benchmark for the writing part: no training loop produces a million
   steps in a benchmark's time). Measured: server-side page build, and
   navigation to every graph drawn in Chromium; plus the largest trace sent.
3. Training step time with 0 and with 5 tabs open on the live run.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import results  # benchmarks/results.py, next to this script

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Dashboard (issue 4)"
sys.path.insert(0, str(ROOT / "tests"))  # its helpers (tests/helpers/browser.py: the Chromium)

OBSERVE = """
window.__seen = [];
const el = document.getElementById('last-step');
new MutationObserver(() => window.__seen.push([el.textContent, Date.now() / 1000]))
  .observe(el, {childList: true, subtree: true, characterData: true});
"""
ALL_DRAWN = """
const ids = arguments[0];
return ids.every(id => { const g = document.querySelector('#' + id + ' .js-plotly-plot');
  return g && g._fullLayout && g.querySelector('.main-svg'); });
"""
MAX_TRACE = """
let m = 0;
document.querySelectorAll('.js-plotly-plot').forEach(g => (g.data || []).forEach(t => {
  const n = t.x ? t.x.length : 0; if (n > m) m = n; }));
return m;
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(runs_dir: Path) -> tuple[str, subprocess.Popen[bytes]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpudash", "serve", str(runs_dir), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return url, proc
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("gpudash serve did not start")


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


class Trainer(threading.Thread):
    """A small MLP under a real Monitor, stepping until stopped; records its step times."""

    def __init__(self, run_dir: Path, pace_s: float = 0.03) -> None:
        super().__init__(daemon=True)
        self.run_dir = run_dir
        self.pace_s = pace_s
        self.stop_flag = threading.Event()
        self.durations: list[tuple[float, float]] = []  # (end time, compute seconds)

    def run(self) -> None:
        import torch

        from gpudash.monitor import Monitor
        from gpudash.testing import ToyLoop

        torch.set_num_threads(1)
        loop = ToyLoop((256, 512, 10), activation="gelu", lr=1e-3, batch=64, tokens_per_sample=16)
        with Monitor(self.run_dir, name="bench-live") as mon:
            mon.watch(loop.model, loop.opt)
            while not self.stop_flag.is_set():
                t0 = time.perf_counter()
                with loop.step(mon) as s:
                    mon.log(loss=s.loss)
                dt = time.perf_counter() - t0
                self.durations.append((time.time(), dt))
                time.sleep(max(0.0, self.pace_s - dt))


def live_latency(driver: Any, work: Path, seconds: float, tabs: int) -> dict[str, Any]:
    """Phase A: training with the server up and no page open. Phase B: ``tabs`` tabs on the run page
    (the watched one last, in front); latency from that tab, step times from both phases."""
    from gpudash.store import load_run

    runs_dir = work / "live"
    runs_dir.mkdir()
    url, proc = serve(runs_dir)
    trainer = Trainer(runs_dir / "run")
    try:
        trainer.start()
        while not (runs_dir / "run" / "rank0.db").exists():
            time.sleep(0.05)
        time.sleep(2.0)
        t_a = time.time()
        time.sleep(seconds)
        base = [d for t, d in trainer.durations if t > t_a]
        for i in range(tabs):
            if i:
                driver.switch_to.new_window("tab")
            driver.get(url + "run/run")
            wait(lambda: driver.find_elements("id", "last-step"), 60)
        driver.execute_script(OBSERVE)
        time.sleep(2.0)
        t_b = time.time()
        time.sleep(seconds)
        with_tabs = [d for t, d in trainer.durations if t > t_b]
        seen = driver.execute_script("return window.__seen")
        for h in driver.window_handles[1:]:
            driver.switch_to.window(h)
            driver.close()
        driver.switch_to.window(driver.window_handles[0])
    finally:
        trainer.stop_flag.set()
        trainer.join(30)
        proc.terminate()
        proc.wait(10)
    steps = load_run(runs_dir / "run").steps.set_index("step")["time"]
    lat = []
    for text, t_seen in seen:
        if text.isdigit() and int(text) in steps.index:
            lat.append(t_seen - float(steps.loc[int(text)]))
    return {"latencies": lat, "base": base, "with_tabs": with_tabs, "tabs": tabs}


def wait(fn: Any, timeout: float) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            v = fn()
        except Exception:  # noqa: BLE001 - still loading
            v = None
        if v:
            return v
        time.sleep(0.05)
    raise TimeoutError("timed out")


def write_big_run(run_dir: Path, steps: int, device_samples: int) -> float:
    """A long run through the Recorder: ``steps`` step + memory rows, ``device_samples`` device rows."""
    import numpy as np

    from gpudash.store.writer import Recorder

    t0 = time.perf_counter()
    rec = Recorder(run_dir, flush_interval=3600, capacity=400_000,
                   meta={"name": "big-1M", "device": "cuda:0", "device_name": "synthetic H100",
                         "device_capacity_bytes": 80 * 2**30, "created_at": 1.7e9})
    rng = np.random.default_rng(0)
    start, step_s = 1.7e9, 0.1
    batch = 100_000
    dev_per_step = device_samples / steps
    for lo in range(0, steps, batch):
        n = min(batch, steps - lo)
        dur = (step_s + 0.01 * rng.standard_normal(n)).tolist()
        loss = (3.0 * np.exp(-np.arange(lo, lo + n) / 3e5) + 0.05 * rng.random(n)).tolist()
        for i in range(n):
            s = lo + i
            t = start + s * step_s
            rec.put("steps", {"step": s, "time": t, "duration_s": dur[i], "forward_s": 0.03, "backward_s": 0.05,
                              "optimizer_s": 0.015, "data_s": 0.005, "samples": 32, "tokens": 32 * 1024,
                              "loss": loss[i]})
            rec.put("memory", {"step": s, "time": t, "params_bytes": 2e9, "grads_bytes": 2e9,
                               "optimizer_bytes": 8e9, "activations_bytes": 30e9 + 1e9 * ((s % 1000) / 1000),
                               "allocated_bytes": 42e9 + 1e9 * ((s % 1000) / 1000), "reserved_bytes": 50e9})
        rec.flush(timeout=3600)
        k0, k1 = int(lo * dev_per_step), int((lo + n) * dev_per_step)
        for k in range(k0, k1):
            rec.put("device", {"time": start + k * step_s / dev_per_step, "gpu": 0, "sm_active_pct": 80.0,
                               "pcie_tx_mib_s": 100.0, "power_w": 500.0, "temp_c": 60.0})
        rec.flush(timeout=3600)
    rec.close()
    return time.perf_counter() - t0


def first_render(driver: Any, work: Path, steps: int, device_samples: int) -> dict[str, Any]:
    from gpudash.server.layouts.pages import build_run_page
    from gpudash.server.layouts.run_page import LIVE_GRAPHS
    from gpudash.store.reader import RunReader

    runs_dir = work / "big"
    runs_dir.mkdir()
    write_s = write_big_run(runs_dir / "big", steps, device_samples)
    reader = RunReader(runs_dir / "big")
    t = time.perf_counter()
    build_run_page("big", reader)
    build_s = time.perf_counter() - t
    reader.close()
    url, proc = serve(runs_dir)
    try:
        t = time.perf_counter()
        driver.get(url)  # cold: the runs page computes the run's summary; also warms the script cache
        wait(lambda: driver.find_elements("css selector", "#runs-table tbody tr"), 120)
        runs_page_s = time.perf_counter() - t
        times, firsts = [], []
        for _ in range(5):
            driver.get("about:blank")
            t = time.perf_counter()
            driver.get(url + "run/big")
            wait(lambda: driver.execute_script(ALL_DRAWN, ["memory-graph"]), 120)
            firsts.append(time.perf_counter() - t)
            wait(lambda: driver.execute_script(ALL_DRAWN, [g for g in LIVE_GRAPHS if g != "host-graph"]), 120)
            times.append(time.perf_counter() - t)
        max_trace = int(driver.execute_script(MAX_TRACE))
    finally:
        proc.terminate()
        proc.wait(10)
    return {"write_s": write_s, "build_s": build_s, "render_s": statistics.median(times), "render_all": times,
            "first_s": statistics.median(firsts),
            "max_trace": max_trace, "runs_page_s": runs_page_s}


def table(live: dict[str, Any] | None, big: dict[str, Any] | None, args: argparse.Namespace) -> str:
    load = os.getloadavg()[0]
    lines = [SECTION, "",
             f"Measured {time.strftime('%Y-%m-%d')} on CPU only, {os.cpu_count()} cores (load average {load:.1f}), "
             f"Python {platform.python_version()}, headless Chromium: `.venv/bin/python benchmarks/dashboard.py "
             f"{' '.join(sys.argv[1:])}`. Server polls every 500 ms; the Monitor flushes every 500 ms (defaults).", "",
             "| what | result | goal | notes |", "|---|---|---|---|"]
    if live:
        lat = live["latencies"]
        if lat:
            lines.append(f"| record written → visible in browser, p50 | {1e3 * pct(lat, 0.5):.0f} ms |  | "
                         f"{len(lat)} updates of `#last-step` over {args.live_seconds:.0f} s, {live['tabs']} tabs open |")
            lines.append(f"| record written → visible in browser, p95 | {1e3 * pct(lat, 0.95):.0f} ms | ≤ 1500 ms | "
                         "from the step's end time (includes flush + poll + render) |")
        b, w = live["base"], live["with_tabs"]
        if b and w:
            mb, mw = statistics.median(b), statistics.median(w)
            lines.append(f"| training step time, {live['tabs']} tabs open vs none | {100 * (mw / mb - 1):+.1f} % "
                         f"| < 5 % | median compute per step {1e3 * mb:.2f} → {1e3 * mw:.2f} ms over "
                         f"{len(b)} / {len(w)} steps; the browser and the server share these 2 cores with "
                         "training (elsewhere the browser is on another machine) |")
    if big:
        lines += [
            f"| first render, run page of {args.big_steps:,} steps + {args.device_samples:,} device samples "
            f"| {big['render_s']:.2f} s (best {min(big['render_all']):.2f} s) | < 3 s | navigation → every graph "
            f"drawn in Chromium, median of 5 "
            f"({', '.join(f'{t:.2f}' for t in big['render_all'])} s) |",
            f"| same run, first graph (memory map) drawn | {big['first_s']:.2f} s |  | median of 5 |",
            f"| server-side page build, same run | {big['build_s']:.2f} s |  | roll-ups (60 s buckets) + MinMax-LTTB |",
            f"| largest trace sent to the browser | {big['max_trace']:,} points | ≤ ~5,000 |  |",
            f"| runs page with that run, cold | {big['runs_page_s']:.2f} s |  | SQL aggregates, then cached |",
            f"| writing that run through `Recorder` | {big['write_s']:.0f} s |  | a store benchmark: "
            "synthetic rows put straight into the writer, not a training loop |",
        ]
    return "\n".join(lines)


def write_section(text: str) -> None:
    results.write_section(SECTION, text)


def main() -> int:
    ap = argparse.ArgumentParser(description="gpudash dashboard benchmarks")
    ap.add_argument("--live-seconds", type=float, default=20.0)
    ap.add_argument("--tabs", type=int, default=5)
    ap.add_argument("--big-steps", type=int, default=1_000_000)
    ap.add_argument("--device-samples", type=int, default=2_000_000)
    ap.add_argument("--skip-live", action="store_true")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--write", action="store_true", help="update the section in benchmarks/RESULTS.md")
    args = ap.parse_args()
    from helpers.browser import make_driver

    work = Path(tempfile.mkdtemp(prefix="gpudash-bench-"))
    driver = make_driver()
    try:
        live = None if args.skip_live else live_latency(driver, work, args.live_seconds, args.tabs)
        big = None if args.skip_big else first_render(driver, work, args.big_steps, args.device_samples)
    finally:
        driver.quit()
        shutil.rmtree(work, ignore_errors=True)
    text = table(live, big, args)
    print(text)
    if args.write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
