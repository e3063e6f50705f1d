"""Chromium draw time of the segment map of the real snapshot (../shared/fixtures/real-snapshot), as built,
against the same figure with Plotly's automargin turned back on (what it was before its margins were fixed).

    .venv/bin/python benchmarks/segment_map.py

Prints a table: median of 5 draws after one warm-up each, in one headless Chromium, plotly-cartesian as served.
"""

from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from gpudash.server.layouts.fig import wire
from gpudash.server.layouts.memory import segment_map_figure
from gpudash.store.snapshot import load_snapshot

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT.parent / "shared" / "fixtures" / "real-snapshot" / "cs336_assignment2_memory_snapshot.pickle"
mm = load_snapshot(SNAPSHOT)
built = json.loads(json.dumps(wire(segment_map_figure(mm))))
auto = copy.deepcopy(built)  # the figure as it was: margins grown by Plotly
for ax in ("xaxis", "yaxis"):
    auto["layout"].setdefault(ax, {})["automargin"] = True
auto["layout"]["margin"] = {"l": 60, "r": 30, "t": 74, "b": 36}
plotly_js = (ROOT / "gpudash/server/layouts/vendor/plotly-cartesian.min.js").read_text()
html = Path("/tmp/gpudash-segment-map-bench.html")
html.write_text(f"<html><body><div id=g style='width:1200px'></div><script>{plotly_js}</script></body></html>")
opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for a in ("--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
    opts.add_argument(a)
d = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
JS = """const f = arguments[0]; const done = arguments[arguments.length - 1];
const g = document.getElementById('g'); Plotly.purge(g);
const t0 = performance.now();
Plotly.newPlot(g, f.data, f.layout).then(() => requestAnimationFrame(() => done(performance.now() - t0)));"""
try:
    d.get(html.as_uri())
    out: dict[str, list[float]] = {}
    for name, f in (("fixed margins (as built)", built), ("automargin (before)", auto)) * 6:
        out.setdefault(name, []).append(d.execute_async_script(JS, f))
    print(f"segment map of the real snapshot ({len(mm.segments)} segments, {len(built['data'])} traces)\n")
    print("| figure | draw, median of 5 (ms) | first draw (ms) |\n|---|---:|---:|")
    for name, v in out.items():
        print(f"| {name} | {statistics.median(v[1:]):.1f} | {v[0]:.1f} |")
finally:
    d.quit()
