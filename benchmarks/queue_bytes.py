"""What a queued step row holds in the watched process, and what the writer spends storing it.

    .venv/bin/python benchmarks/queue_bytes.py [--rows 100000]

A Monitor's step rows (step + 4 phases + 8 scalars + samples + tokens: 17 values) are queued while the writer
is held (a stalled disk, or a loop that holds the GIL), then stored in one flush. Reported: the bytes a queued
row adds, as Python's allocations count them (``tracemalloc``: every object, the small ones Python's own allocator
keeps in its mmap'd arenas included) and as malloc's in-use bytes (glibc ``mallinfo2``, which do not see those
arenas: a row held as small ``bytes`` objects reads 0 there), and the writer's CPU µs a row for the flush
(``thread_time`` of the thread that runs it). Run it in two trees (e.g. a ``git worktree`` of the commit before) to compare: the
script imports the gpudash of the tree it sits in.
"""

from __future__ import annotations

import argparse
import gc
import platform
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.overhead import scalars
from gpudash.collectors.host import malloc_used
from gpudash.monitor import Monitor

IN_USE = malloc_used()


def steps(mon: Monitor, n: int) -> None:
    """``n`` steps of the microbenchmark's body: step + 4 phases + 8 scalars."""
    for i in range(n):
        with mon.step(samples=8, tokens=1024):
            for ph in ("data", "forward", "backward", "optimizer"):
                with mon.phase(ph):
                    pass
            mon.log(**scalars(i))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000, help="step rows queued (default 100,000)")
    args = ap.parse_args()
    n = args.rows
    with tempfile.TemporaryDirectory() as tmp:
        mon = Monitor(Path(tmp) / "q", host_hz=0, leak_poll_s=0, buffer_records=n + 1000)
        rec = mon.recorder
        held = rec._flush_once
        rec._flush_once = lambda **kw: None  # type: ignore[method-assign]  # the writer stores nothing
        steps(mon, 200)  # warm-up: the row's keys, the phases, the first blocks
        gc.collect()
        before = IN_USE() if IN_USE else 0
        tracemalloc.start()
        traced = tracemalloc.get_traced_memory()[0]
        steps(mon, n)
        gc.collect()
        per_traced = (tracemalloc.get_traced_memory()[0] - traced) / n
        tracemalloc.stop()
        per_row = (IN_USE() - before) / n if IN_USE else float("nan")
        queued = rec.queued if hasattr(rec, "queued") else len(rec._buf)  # (the tree before the step log)
        t0 = time.thread_time()
        held(everything=True)
        per_store = (time.thread_time() - t0) / max(queued, 1) * 1e6
        rec._flush_once = held  # type: ignore[method-assign]
        mon.close()
    print(f"{platform.machine()}, python {platform.python_version()}, {n:,} rows")
    print("| queued rows | bytes held a row (tracemalloc) | of them malloc's (mallinfo2) | writer CPU µs a row stored |")
    print("|---:|---:|---:|---:|")
    print(f"| {queued:,} | {per_traced:,.0f} | {per_row:,.0f} | {per_store:.2f} |")


if __name__ == "__main__":
    main()
