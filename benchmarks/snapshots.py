"""Large allocator snapshots (issue 27): import time and peak memory against ``pickle.load``, and the
allocation timeline's first draw.

    .venv/bin/python benchmarks/snapshots.py                  # 100k, 400k, 1M entries; print the table
    .venv/bin/python benchmarks/snapshots.py --write          # also update benchmarks/RESULTS.md
    .venv/bin/python benchmarks/snapshots.py --sizes 100000 --repeats 1
    .venv/bin/python benchmarks/snapshots.py --sizes 400000 --frames 53   # deep stacks: a 137 MB file

Snapshots are grown from the real fixture's trace and frames (benchmarks/snapshot_gen.py; the fixture is
tests/fixtures/real-snapshot/, MIT, LICENSE beside it). Each measurement runs in a child process of its own;
its wall time and peak memory (``ru_maxrss`` of that child, from ``os.wait4``) are recorded, interleaved
(pickle.load, import, pickle.load, ...) and the median of ``--repeats`` kept, since the machine is shared.

* ``pickle.load``: ``python -c 'pickle.load(open(F, "rb"))'`` (the plain load the goal is measured against);
* ``import-snapshot``: ``python -m gpudash import-snapshot F RUN`` (everything: start-up, restricted and
  metered unpickling, summary, compression, the SQLite write);
* first draw (server side): in a fresh process, from the stored run to the timeline's figure as JSON (read
  the row, decode, trace model, timeline, figure), and a zoom to a 2,000-event window in the middle.
* ``--browser``: the run page in headless Chromium (after the runs page, so the server has started),
  navigation to ``#alloc-timeline`` drawn (its bands' bars and the merged band); the first visit (the
  server reads the snapshot) and the median of two more (its caches warm).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import results  # noqa: E402  (benchmarks/results.py)

TITLE = "## Large allocator snapshots (issue 27)"

_DRAW = r"""
import json, sys, time
t0 = time.perf_counter()
import plotly
from gpudash.server.layouts.snapshot_views import alloc_timeline_figure, load_snapshots, timeline_of
from gpudash.store.reader import RunReader
from gpudash.server.layouts.fig import wire
t1 = time.perf_counter()
maps = load_snapshots(RunReader(sys.argv[1]))
t2 = time.perf_counter()
mm = maps[-1]
fig = alloc_timeline_figure(mm)
body = json.dumps(wire(fig), cls=plotly.utils.PlotlyJSONEncoder)
t3 = time.perf_counter()
tl = timeline_of(mm)
mid = tl.events // 2
zoom = alloc_timeline_figure(mm, window=(mid - 1000, mid + 1000))
zbody = json.dumps(wire(zoom), cls=plotly.utils.PlotlyJSONEncoder)
t4 = time.perf_counter()
ztl = timeline_of(mm, (mid - 1000, mid + 1000))
print(json.dumps({"imports": t1 - t0, "read": t2 - t1, "figure": t3 - t2, "first_draw": t3 - t1, "zoom": t4 - t3,
                  "bytes": len(body), "zoom_bytes": len(zbody), "bands": len(tl.bands), "events": tl.events,
                  "zoom_bands": len(ztl.bands), "zoom_sampled": len(ztl.x), "entries": len(mm.trace)}))
"""


def _child(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one child process."""
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    err = proc.stderr.read() if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {err.strip()[-400:]}")
    return wall, usage.ru_maxrss / 1024.0, out


#: --head-start: also time a first visit after gpudash serve's head start
HEAD_START = False
#: --frames: each trace entry's stack padded to this many frames (0: the fixture's own, ~3)
FRAMES = 0


def measure(n: int, work: Path, repeats: int, env: dict[str, str], browser: bool) -> dict[str, Any]:
    # written by a child: a forked child's peak RSS starts at its parent's, so this process stays small
    snap = work / f"snapshot-{n}.pickle"
    _child([sys.executable, "-c", "import sys; from snapshot_gen import write_snapshot; from pathlib import Path; "
            "write_snapshot(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))", str(n), str(snap), str(FRAMES)],
           {**env, "PYTHONPATH": f"{env['PYTHONPATH']}{os.pathsep}{Path(__file__).resolve().parent}"})
    loads: list[tuple[float, float]] = []
    imports: list[tuple[float, float]] = []
    run = work / "serve" / f"run-{n}"
    run.parent.mkdir(exist_ok=True)
    for r in range(repeats):
        loads.append(_child([sys.executable, "-c", "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))",
                             str(snap)], env)[:2])
        target = work / f"run-{n}-{r}"
        imports.append(_child([sys.executable, "-m", "gpudash", "import-snapshot", str(snap), str(target)], env)[:2])
        if r == 0:
            target.rename(run)
        else:
            subprocess.run(["rm", "-rf", str(target)], check=True)
    draws = [json.loads(_child([sys.executable, "-c", _DRAW, str(run)], env)[2]) for _ in range(repeats)]
    out: dict[str, Any] = {
        "entries": n, "file_mb": snap.stat().st_size / 1e6, "run_mb": sum(p.stat().st_size for p in run.iterdir()) / 1e6,
        "load_s": statistics.median(w for w, _ in loads), "load_mib": statistics.median(m for _, m in loads),
        "import_s": statistics.median(w for w, _ in imports), "import_mib": statistics.median(m for _, m in imports),
        "draw": {k: statistics.median(d[k] for d in draws) for k in draws[0]},
    }
    if browser:
        out["browser_s"] = _browser_draw(work, run)
        if HEAD_START:
            out["head_start"] = _browser_draw(work, run, head_start=True)
    snap.unlink()
    return out


