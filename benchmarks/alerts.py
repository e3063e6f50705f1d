"""What alerts cost the training loop, and that a webhook that never answers costs it nothing more.

    python benchmarks/alerts.py [--rounds 5] [--steps 600] [--body-us 1000]

One loop body (``--body-us`` of fixed CPU work, a loss logged, a NaN every 50 steps so that alerts keep
firing: cooldown 0), under three Monitors, variants interleaved in rounds so drift hits all:

- ``off``: no alerts;
- ``on``: alerts on (the watcher thread looking every 0.5 s, terminal off, events recorded), no webhook;
- ``hanging``: alerts on and a webhook to a local receiver that accepts and never answers (timeout 2 s,
  3 retries: the sender thread is stuck the whole run, its queue fills, alerts are dropped and counted).

Prints per-step time (median, p95, p99) per variant, the difference to ``off``, what the receiver saw, the
alerts dropped, and how long ``close()`` took (bounded by one webhook timeout when alerts are still queued).

Part 2, what one look of the watcher costs (its thread holds the GIL meanwhile): ``RunWatch.look`` on a
run growing by 25 steps (with memory rows) between looks, over its full 512-row trailing window.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpudash.monitor import Monitor
from gpudash.options import AlertOptions


def busy(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


class Hanging:
    def __init__(self) -> None:
        self.attempts = 0
        self.release = threading.Event()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.attempts += 1
                outer.release.wait(600)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


def one(root: Path, variant: str, steps: int, body_us: float, url: str, r: int) -> tuple[list[float], dict[str, Any]]:
    alerts = None
    if variant != "off":
        alerts = AlertOptions(terminal=False, desktop=False, cooldown_s=0.0, timeout_s=2.0, retries=3,
                              queue_size=20, webhook=url if variant == "hanging" else None)
    mon = Monitor(root / f"{variant}-{r}", host_hz=0, handle_signals=False, alerts=alerts)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        with mon.step(samples=8):
            busy(body_us)
            mon.log(loss=float("nan") if i % 50 == 49 else 2.0 + 0.001 * (i % 7))
        times.append(time.perf_counter() - t0)
    c0 = time.perf_counter()
    mon.close()
    close_s = time.perf_counter() - c0
    from gpudash.store import load_run

    run = load_run(root / f"{variant}-{r}")
    stats = dict(run.meta.get("alerts") or {})
    run.close()
    return times, {"close_s": close_s, **stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--body-us", type=float, default=1000.0)
    a = ap.parse_args()
    hang = Hanging()
    root = Path(tempfile.mkdtemp(prefix="gpudash-alerts-bench-"))
    variants = ("off", "on", "hanging")
    times: dict[str, list[float]] = {v: [] for v in variants}
    extra: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for r in range(a.rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                t, s = one(root, v, a.steps, a.body_us, hang.url, r)
                times[v] += t[20:]  # the first steps pay imports and the writer's start
                extra[v].append(s)
    finally:
        hang.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"# alerts overhead: {platform.node()}, {platform.processor() or platform.machine()}, "
          f"python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"# {a.rounds} rounds x {a.steps} steps per variant, body {a.body_us:.0f} us, NaN every 50 steps\n")
    base = np.percentile(times["off"], [50, 95, 99]) * 1e6
    print("| variant | median µs | p95 µs | p99 µs | median − off µs | alerts raised / run | webhook dropped / run "
          "| close() s (max) |")
    print("|---|---|---|---|---|---|---|---|")
    for v in variants:
        p = np.percentile(times[v], [50, 95, 99]) * 1e6
        raised = statistics.mean(s.get("raised", 0) for s in extra[v]) if v != "off" else 0
        dropped = statistics.mean(s.get("webhook_dropped", 0) for s in extra[v]) if v == "hanging" else 0
        close = max(s["close_s"] for s in extra[v])
        print(f"| {v} | {p[0]:.0f} | {p[1]:.0f} | {p[2]:.0f} | {p[0] - base[0]:+.0f} | {raised:.1f} | {dropped:.1f} "
              f"| {close:.2f} |")
    print(f"\nhanging receiver: {hang.attempts} requests accepted, none answered")
    look_cost()


def look_cost(looks: int = 60, per_look: int = 25) -> None:
    from gpudash.alerts.watch import RunWatch
    from gpudash.analysis.alerts import FULL_EVERY_S

    root = Path(tempfile.mkdtemp(prefix="gpudash-alerts-look-"))
    try:
        mon = Monitor(root / "r", host_hz=0, handle_signals=False, flush_interval=0.05)
        watch = RunWatch(root / "r", AlertOptions(terminal=False, desktop=False))
        cost, full = [], []
        i = 0
        for n in range(looks):
            for _ in range(per_look):
                with mon.step(samples=8):
                    mon.log(loss=2.0 + 0.001 * (i % 7), lr=1e-3, grad_norm=1.0)
                    mon.log_memory(peak_bytes=1 << 30, reserved_bytes=1 << 30)
                i += 1
            mon.flush()
            every_rule = n % 2 == 1
            if every_rule:  # as every FULL_EVERY_S, or when a trigger fires
                watch._full_at = -1e9
            t0, c0 = time.perf_counter(), time.thread_time()
            watch.look()
            (full if every_rule else cost).append((time.perf_counter() - t0, time.thread_time() - c0))
        watch.close()
        mon.close()
        print()
        for what, got in (("a quiet look (new rows, no trigger)", cost), ("a look that runs every rule", full)):
            c = np.array(got[len(got) // 3:]) * 1e3  # once the window is full (512 rows)
            print(f"{what}, {per_look} new steps, 512-row window: CPU median {np.median(c[:, 1]):.1f} ms "
                  f"(p95 {np.percentile(c[:, 1], 95):.1f}), wall median {np.median(c[:, 0]):.1f} ms")
        q, f = np.median(np.array(cost)[:, 1]), np.median(np.array(full)[:, 1])
        print(f"watcher CPU at poll_s 0.5 with every rule each {FULL_EVERY_S:g} s: "
              f"{100 * (q / 0.5 + f / FULL_EVERY_S):.2f} % of one core")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
