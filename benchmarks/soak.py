"""Soak: does gpudash keep growing state in the process it watches?

    .venv/bin/python benchmarks/soak.py [--steps 100000] [--every 1000]

A tiny training loop (a 16-16-1 MLP, SGD, one CPU thread) runs ``--steps`` steps twice at the same time: bare
(``python loop.py``) and under ``gpudash run`` with default options and alerts on (host sampling at 1 Hz, the
leak watch, the alert watcher, memory by category with activations measured by the default rule). Every
``--every`` steps the loop itself prints malloc's in-use bytes (glibc's ``mallinfo2`` through ctypes, as the
host collector reads it) and its RSS. The table shows both processes side by side; the growth lines are
least-squares slopes in bytes per step over the early window (10 %-50 % of the steps) and the late one
(50 %-100 %). Goal (issue 41): the monitored process's late malloc growth <= 64 B/step (64 MB a million steps).

Each sample is one reading: the writer's backlog (up to one flush interval of records, ~0.5 s) rides on it as
noise of up to a few hundred KB, which the slope over many samples averages out.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

LOOP = r'''
import ctypes, os, sys, time
import torch


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


mallinfo2 = ctypes.CDLL(None).mallinfo2
mallinfo2.restype = MallInfo2
PAGE = os.sysconf("SC_PAGE_SIZE")


def used():
    m = mallinfo2()
    return m.uordblks + m.hblkhd


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


steps, every = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(8, 16), torch.randn(8, 1)
t0 = time.perf_counter()
for i in range(steps):
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    if (i + 1) % every == 0:
        print(f"soak {i + 1} {used()} {rss()} {time.perf_counter() - t0:.3f}", flush=True)
print(f"loss {loss.item():.6f}", flush=True)
'''


def _read(out: str) -> tuple[np.ndarray, str]:
    rows = [[float(x) for x in line.split()[1:]] for line in out.splitlines() if line.startswith("soak ")]
    loss = next((line for line in out.splitlines() if line.startswith("loss ")), "")
    return np.array(rows, dtype=float).reshape(-1, 4), loss


def slope(rows: np.ndarray, col: int, lo: float, hi: float) -> float:
    """Least-squares growth in bytes per step of column ``col`` over steps in [lo, hi]."""
    sel = rows[(rows[:, 0] >= lo) & (rows[:, 0] <= hi)]
    if len(sel) < 2:
        return float("nan")
    return float(np.polyfit(sel[:, 0], sel[:, col], 1)[0])


def run(steps: int, every: int, work: Path, tree: Path) -> tuple[np.ndarray, np.ndarray, dict[str, object]]:
    loop = work / "loop.py"
    loop.write_text(LOOP)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    py = sys.executable
    run_dir = work / "run"
    cmds = {
        "bare": [py, str(loop), str(steps), str(every)],
        "gpudash": [py, "-m", "gpudash", "run", "--run-dir", str(run_dir), "--alert", "desktop=false", "--",
                    py, str(loop), str(steps), str(every)],
    }
    procs = {k: subprocess.Popen(c, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k, c in cmds.items()}
    outs = {}
    for k, p in procs.items():
        out, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"{k} failed ({p.returncode}):\n{err[-3000:]}")
        outs[k] = (out, err)
    bare, bare_loss = _read(outs["bare"][0])
    mon, mon_loss = _read(outs["gpudash"][0])
    info: dict[str, object] = {"same_loss": bare_loss == mon_loss, "loss": bare_loss, "stderr": outs["gpudash"][1]}
    sys.path.insert(0, str(ROOT))
    import gpudash

    r = gpudash.load_run(run_dir)
    try:
        info["recorded_steps"] = len(r.steps)
        info["dropped_records"] = r.meta.get("dropped_records", 0)
        info["host_samples"] = len(r.host)
        info["events"] = r.events["kind"].value_counts().to_dict() if len(r.events) else {}
    finally:
        r.close()
    return bare, mon, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=1000, help="steps between two readings")
    ap.add_argument("--rows", type=int, default=20, help="rows of the table (the readings are thinned to these)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the gpudash source tree to run (default: this one)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpudash-soak-"))
    load0 = os.getloadavg()
    t0 = time.time()
    try:
        bare, mon, info = run(args.steps, args.every, work, args.tree)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()
    n = min(len(bare), len(mon))
    print(f"# gpudash soak  {time.strftime('%Y-%m-%d %H:%M', time.gmtime(t0))} UTC  "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}; "
          f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; {time.time() - t0:.0f} s\n")
    print(f"{args.steps:,} steps, a reading every {args.every:,}; bare and `gpudash run --alert desktop=false` "
          f"(default options) side by side\n")
    print("| step | bare malloc MiB | bare RSS MiB | gpudash malloc MiB | gpudash RSS MiB | malloc, gpudash - bare MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    mib = 1 << 20
    for i in sorted(set(np.linspace(0, n - 1, min(args.rows, n)).astype(int))):
        b, m = bare[i], mon[i]
        print(f"| {int(b[0]):,} | {b[1] / mib:.2f} | {b[2] / mib:.2f} | {m[1] / mib:.2f} | {m[2] / mib:.2f} | "
              f"{(m[1] - b[1]) / mib:.2f} |")
    half, early = args.steps / 2, args.steps / 10
    print("\n| growth, B/step | bare malloc | bare RSS | gpudash malloc | gpudash RSS |")
    print("|---|---:|---:|---:|---:|")
    for name, lo, hi in (("early (10 %-50 %)", early, half), ("late (50 %-100 %)", half, args.steps)):
        print(f"| {name} | {slope(bare, 1, lo, hi):.1f} | {slope(bare, 2, lo, hi):.1f} | "
              f"{slope(mon, 1, lo, hi):.1f} | {slope(mon, 2, lo, hi):.1f} |")
    late = slope(mon, 1, half, args.steps) - slope(bare, 1, half, args.steps)
    print(f"\nlate malloc growth, gpudash - bare: {late:.1f} B/step (goal <= 64: {'met' if late <= 64 else 'NOT met'})")
    print(f"seconds for {args.steps:,} steps: bare {bare[-1, 3]:.1f}, gpudash {mon[-1, 3]:.1f}")
    print(f"recorded steps {info['recorded_steps']:,}, dropped records {info['dropped_records']}, host samples "
          f"{info['host_samples']}, events {info['events']}; same final loss: {info['same_loss']} ({info['loss']})")


if __name__ == "__main__":
    main()
