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

Then issue 46's check, ``--tries`` times with fresh workers (``--compare-workers`` over ``--compare-mb`` MB): the
workers' PSS apart from the main process's, and PSS summed over the processes against the machine's used-memory
change, the median of the tries reported; where root may make a cgroup v1 memory group, also against the
anonymous memory of a group holding only the benchmark's processes (not moved by other jobs; the group is
removed at the end).
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


_CGROUP = "/sys/fs/cgroup/memory/gpudash_procmem_bench"


def _memory_cgroup() -> str | None:
    """This process's cgroup v1 memory group (where it goes back to when the benchmark is done)."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                return os.path.join("/sys/fs/cgroup/memory", path.lstrip("/"))
    except (OSError, ValueError):
        return None
    return None


def _leave_cgroup(home: str | None) -> None:
    """Back to ``home`` and the benchmark's group removed (it is empty once the workers are gone)."""
    if home is None:
        return
    try:
        with open(os.path.join(home, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        os.rmdir(_CGROUP)
    except OSError:
        pass


def _own_cgroup() -> str | None:
    """A cgroup v1 memory group holding this process (and the workers it forks), where root may make one: its
    anonymous memory is what these processes hold, whatever the machine's other jobs do. None where not."""
    try:
        os.makedirs(_CGROUP, exist_ok=True)
        with open(os.path.join(_CGROUP, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        return None
    return _CGROUP


def _cgroup_rss(group: str | None) -> int | None:
    if group is None:
        return None
    with open(os.path.join(group, "memory.stat")) as f:
        for line in f:
            if line.startswith("total_rss "):
                return int(line.split()[1])
    return None


def _workers_try(corpus: _Corpus, workers: int, group: str | None = None) -> tuple[int, int, dict[str, float], int | None]:
    """One try: a fresh loader's workers make their copies; (PSS growth summed over the processes, the
    machine's used-memory growth, the last sample). The workers exit before it returns."""
    import psutil
    import torch.utils.data as tud

    pm = ProcMem(psutil.Process())
    time.sleep(0.5)
    before_used, before, before_cg = _used(), pm.sample(now=0.0), _cgroup_rss(group)
    loader = tud.DataLoader(corpus, batch_size=1, num_workers=workers, persistent_workers=True, prefetch_factor=1)
    it = iter(loader)
    for _ in range(2 * workers):  # every worker has made its copy
        next(it)
    time.sleep(1.0)
    pm._full.clear()
    row = pm.sample(now=100.0)
    used = _used() - before_used
    after_cg = _cgroup_rss(group)
    cg = after_cg - before_cg if after_cg is not None and before_cg is not None else None
    pss = int(row["main_pss_bytes"] + row["children_pss_bytes"] - before["main_pss_bytes"])
    del it, loader
    return pss, used, row, cg


def _comparison(args: argparse.Namespace) -> tuple[str, str]:
    """The done-when check of issue 46, ``--tries`` times: the workers' memory apart from the main process's,
    and PSS summed over the processes against the machine's used-memory change (median of the tries)."""
    corpus = _Corpus(args.compare_mb * 10**6)
    home = _memory_cgroup()
    group = _own_cgroup()
    tries = []
    try:
        for _ in range(args.tries):
            tries.append(_workers_try(corpus, args.compare_workers, group))
    finally:
        if group is not None:
            time.sleep(1.0)  # the last workers exit
            _leave_cgroup(home)
    ratios = [pss / used if used > 0 else float("nan") for pss, used, _, _ in tries]
    cg_ratios = [pss / cg for pss, _, _, cg in tries if cg]
    ok = [r for r in ratios if r == r]
    med = statistics.median(ok) if ok else float("nan")
    row = tries[-1][2]
    kids = int(row["children"])
    per = ", ".join(human_bytes(row[f"child{i}_pss_bytes"]) for i in range(kids) if f"child{i}_pss_bytes" in row)
    lines = [
        ("main process PSS (last try)", human_bytes(row["main_pss_bytes"]), "holds the corpus once"),
        (f"{kids} workers' PSS (last try)", human_bytes(row["children_pss_bytes"]), f"each: {per}"),
        ("PSS growth summed / machine's used-memory growth, each try",
         ", ".join(f"{human_bytes(p)} / {human_bytes(u)} = {r:.2f}" for (p, u, _, _), r in zip(tries, ratios, strict=True)),
         "the machine's used memory moves with the other jobs"),
        (f"median PSS / used over {len(ok)} tries", f"{med:.2f}",
         "within 10 %" if abs(med - 1) <= 0.10 else "NOT within 10 %"),
    ]
    if cg_ratios:
        lines.append(("PSS growth / the benchmark's own memory cgroup's anonymous-memory growth, each try",
                      ", ".join(f"{r:.3f}" for r in cg_ratios),
                      f"median {statistics.median(cg_ratios):.3f}: used memory of these processes only "
                      "(cgroup v1 memory.stat total_rss), not moved by the other jobs"))
    table = "| what | value | notes |\n|---|---|---|\n" + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in lines)
    return table, f"{med:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--compare-workers", type=int, default=4, help="workers of the PSS-vs-used comparison")
    ap.add_argument("--compare-mb", type=int, default=200, help="the comparison's dataset, MB (each worker a copy)")
    ap.add_argument("--tries", type=int, default=5, help="tries of the comparison (the median is reported)")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    import psutil
    import torch.utils.data as tud

    loads = [os.getloadavg()[0]]
    compare, median = _comparison(args) if args.tries > 0 else ("", "")
    loads.append(os.getloadavg()[0])
    print(compare)
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
    load = max(loads + [os.getloadavg()[0]])
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
        if compare:
            title = "## Host memory by process: workers apart, PSS against the machine's used memory (issue 46)"
            results.write_section(title, (
                f"{title}\n\nMeasured {time.strftime('%Y-%m-%d')} on CPU, {os.cpu_count()} cores, load average "
                f"{min(loads):.1f}-{load:.1f} while measuring (other jobs share the machine), Python "
                f"{platform.python_version()}: `.venv/bin/python benchmarks/procmem.py --compare-workers "
                f"{args.compare_workers} --compare-mb {args.compare_mb} --tries {args.tries} --write`. A DataLoader "
                f"with {args.compare_workers} forked workers over a {args.compare_mb} MB corpus of Python objects: "
                "each worker's reads make its own copy. Each try starts fresh workers; the machine's used memory "
                "(total - available) moves with the other jobs too, so the median of the tries is the number.\n\n"
                + compare + f"\n\nMedian PSS / used: {median}."))
    del it, loader


if __name__ == "__main__":
    main()
