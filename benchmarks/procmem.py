"""What a host-memory-by-process sample costs, and whether PSS adds up (issue 46).

    .venv/bin/python benchmarks/procmem.py            # print the table
    .venv/bin/python benchmarks/procmem.py --write    # also update benchmarks/RESULTS.md

A torch DataLoader with ``--workers`` workers (forked, as on Linux by default) over a dataset of Python
objects of ``--mb`` MB, as a script holding a tokenized corpus in a list would: each worker's reads touch the
objects' reference counts, so copy-on-write gives each worker its own copy. Measured: one full sample (every
process's USS/PSS read: ``smaps_rollup``), a sample between the budgeted reads (RSS only), the walk of
``/proc`` that lists the children, and the PSS summed over the processes against the machine's used memory
(total - available) before and after the workers made their copies. Other jobs on the machine move its used
memory too: read the last row as an order of magnitude on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import results  # noqa: E402  (benchmarks/results.py, next to this script)

from gpudash.collectors.procmem import BUDGET, ProcMem  # noqa: E402
from gpudash.units import human_bytes  # noqa: E402


class _Corpus:
    """``n`` Python ``bytes`` objects of 4 KiB each (a tokenized corpus held as a list)."""

    def __init__(self, nbytes: int) -> None:
        self.items = [os.urandom(4096) for _ in range(nbytes // 4096)]

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        total = 0
        for b in self.items:  # touches every object's refcount: the worker's pages become its own
            total += len(b)
        return total


def _used() -> int:
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.total - vm.available)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    import psutil
    import torch.utils.data as tud

    corpus = _Corpus(args.mb * 10**6)
    pm = ProcMem(psutil.Process())
    before_used, before = _used(), pm.sample(now=0.0)
    before_pss = before["main_pss_bytes"]
    loader = tud.DataLoader(corpus, batch_size=1, num_workers=args.workers, persistent_workers=True,
                            prefetch_factor=1)
    it = iter(loader)
    for _ in range(2 * args.workers):  # every worker has made its copy
        next(it)
    time.sleep(1.0)
    full, cached = [], []
    for i in range(5):
        pm._full.clear()  # every process due: a full sample
        t0 = time.perf_counter()
        row = pm.sample(now=100.0 + i)
        full.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        pm.sample(now=100.0 + i)
        cached.append(time.perf_counter() - t0)
    scans = []
    for _ in range(5):
        t0 = time.perf_counter()
        psutil.Process().children(recursive=True)
        scans.append(time.perf_counter() - t0)
    after_used = _used()
    pss = row["main_pss_bytes"] + row["children_pss_bytes"] - before_pss
    used = after_used - before_used
    ms = lambda xs: f"{1e3 * statistics.median(xs):.2f} ms"  # noqa: E731
    load = os.getloadavg()[0]
    rows = [
        (f"full sample: main + {int(row['children'])} workers' USS/PSS", ms(full),
         f"median of 5; each process {human_bytes(row['children_pss_bytes'] / max(row['children'], 1))} PSS"),
        ("sample between USS/PSS reads (RSS, /dev/shm)", ms(cached), "median of 5"),
        ("list the children (walk of /proc)", ms(scans), f"at most every 5 s; {len(psutil.pids())} processes"),
        ("USS/PSS reads, share of one core (all processes)", f"<= {BUDGET:.0%}",
         f"of n processes, one read in c s is read again after n c / {BUDGET:g} s: here each about every "
         f"{statistics.median(full) / BUDGET:.1f} s"),
        ("PSS growth summed over the processes", human_bytes(pss), f"{args.workers} workers over a "
                                                                   f"{args.mb} MB corpus"),
        ("machine's used memory growth (total - available)", human_bytes(used),
         f"PSS / used = {pss / used:.2f}" if used > 0 else "used memory fell (other jobs)"),
    ]
    table = "| what | cost | notes |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows)
    print(table)
    if args.write:
        head = (f"## Host memory by process (issue 46)\n\nMeasured {time.strftime('%Y-%m-%d')} on CPU, "
                f"{os.cpu_count()} cores (load average {load:.1f} while measuring), Python "
                f"{platform.python_version()}: `.venv/bin/python benchmarks/procmem.py --workers "
                f"{args.workers} --mb {args.mb} --write`.\n\n")
        results.write_section("## Host memory by process (issue 46)", head + table)
    del it, loader


if __name__ == "__main__":
    main()
