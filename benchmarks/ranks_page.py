"""A 64-rank run's Ranks section in headless Chromium (issue 34): how long until it names the straggler, and
how long ``/api/runs/<id>/summary`` takes to answer (and whether it names it too).

    .venv/bin/python benchmarks/ranks_page.py                  # print the table
    .venv/bin/python benchmarks/ranks_page.py --write          # also update benchmarks/RESULTS.md

The run: 64 ranks on 8 nodes, 2,000 steps each, written through the store's Recorder; rank 7's backward is
4x the others' (its steps take 2.7x as long). The dashboard serves it in this process (``serve_in_thread``);
each visit is a fresh navigation to the run page (the server's reader cache warm after the first), timed
from ``driver.get`` until the Ranks section (``#ranks-view``: its lights, top stragglers, table) says ``rank 7``,
scrolled into view as soon as it is there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import results  # noqa: E402  (benchmarks/results.py)

TITLE = "## Ranks section of a 64-rank run in Chromium (issue 34)"
RANKS, STEPS, SLOW = 64, 2000, 7


def record(run_dir: Path, ranks: int = RANKS, steps: int = STEPS, slow: int = SLOW) -> None:
    """``ranks`` ranks of ``steps`` steps; rank ``slow``'s backward takes 4x the others'."""
    from gpudash.store.meta import write_run_meta
    from gpudash.store.writer import Recorder

    run_dir.mkdir(parents=True)
    write_run_meta(run_dir, {"name": run_dir.name, "world_size": ranks})
    for r in range(ranks):
        rec = Recorder(run_dir, rank=r, meta={"node": f"node{r // 8:02d}", "world_size": ranks, "local_rank": r % 8})
        for step in range(steps):
            data, fwd = 0.01, 0.02
            bwd = 0.04 * (4 if r == slow else 1) + 0.0003 * ((r * 7 + step) % 5)
            rec.put("steps", {"step": step, "time": 1000.0 + step * 0.2, "duration_s": data + fwd + bwd,
                              "data_s": data, "forward_s": fwd, "backward_s": bwd, "samples": 8, "loss": 2.0})
        rec.close()


def _driver() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(a)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)


_NAMED = ("const v = document.getElementById('ranks-view');"
          "if (v && !window.__scrolled) { v.scrollIntoView(); window.__scrolled = true; }"
          "return v ? v.innerText : null;")


def visit(driver: Any, url: str, timeout: float = 120.0) -> float:
    """Seconds from navigation until the Ranks section names rank ``SLOW``."""
    t0 = time.perf_counter()
    driver.get(url)
    while time.perf_counter() - t0 < timeout:
        text = driver.execute_script(_NAMED)
        if text and f"rank {SLOW} " in text:
            return time.perf_counter() - t0
        time.sleep(0.05)
    raise SystemExit(f"the Ranks section did not name rank {SLOW} within {timeout:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    args = ap.parse_args()
    from gpudash.server.app import serve_in_thread

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        record(root / "r64")
        url, stop = serve_in_thread(root, "127.0.0.1", 0)
        driver = _driver()
        try:
            api: list[float] = []
            named: list[str] = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                with urllib.request.urlopen(url + "api/runs/r64/summary", timeout=300) as resp:
                    body = json.load(resp)
                api.append(time.perf_counter() - t0)
                named = [f"rank {r}" for r in body["facts"]["rank_stragglers"]]
            page = [visit(driver, url + "run/r64") for _ in range(args.repeats)]
        finally:
            driver.quit()
            stop()
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    lines = [f"64 ranks x {STEPS} steps, rank {SLOW}'s backward 4x; {args.repeats} visits, served in this process; "
             f"load average {load} on {os.cpu_count()} cores",
             "", "| what | first (s) | median (s) |", "|---|---:|---:|",
             f"| `/api/runs/r64/summary` (names: {', '.join(named) or 'nobody'}) | {api[0]:.2f} | "
             f"{statistics.median(api):.2f} |",
             f"| run page until the Ranks section names rank {SLOW} | {page[0]:.2f} | {statistics.median(page):.2f} |"]
    table = "\n".join(lines)
    print(table)
    if args.write:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        results.write_section(TITLE, f"{TITLE}\n\n{platform.node()}, {stamp}, "
                                     f"`.venv/bin/python benchmarks/ranks_page.py --write`\n\n{table}\n")


if __name__ == "__main__":
    main()
