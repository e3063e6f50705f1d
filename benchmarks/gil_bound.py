"""A training loop that holds the GIL: does the recorder keep up, and what does that cost the loop?

    .venv-bench/bin/python benchmarks/gil_bound.py [--seconds 3] [--bodies 0,50,500]

Each step is ``step + 4 phases + 8 scalars`` around a body of pure-Python work (``busy(us)``: it never lets go of
the GIL, as a pure-Python environment, tokenizer or numpy-on-small-arrays step does not). torch lets go of the GIL
inside its ops, so a real torch step is not this loop. For each body the loop runs ``--seconds`` bare, under
gpudash (defaults), under gpudash as it was before (rows inserted with ``executemany``, which lets go of the GIL
at each row, and the writer never lent the GIL: see ``gpudash.store.tables.insert_rows`` and
``gpudash.store.lending``), and beside trackio and wandb (offline) logging the same 8 scalars. Reported:
wall µs a step above bare (mean: what the loop's throughput pays; median; p99), the records still queued at the end, the most queued, those dropped,
and the growth of malloc's in-use bytes (glibc ``mallinfo2``) over the loop.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpudash.store.tables as tables
from benchmarks.overhead import busy, scalars  # the same body and scalars as overhead.py's part 1
from gpudash.collectors.host import malloc_used
from gpudash.monitor import Monitor

IN_USE = malloc_used()
MAX_STEPS = 4_000_000


def gpudash_body(mon: Monitor, us: float, i: int) -> None:
    with mon.step(samples=8, tokens=1024):
        with mon.phase("data"):
            busy(us * 0.1)
        with mon.phase("forward"):
            busy(us * 0.3)
        with mon.phase("backward"):
            busy(us * 0.4)
        with mon.phase("optimizer"):
            busy(us * 0.2)
        mon.log(**scalars(i))


def other_body(run: Any, us: float, i: int) -> None:
    busy(us)
    run.log(scalars(i))


def bare_body(_: Any, us: float, i: int) -> None:
    busy(us)
    scalars(i)


def loop(body: Callable[[Any, float, int], None], ctx: Any, us: float, seconds: float,
         queue: Callable[[], int] | None) -> dict[str, float]:
    times = np.zeros(MAX_STEPS)  # made before the first reading: the loop itself holds nothing new
    gc.collect()
    held0 = IN_USE() if IN_USE else 0
    most = 0
    end = time.perf_counter() + seconds
    i = 0
    while True:
        t0 = time.perf_counter()
        body(ctx, us, i)
        t1 = time.perf_counter()
        times[i] = t1 - t0
        i += 1
        if queue is not None and not i % 64:
            most = max(most, queue())
        if t1 > end or i == MAX_STEPS:
            break
    held = (IN_USE() - held0) if IN_USE else float("nan")
    return {"steps": i, "mean": float(times[:i].mean()), "p50": float(np.median(times[:i])), "p99": float(np.percentile(times[:i], 99)),
            "queued": queue() if queue else 0, "most": most, "held": held}


BEFORE = "gpudash as before (a SQLite call a row, never lent the GIL)"
INSERT_ROWS = tables.insert_rows


def one_row_a_call(conn: Any, table: str, cols: str, one: str, width: int, data: list[tuple[Any, ...]]) -> int:
    """How rows were inserted before, whatever the batch: ``executemany``, which lets go of the GIL at each row."""
    saved = tables.EXECUTEMANY_ROWS
    tables.EXECUTEMANY_ROWS = len(data)
    try:
        return INSERT_ROWS(conn, table, cols, one, width, data)
    finally:
        tables.EXECUTEMANY_ROWS = saved


def run_body(us: float, seconds: float, tmp: Path) -> list[tuple[str, dict[str, float]]]:
    out: list[tuple[str, dict[str, float]]] = [("bare", loop(bare_body, None, us, seconds, None))]
    for name, before in (("gpudash", False), (BEFORE, True)):
        if before:
            tables.insert_rows = one_row_a_call
        try:
            mon = Monitor(tmp / f"gpudash-{before}-{us:g}", handle_signals=False)
            rec = mon.recorder
            if before:
                rec.lender.rows = rec.lender.at = 1 << 62
            r = loop(gpudash_body, mon, us, seconds, lambda rec=rec: rec.queued)  # type: ignore[misc]
            r["dropped"] = rec.dropped
            mon.close()
        finally:
            tables.insert_rows = INSERT_ROWS
        out.append((name, r))
    try:
        os.environ["TRACKIO_DIR"] = str(tmp / "trackio")
        import trackio

        trackio.init(project="gil", name=f"body-{us:g}")
        out.append(("trackio", loop(other_body, trackio, us, seconds, None)))
        trackio.finish()
    except Exception as exc:  # noqa: BLE001
        print(f"trackio not available: {exc}")
    try:
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run = wandb.init(mode="offline", dir=str(tmp), project="gil", name=f"body-{us:g}",
                         settings=wandb.Settings(console="off"))
        out.append(("wandb (offline)", loop(other_body, run, us, seconds, None)))
        run.finish()
    except Exception as exc:  # noqa: BLE001
        print(f"wandb not available: {exc}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0, help="seconds each variant runs (default 3)")
    ap.add_argument("--bodies", default="0,50,500", help="µs of pure-Python work a step (default 0,50,500)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpudash-gil-"))
    print(f"# A loop that holds the GIL  {time.strftime('%Y-%m-%d')}  {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}\n")
    print("| body µs | logger | steps | added µs, mean | median | p99 | queued at end | most queued | dropped "
          "| malloc growth, MB |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for us in (float(b) for b in args.bodies.split(",")):
        rows = run_body(us, args.seconds, tmp)
        base = rows[0][1]
        for name, r in rows:
            queue = (f"{r['queued']:,.0f} | {r['most']:,.0f} | {r.get('dropped', 0):,.0f}" if name.startswith("gpudash")
                     else "— | — | —")
            print(f"| {us:g} | {name} | {r['steps']:,.0f} | {(r['mean'] - base['mean']) * 1e6:.1f} | "
                  f"{(r['p50'] - base['p50']) * 1e6:.1f} | "
                  f"{(r['p99'] - base['p99']) * 1e6:.1f} | {queue} | {r['held'] / 2**20:.1f} |")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
