"""How the watched process's memory grows on loops whose graphs outlive ``backward()`` (issue 41 item 2).

    python benchmarks/graph_growth.py [--steps 6000] [--batch 64] [--width 512] [--before /path/to/older/tree]

``tests/zoo/scripts/graph_loops.py`` (``retain``: ``loss.backward(retain_graph=True)`` every step;
``penalty``: a WGAN-GP gradient penalty with ``create_graph=True``), each run bare, under ``gpudash run`` with
default options, and under ``gpudash run --activations-every 1000000`` (activations measured once: what the
Monitor's own state adds). With ``--before``, also under the ``gpudash`` of an older source tree (its
``gpudash run``, default options). The script reads malloc's in-use bytes (glibc ``mallinfo2``, as gpudash's
host sampler does) after every step and prints the least-squares slope over the late half; this prints those
slopes (B/step), the steps whose activations were measured, and whether every printed loss equals the bare
run's.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "zoo" / "scripts" / "graph_loops.py"


def run(cmd: list[str], root: Path, cuda: bool = False) -> tuple[float, list[str], float, float | None]:
    """(malloc growth B/step, the printed losses, wall seconds, the CUDA allocator's growth B/step or None)"""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr[-2000:]}")
    growth = float(re.search(r"malloc growth late half B/step (-?[\d.]+)", proc.stdout).group(1))  # type: ignore[union-attr]
    on_gpu = re.search(r"cuda growth late half B/step (-?[\d.]+)", proc.stdout)
    return (growth, [line for line in proc.stdout.splitlines() if line.startswith("step ")], time.perf_counter() - t0,
            float(on_gpu.group(1)) if on_gpu else None)


def measured_steps(run_dir: Path, root: Path) -> str:
    code = ("import sys, gpudash; r = gpudash.load_run(sys.argv[1]); "
            "print(int(r.memory['activations_bytes'].notna().sum())); r.close()")
    proc = subprocess.run([sys.executable, "-c", code, str(run_dir)], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)})
    return proc.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--modes", default="retain,penalty")
    ap.add_argument("--before", type=Path, help="an older gpudash source tree to run as 'before'")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda: the loops run on the GPU and the CUDA "
                    "allocator's growth is reported beside malloc's")
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    loop = [str(SCRIPT), "--steps", str(args.steps), "--batch", str(args.batch), "--width", str(args.width),
            "--device", args.device]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            bare, losses, secs, gpu = run([sys.executable, *loop, "--mode", mode], ROOT, cuda)
            rows.append((mode, "bare", bare, gpu, "-", "-", secs))
            variants = [("gpudash run (default)", ROOT, []),
                        ("gpudash run --activations-every 1000000", ROOT, ["--activations-every", "1000000"])]
            if args.before:
                variants.append(("before: gpudash run (default)", args.before.resolve(), []))
            for i, (name, root, flags) in enumerate(variants):
                run_dir = Path(tmp) / f"{mode}-{i}"
                growth, got, secs, gpu = run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(run_dir),
                                              *flags, "--", sys.executable, *loop, "--mode", mode], root, cuda)
                rows.append((mode, name, growth, gpu, measured_steps(run_dir, root),
                             "yes" if got == losses else "NO", secs))
    print(f"# graph_growth: {args.steps} steps, batch {args.batch}, width {args.width}, {args.device}; "
          f"{platform.node()}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print()
    gpu_col = " CUDA allocated growth, late half (B/step) |" if cuda else ""
    print(f"| loop | run | malloc growth, late half (B/step) |{gpu_col} steps measured | losses = bare | wall (s) |")
    print("|---|---|---:|" + ("---:|" if cuda else "") + "---:|---|---:|")
    for mode, name, growth, gpu, measured, same, secs in rows:
        gpu_cell = f" {gpu:.0f} |" if cuda else ""
        print(f"| {mode} | {name} | {growth:.0f} |{gpu_cell} {measured} | {same} | {secs:.0f} |")


if __name__ == "__main__":
    main()
