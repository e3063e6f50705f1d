"""Listing a folder of 1,000 runs (issue 15): what ``gpudash serve`` does to open its runs page.

    .venv/bin/python benchmarks/many_runs.py              # print the table
    .venv/bin/python benchmarks/many_runs.py --write      # also update benchmarks/RESULTS.md

One real run (a toy MLP, 100 steps, under a Monitor) is copied ``--runs``
times. Measured: the first listing ever (every run loaded and summarised),
the same server listing again (summaries in memory), a restarted server
(memory empty, the on-disk summary store warm), and building the page.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import results  # noqa: E402  benchmarks/results.py, next to this script

SECTION = "## Many runs (issue 15)"


def make_runs(root: Path, n: int, steps: int = 100) -> Path:
    from gpudash.monitor import Monitor
    from gpudash.testing import ToyLoop

    seed = root / "seed"
    loop = ToyLoop(tokens_per_sample=8)
    with Monitor(seed, flush_interval=0.05, host_hz=0.0, handle_signals=False) as mon:
        mon.watch(loop.model, loop.opt)
        loop.train(mon, steps)
    runs = root / "runs"
    runs.mkdir()
    for i in range(n):
        shutil.copytree(seed, runs / f"run{i:04d}")
    return runs


def measure(runs: Path) -> dict[str, float]:
    from gpudash.layouts import runs as page

    out: dict[str, float] = {}
    t = time.perf_counter()
    rows = page.list_runs(runs)
    out["cold_s"] = time.perf_counter() - t
    t = time.perf_counter()
    rows = page.list_runs(runs)
    out["warm_s"] = time.perf_counter() - t
    page._CACHE.clear()
    t = time.perf_counter()
    rows = page.list_runs(runs)
    out["restarted_s"] = time.perf_counter() - t
    t = time.perf_counter()
    page.runs_page(runs, rows)
    out["page_s"] = time.perf_counter() - t
    out["rows"] = float(len(rows))
    return out


def table(n: int, r: dict[str, float]) -> str:
    load = os.getloadavg()[0]
    return "\n".join([
        SECTION, "",
        f"{n} finished runs (a 100-step toy run, copied), {os.cpu_count()} CPUs, load average {load:.1f}.", "",
        "| listing | time | note |", "|---|---|---|",
        f"| first listing ever | {r['cold_s']:.1f} s | every run loaded and summarised once |",
        f"| the same server again | {r['warm_s']:.2f} s | summaries in memory (any number of runs) |",
        f"| a restarted server | {r['restarted_s']:.2f} s | summaries from the on-disk store "
        "(`$GPUDASH_CACHE_DIR`) |",
        f"| building the runs page | {r['page_s']:.2f} s | {int(r['rows'])} rows |",
    ]) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--write", action="store_true", help="update the section in benchmarks/RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpudash-many-runs-") as tmp:
        os.environ["GPUDASH_CACHE_DIR"] = str(Path(tmp) / "cache")  # an empty store: the first listing is cold
        runs = make_runs(Path(tmp), args.runs)
        text = table(args.runs, measure(runs))
    print(text)
    if args.write:
        results.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