def _browser_draw(work: Path, run: Path, visits: int = 3, head_start: bool = False) -> list[float] | None:
    """Seconds from navigation to ``#alloc-timeline`` drawn (its bars: the bands; and the merged band's fill) in
    headless Chromium, for each of ``visits`` navigations: the first finds the server's caches cold (the
    snapshot read and decoded, its timeline worked out), the others warm (None without Chromium). With
    ``head_start`` the server starts as ``gpudash serve`` does (the newest run's snapshots decoded while no one
    asks) and the first navigation waits until that is done: the first visit of someone who opens the page a
    few seconds after starting the server; ``[warm-up seconds, visits...]``."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not Path("/usr/bin/chromium").exists():
        return None
    from gpudash.server.app import serve_in_thread
    from gpudash.server.layouts import snapshot_views

    snapshot_views._SNAP_CACHE.clear()
    snapshot_views._FIGURES.clear()
    started = time.perf_counter()
    url, stop = serve_in_thread(run.parent, "127.0.0.1", 0, head_start=head_start)
    warmed: list[float] = []
    if head_start:
        while time.perf_counter() - started < 120 and not snapshot_views._FIGURES:
            time.sleep(0.05)
        warmed.append(time.perf_counter() - started)
    opts = Options()
    opts.binary_location = "/usr/bin/chromium"
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"):
        opts.add_argument(a)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    drawn_js = ("return document.querySelectorAll('#alloc-timeline .barlayer .point path').length > 0 &&"
                " document.querySelectorAll('#alloc-timeline .scatterlayer .trace path.js-fill').length > 0")
    times: list[float] = []
    try:
        # the server's own start first (its deferred imports, the compressed plotly bundle): the runs page,
        # then the run page timed from navigation (its snapshot read, the timeline, the figure, the drawing)
        driver.get(url)
        t = time.perf_counter()
        while time.perf_counter() - t < 120 and not driver.execute_script(
                "return document.querySelectorAll('a[href*=\"/run/\"]').length"):
            time.sleep(0.05)
        for _ in range(visits):
            driver.get("about:blank")
            t = time.perf_counter()
            driver.get(url + "run/" + run.name)
            while time.perf_counter() - t < 120 and not driver.execute_script(drawn_js):
                time.sleep(0.02)
            times.append(time.perf_counter() - t)
        return warmed + times
    finally:
        driver.quit()
        stop()


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| trace entries | pickle | `pickle.load`: time, peak | `import-snapshot`: time, peak | ratio (time, memory) "
             "| stored | first draw (server): read + figure | zoom to 2,000 events | in Chromium: first visit (again) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["draw"]
        b = r.get("browser_s")
        chrome = (f"{b[0]:.2f} s (again: {statistics.median(b[1:]):.2f} s)" if len(b) > 1 else f"{b[0]:.2f} s") \
            if b else "not run"
        lines.append(
            f"| {r['entries']:,} | {r['file_mb']:.0f} MB | {r['load_s']:.2f} s, {r['load_mib']:.0f} MiB "
            f"| {r['import_s']:.2f} s, {r['import_mib']:.0f} MiB "
            f"| {r['import_s'] / r['load_s']:.2f}x, {r['import_mib'] / r['load_mib']:.2f}x | {r['run_mb']:.1f} MB "
            f"| {d['first_draw']:.2f} s ({d['read']:.2f} + {d['figure']:.2f}; {d['bands']:.0f} bands, "
            f"{d['bytes'] / 1e3:.0f} kB) | {d['zoom']:.2f} s ({d['zoom_bands']:.0f} bands, every event) | {chrome} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 400_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--browser", action="store_true", help="also time the first draw in headless Chromium")
    ap.add_argument("--write", action="store_true", help="update benchmarks/RESULTS.md")
    ap.add_argument("--head-start", action="store_true",
                    help="with --browser: also time the first visit after the server's head start (gpudash serve)")
    ap.add_argument("--frames", type=int, default=0,
                    help="pad each entry's stack to N frames with shared native frames (53: the 137 MB file at 400k)")
    args = ap.parse_args()
    global HEAD_START, FRAMES
    HEAD_START = args.head_start
    FRAMES = args.frames
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory(prefix="gpudash-snapbench-") as tmp:
        rows = [measure(n, Path(tmp), args.repeats, env, args.browser) for n in args.sizes]
    text = table(rows)
    print(text)
    for r in rows:
        if r.get("head_start"):
            h = r["head_start"]
            print(f"{r['entries']:,} entries, after the head start ({h[0]:.2f} s from the server's start): "
                  f"first visit {h[1]:.2f} s, again {statistics.median(h[2:]):.2f} s")
    if args.write:
        machine = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        results.write_section(TITLE, f"{TITLE}\n\n{dt.date.today()}, {machine}; "
                              f"`{' '.join(['benchmarks/snapshots.py', *sys.argv[1:]])}` "
                              f"(median of {args.repeats}, each in a child process).\n\n{text}\n")


if __name__ == "__main__":
    main()
