"""What a resumed attempt costs on disk: bytes per step of attempt 1 and of attempt 2 (whose rows carry
``attempt``) recorded into the same run folder, and the time a new attempt's start takes.

    .venv/bin/python benchmarks/resume_bytes.py [--steps 3000]

One process records ``--steps`` steps (loss, lr, samples; host sampler off) into a temporary run folder, closes,
then opens it again with ``resume=True`` and records as many more. Bytes are the size of ``rank0.db`` and its log
after each close; "start" is the Monitor's construction (reading the previous attempt included), after a warm-up
run in another folder.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

from gpudash.monitor import Monitor


def _size(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("rank0.db*"))


def _attempt(run_dir: Path, start: int, steps: int) -> float:
    t0 = time.perf_counter()
    mon = Monitor(run_dir, flush_interval=0.5, host_hz=0.0, handle_signals=False, resume=start > 0)
    began = time.perf_counter() - t0
    with mon:
        for i in range(start, start + steps):
            with mon.step(step=start if i == start else None, samples=8):
                mon.log(loss=1.0 / (i + 1), lr=1e-3)
    return began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3000)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        _attempt(Path(tmp) / "warm-up", 0, 10)  # imports and first-use costs out of the timed starts
        s1 = _attempt(run_dir, 0, args.steps)
        a = _size(run_dir)
        s2 = _attempt(run_dir, args.steps, args.steps)
        b = _size(run_dir)
    print(f"{platform.node()} {platform.processor() or platform.machine()}, {args.steps} steps per attempt")
    print("| attempt | bytes/step on disk | start (ms) |")
    print("|---|---|---|")
    print(f"| 1 | {a / args.steps:.0f} | {1e3 * s1:.0f} |")
    print(f"| 2 (resumed, `attempt` on every row) | {(b - a) / args.steps:.0f} | {1e3 * s2:.0f} |")


if __name__ == "__main__":
    main()
