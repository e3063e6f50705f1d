"""Listing a folder of 1,000 runs (issue 15): what ``gpudash serve`` does to open its runs page.

    .venv/bin/python benchmarks/many_runs.py              # print the table
    .venv/bin/python benchmarks/many_runs.py --write      # also update benchmarks/RESULTS.md

One real run (a toy MLP, 100 steps, under a Monitor) is copied ``--runs``
times. Measured, as the server does it (``page_for("/")``: the first page of
the runs list, built): the first page on a cold server (nothing in memory, an
empty on-disk summary store), the 1 s live refresh, the next page, a search
and a status filter (each run's meta table read once), a restarted server
(memory empty, the store warm), and, for comparison, summarising every run
(what ``/api/runs`` and the runs page before pagination did).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import results  # noqa: E402  benchmarks/results.py, next to this script

from gpudash.server.layouts.runs import PER_PAGE  # noqa: E402

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


def _restart(store: bool = False) -> None:
    """Forget what this process holds in memory (``store``: and the on-disk summary store)."""
    from gpudash.server.layouts import runs as page
    from gpudash.server.runcache import shared_cache
    from gpudash.store.summarystore import cache_dir, summary_store

    page._CACHE.clear()
    page._ENTRIES.clear()
    shared_cache().clear()
    folder = cache_dir()
    if store and folder is not None:
        summary_store().close()
        shutil.rmtree(folder, ignore_errors=True)
        import gpudash.store.summarystore as ss

        ss._STORE = None


def measure(runs: Path) -> dict[str, float]:
    from gpudash.server.app import create_app
    from gpudash.server.background import summariser
    from gpudash.server.layouts import runs as page
    from gpudash.server.layouts.callbacks import ReaderCache, page_for

    readers = ReaderCache(runs)
    out: dict[str, float] = {}

    def timed(key: str, fn: Any) -> Any:
        t = time.perf_counter()
        result = fn()
        out[key] = time.perf_counter() - t
        return result

    calls: list[str] = []
    real = page.run_summary
    waited: list[str] = []  # summarised while a request waited (not by the background summariser)

    def counting(run_id: str, path: Path) -> dict[str, Any]:
        calls.append(run_id)
        if threading.current_thread() is threading.main_thread():
            waited.append(run_id)
        return real(run_id, path)

    page.run_summary = counting  # type: ignore[assignment]
    _restart(store=True)
    try:
        api = create_app(runs).server.test_client()
        cold = timed("api_cold_s", lambda: api.get("/api/runs").get_json())
        out["api_pending"] = float(sum(1 for r in cold["runs"] if r.get("pending")))
        out["api_waited"] = float(len(waited))
        timed("background_s", lambda: summariser().wait(600))
        out["background_summaries"] = float(len(calls) - len(waited))
        _restart(store=True)  # the same, waiting for the whole page (as before issue 45): the ratio, same load
        sync, page.SYNC_SUMMARIES = page.SYNC_SUMMARIES, PER_PAGE
        try:
            timed("api_whole_s", lambda: api.get("/api/runs").get_json())
        finally:
            page.SYNC_SUMMARIES = sync
        _restart(store=True)
        calls.clear()
        waited.clear()
        timed("cold_s", lambda: page_for("/", "", runs, readers))
        out["cold_summaries"] = float(len(waited))
        summariser().wait(600)
        calls.clear()
        timed("refresh_s", lambda: page.list_page(runs))
        out["refresh_summaries"] = float(len(calls))
        calls.clear()
        waited.clear()
        timed("next_s", lambda: page.list_page(runs, page=1))
        out["next_summaries"] = float(len(waited))
        timed("next_background_s", lambda: summariser().wait(600))
        listing = timed("search_s", lambda: page.list_page(runs, "run0000"))
        out["search_rows"] = float(len(listing.rows))
        timed("filter_s", lambda: page.list_page(runs, None, "finished"))
        _restart()
        calls.clear()
        timed("restarted_s", lambda: page_for("/", "", runs, readers))
        out["restarted_summaries"] = float(len(calls))
        _restart()
        os.environ["GPUDASH_CACHE_DIR"] = "off"
        rows = timed("all_s", lambda: page.list_runs(runs))
        out["rows"] = float(len(rows))
    finally:
        page.run_summary = real  # type: ignore[assignment]
    return out


def table(n: int, r: dict[str, float], when: str) -> str:
    load = os.getloadavg()[0]
    return "\n".join([
        SECTION, "",
        f"{when}: {n} finished runs (a 100-step toy run, copied), {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average {load:.1f}.",
        "Command: `.venv/bin/python benchmarks/many_runs.py --write`. The runs list shows "
        f"{PER_PAGE} runs a page; only those are summarised.", "",
        "| runs list | time | note |", "|---|---|---|",
        f"| `/api/runs`, cold server | {r['api_cold_s']:.2f} s | nothing cached anywhere; "
        f"{int(r['api_waited'])} runs summarised while it waited, {int(r['api_pending'])} rows from their "
        "metadata (`pending`), the rest only stat'ed and run.json read |",
        f"| `/api/runs`, cold, waiting for the page's {PER_PAGE} summaries (as before) | {r['api_whole_s']:.2f} s | "
        f"the same request when it waited for every row's facts: {r['api_whole_s'] / r['api_cold_s']:.1f}x the "
        "time, measured in the same run |",
        f"| background summaries done | {r['background_s']:.2f} s later | {int(r['background_summaries'])} runs "
        "summarised by the background thread: the next refresh shows their facts |",
        f"| first page, cold server | {r['cold_s']:.2f} s | the page as built (`page_for`), everything cached "
        f"dropped again; {int(r['cold_summaries'])} runs summarised while it waited |",
        f"| live refresh (every 1 s) | {r['refresh_s']:.2f} s | {int(r['refresh_summaries'])} runs summarised again |",
        f"| next page | {r['next_s']:.2f} s | {int(r['next_summaries'])} of its rows summarised while it waited, "
        f"the others in the background ({r['next_background_s']:.2f} s more) |",
        f"| search by name | {r['search_s']:.2f} s | every run's meta table read once (kept), "
        f"{int(r['search_rows'])} row summarised |",
        f"| status filter | {r['filter_s']:.2f} s | meta tables already read: none read again |",
        f"| first page, restarted server | {r['restarted_s']:.2f} s | summaries from the on-disk store "
        f"(`$GPUDASH_CACHE_DIR`), {int(r['restarted_summaries'])} computed |",
        f"| every run summarised (`/api/runs`) | {r['all_s']:.1f} s | {int(r['rows'])} rows; what the runs page "
        "did before pagination (16.1 s cold) |",
    ]) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--write", action="store_true", help="update the section in benchmarks/RESULTS.md")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpudash-many-runs-") as tmp:
        os.environ["GPUDASH_CACHE_DIR"] = str(Path(tmp) / "cache")  # an empty store: the first listing is cold
        runs = make_runs(Path(tmp), args.runs)
        text = table(args.runs, measure(runs), time.strftime("%Y-%m-%d", time.gmtime()))
    print(text)
    if args.write:
        results.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
