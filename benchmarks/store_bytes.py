"""Bytes a logger writes to disk per training step: gpudash beside wandb (offline), tensorboardX and trackio.

    benchmarks/setup_env.sh                          # once: .venv-bench with gpudash and the peers
    .venv-bench/bin/python benchmarks/store_bytes.py [--seconds 60] [--rate 12] [--tools gpudash,wandb,...]

Each tool runs the same loop in a process of its own: ~``--rate`` steps per second, each a real
small MLP step on the CPU with 4 phases (data, forward, backward, optimizer) and 3 scalars (loss,
lr, grad_norm). gpudash records it with ``watch()`` and the host sampler on (its defaults); the
peers log the same 7 numbers per step (the 4 phase times and the 3 scalars). Measured from outside:
block-level bytes written (``write_bytes`` of ``/proc/<pid>/io``, summed over the process and its
children, polled every 50 ms; and the reaped children's ``ru_oublock``), which counts a page of the
page cache each time it is dirtied after it was last written back: what reaches the disk, not what
``write()`` was called with. Columns:

* per step: bytes from the first step stored to the end, close included, over the steps after the first;
* steady: bytes per step from 15 s in to the last step (no start, no close);
* before the first step: from process start (after imports) until the first step is stored
  (gpudash: ``Monitor.flush``; tensorboardX: ``flush``; wandb and trackio have no flush: their first
  ``log`` returned);
* largest WAL: the largest ``*-wal`` file seen in the tool's folder (SQLite write-ahead logs: gpudash,
  trackio).

Runs are interleaved with nothing else of ours, but the machine may be shared: page-cache writeback
timing (``vm.dirty_expire_centisecs``) shapes these numbers, and the table prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("gpudash", "wandb", "tensorboardX", "trackio")

CHILD = r'''
import json, os, sys, time
tool, out, seconds, rate = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
def io():
    for line in open("/proc/self/io"):
        if line.startswith("write_bytes"):
            return int(line.split()[1])
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
if tool == "gpudash":
    from gpudash.monitor import Monitor
    mon = Monitor(os.path.join(out, "run"), handle_signals=False)
    mon.watch(model, opt)
elif tool == "wandb":
    os.environ["WANDB_SILENT"] = "true"
    import wandb
    run = wandb.init(mode="offline", dir=out, project="bytes", settings=wandb.Settings(console="off"))
elif tool == "tensorboardX":
    from tensorboardX import SummaryWriter
    tb = SummaryWriter(os.path.join(out, "tb"))
elif tool == "trackio":
    os.environ["TRACKIO_DIR"] = out
    import trackio
    trackio.init(project="bytes", name="bytes")
print("READY", io(), flush=True)
period = 1.0 / rate
t0 = time.perf_counter()
i = 0
while time.perf_counter() - t0 < seconds:
    phases = {}
    if tool == "gpudash":
        with mon.step(samples=32):
            with mon.phase("data"):
                x = torch.randn(32, 64)
            with mon.phase("forward"):
                loss = model(x).square().mean()
            with mon.phase("backward"):
                loss.backward()
            with mon.phase("optimizer"):
                opt.step(); opt.zero_grad()
            mon.log(loss=loss.detach(), lr=1e-3, grad_norm=1.0)
    else:
        a = time.perf_counter(); x = torch.randn(32, 64)
        b = time.perf_counter(); loss = model(x).square().mean()
        c = time.perf_counter(); loss.backward()
        d = time.perf_counter(); opt.step(); opt.zero_grad()
        e = time.perf_counter()
        row = {"data_s": b - a, "forward_s": c - b, "backward_s": d - c, "optimizer_s": e - d,
               "loss": float(loss), "lr": 1e-3, "grad_norm": 1.0}
        if tool == "wandb":
            run.log(row, step=i)
        elif tool == "tensorboardX":
            for k, v in row.items():
                tb.add_scalar(k, v, i)
        elif tool == "trackio":
            trackio.log(row, step=i)
    i += 1
    if i == 1:
        if tool == "gpudash":
            mon.flush()
        elif tool == "tensorboardX":
            tb.flush()
        print("FIRST", io(), flush=True)
    if i % 60 == 0:
        print("STEP", i, time.perf_counter() - t0, flush=True)
    pause = t0 + i * period - time.perf_counter()
    if pause > 0:
        time.sleep(pause)
print("LAST", i, time.perf_counter() - t0, flush=True)
if tool == "gpudash":
    mon.close()
elif tool == "wandb":
    run.finish()
elif tool == "tensorboardX":
    tb.close()
elif tool == "trackio":
    trackio.finish()
print("DONE", i, flush=True)
'''


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc, no psutil needed)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _write_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("write_bytes"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _largest_wal(folder: Path) -> int:
    best = 0
    for p in folder.rglob("*-wal"):
        try:
            best = max(best, p.stat().st_size)
        except OSError:
            pass
    return best


def measure(tool: str, python: str, seconds: float, rate: float) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"bytes-{tool}-", dir=os.environ.get("BYTES_DIR") or None))
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock
    proc = subprocess.Popen([python, "-c", CHILD, tool, str(out), str(seconds), str(rate)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    seen: dict[int, int] = {}  # pid -> last write_bytes seen
    marks: dict[str, Any] = {}
    wal = 0

    def total() -> int:
        for p in _tree(proc.pid):
            b = _write_bytes(p)
            if b is not None:
                seen[p] = b
        return sum(seen.values())

    steady_at: tuple[int, int] | None = None
    while True:
        now = total()
        wal = max(wal, _largest_wal(out))
        while not lines.empty():
            word, *rest = lines.get().split() or [""]
            if word == "READY":
                marks["ready"], marks["ready_self"] = now, int(rest[0])
            elif word == "FIRST":
                marks["first"], marks["first_self"] = total(), int(rest[0])
            elif word == "STEP" and steady_at is None and float(rest[1]) >= 15:
                steady_at = (int(rest[0]), now)
            elif word == "LAST":
                marks["last"] = (int(rest[0]), now)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    err = proc.stderr.read() if proc.stderr else ""
    if proc.returncode:
        raise RuntimeError(f"{tool} failed ({proc.returncode}): {err[-2000:]}")
    reaped = (resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock - before) * 512
    end = max(total(), reaped)
    ready = marks.get("ready", 0)
    steps, last = marks["last"]
    # the process's own count at its marks is exact; the tree's (polled) adds its children's
    first = max(marks["first"] - ready, marks["first_self"] - marks["ready_self"])
    res = {"tool": tool, "steps": steps, "first": first, "wal": wal,
           "per_step": (end - marks["first"]) / max(1, steps - 1), "total": end - ready,
           "steady": (last - steady_at[1]) / max(1, steps - steady_at[0]) if steady_at else float("nan"),
           "rate": steps / seconds}
    return res


def _kb(n: float) -> str:
    return f"{n / 1024:,.2f} KiB" if n < 10 * 1024 else f"{n / 1024:,.0f} KiB"


def table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    try:
        expire = Path("/proc/sys/vm/dirty_expire_centisecs").read_text().strip()
    except OSError:
        expire = "?"
    lines = [f"Measured {time.strftime('%Y-%m-%d %H:%M')} UTC, {os.cpu_count()} cores (load average "
             f"{os.getloadavg()[0]:.1f}), Python {platform.python_version()}, `vm.dirty_expire_centisecs` {expire}: "
             f"`{Path(sys.executable).parent.parent.name}/bin/python benchmarks/store_bytes.py "
             f"{' '.join(sys.argv[1:])}`.", "",
             "| tool | steps/s | per step | steady per step | before the first step | largest WAL | whole run |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['tool']} | {r['rate']:.1f} | {_kb(r['per_step'])} | {_kb(r['steady'])} | "
                     f"{_kb(r['first'])} | {_kb(r['wal']) if r['wal'] else '—'} | {_kb(r['total'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=12.0, help="steps per second")
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    results = []
    for tool in args.tools.split(","):
        try:
            r = measure(tool, sys.executable, args.seconds, args.rate)
        except Exception as exc:  # noqa: BLE001 - a peer that is not installed is a line, not a crash
            print(f"{tool}: not measured ({str(exc).splitlines()[-1] if str(exc) else type(exc).__name__})")
            continue
        results.append(r)
        print(json.dumps(r), flush=True)
    print(table(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
