"""First paint against trackio and TensorBoard (issue 18): cold server, fresh browser, time to the loss chart.

    benchmarks/setup_env.sh                                  # once: .venv-bench with trackio, tensorboard(X)
    .venv/bin/python benchmarks/first_paint.py               # 10,000 and 1,000,000 steps, median of 3
    .venv/bin/python benchmarks/first_paint.py --quick       # smoke run: 10,000 steps, 1 repeat
    .venv/bin/python benchmarks/first_paint.py --write       # also update benchmarks/RESULTS.md

One run, recorded by all three tools: ``--steps`` steps with 8 scalars, the
loss with one ×8 spike at a known step. gpudash writes it through its real
writer (``Recorder``: step rows with phases and the scalars, a memory row and
a device sample per step); trackio logs the same values with ``trackio.log``;
TensorBoard reads them from ``tensorboardX``'s event writer (one event per
step holding the 8 scalars, as merged summaries do). The scalars are named so
that the loss sorts first: trackio and TensorBoard lay their charts out by
name, TensorBoard draws only the cards scrolled into view. The peers run in
``.venv-bench`` (subprocesses); the written runs are kept in a temp folder for
the whole invocation (or in ``--keep DIR``, reused by the next invocation).

Each measurement (median of ``--repeats``): a fresh headless Chromium is
started first, then the tool's server process is launched cold; once its
port answers and it has printed its URL (what a user waits for; gpudash's
port answers 500 until its app is built), the browser opens the page. A
script injected before the page's own polls every animation frame for the
loss chart being drawn (a per-tool DOM condition, ``paint_page.TOOLS``) and
stamps ``performance.now()``. ``--gpudash-src DIR`` serves another gpudash
tree (e.g. a clone of main, for before/after numbers).
Reported: process launch → chart drawn, navigation → chart drawn, the bytes
the browser received until then (Resource Timing ``transferSize`` of the
document and of every resource that ended before the chart was drawn: bytes
on the wire, so a compressed response counts compressed), and whether the
spike is drawn. Then a gpudash breakdown: server start, the document and
``_dash-layout``, the ``_dash-update-component`` round-trips, the largest
callback response, the browser's share after the loss figure arrived, graphs
drawn in the first screen, and ``run_facts`` on the cold run.

The run and its writers are in ``paint_run.py``, the servers, pages and
browser in ``paint_page.py``; this file is the command and the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from paint_page import GPUDASH_SRC, TOOLS, bytes_until, measure, spike_verdict
from paint_run import BENCH_VENV, ROOT, RUN, spike_value, write_all

SECTION = "## First paint (issue 18)"


# ---- the gpudash breakdown ---------------------------------------------------------------------------------
def gpudash_breakdown(page: dict[str, Any]) -> dict[str, Any]:
    """Where the time to the loss chart goes, from the browser's own timings of one page load."""
    drawn = page["drawn"]
    res = page["resources"]
    nav = page["nav"]
    out: dict[str, Any] = {
        "port_s": page["t_port"] - page["t_launch"],
        "ready_s": page["t_ready"] - page["t_launch"],
        "doc_ms": nav["end"] - nav["start"], "doc_ttfb_ms": nav["res"] - nav["req"], "doc_bytes": nav["transfer"],
    }
    layout = [r for r in res if "_dash-layout" in r["name"]]
    out["layout_ms"] = layout[0]["end"] - layout[0]["start"] if layout else None
    out["layout_bytes"] = layout[0]["transfer"] if layout else None
    scripts = [r for r in res if r["type"] == "script" and r["end"] <= drawn]
    out["scripts"], out["script_bytes"] = len(scripts), sum(r["transfer"] for r in scripts)
    out["scripts_done_ms"] = max((r["end"] for r in scripts), default=None)
    out["last_script"] = max(scripts, key=lambda r: r["end"])["name"].split("?")[0].rsplit("/", 1)[-1] if scripts else ""
    calls = [r for r in res if "_dash-update-component" in r["name"] and r["end"] <= drawn]
    out["calls"] = len(calls)
    out["calls_ms"] = sum(r["end"] - r["start"] for r in calls)
    out["calls_bytes"] = sum(r["transfer"] for r in calls)
    out["first_call_ms"] = min((r["start"] for r in calls), default=None)
    every = [r for r in res if "_dash-update-component" in r["name"]]
    out["largest_response_bytes"] = max((r["decoded"] for r in every), default=0)
    out["largest_response_wire"] = max(every, key=lambda r: r["decoded"])["transfer"] if every else 0
    # what each round-trip before the chart was for: the fetch wrapper saw its outputs, matched by start time
    detail = []
    for r in sorted(calls, key=lambda r: r["start"]):
        call = min(page["calls"], key=lambda c: abs(c["t0"] - r["start"]), default=None)
        what = _outputs(call["output"]) if call is not None else "?"
        detail.append(f"{what}: {r['end'] - r['start']:.0f} ms, {fmt_bytes(r['transfer'])}, in at "
                      f"{r['end'] / 1e3:.2f} s")
    out["calls_detail"] = "; ".join(detail)
    out["drawn_ms"] = drawn
    out["browser_after_last_ms"] = drawn - max((r["end"] for r in calls), default=drawn)
    out["browser_after_largest_ms"] = drawn - max(calls, key=lambda r: r["decoded"])["end"] if calls else None
    snap = page.get("snap") or {}
    out["graphs_drawn"] = snap.get("graphs")
    out["graphs_first_screen"] = snap.get("graphs_first_screen")
    out["graph_slots"] = snap.get("graph_slots")
    out["loss_first_screen"] = snap.get("loss_first_screen")
    settled = page.get("settled")
    if settled:
        ends = [r["end"] for r in settled["resources"]]
        out["settled_s"] = (settled["origin"] + max(ends, default=0.0)) / 1e3 - page["t_launch"]
        out["settled_bytes"] = bytes_until(settled, float("inf"))
        out["settled_graphs"] = settled["settled_graphs"]
    return out


def _outputs(output: Any) -> str:
    """``..page.children...url.search..`` -> ``page.children, url.search`` (a callback's outputs, short)."""
    parts = [p for p in str(output).strip(".").split("...") if p]
    return ", ".join(parts[:3]) + (f" +{len(parts) - 3}" if len(parts) > 3 else "")


FACTS_COLD = """
import json, statistics, sys, time
import gpudash
from gpudash.analysis.facts import run_facts
from gpudash.store.run import load_run
loads, facts = [], []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); run = load_run(sys.argv[1]); loads.append(time.perf_counter() - t)
    t = time.perf_counter(); run_facts(run); facts.append(time.perf_counter() - t)
print(json.dumps([statistics.median(loads), statistics.median(facts), gpudash.__file__]))
"""


def facts_cold(run_dir: Path, repeats: int, src: Path) -> tuple[float, float]:
    """(load_run s, run_facts s) on a freshly loaded run, medians, with the gpudash of ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", FACTS_COLD, str(run_dir), str(repeats)], env=env, check=True,
                         capture_output=True, text=True, cwd=src).stdout  # -c puts the working directory first
    load_s, facts_s, where = json.loads(out.strip().splitlines()[-1])
    if not Path(where).resolve().is_relative_to(src.resolve()):
        raise RuntimeError(f"measured the gpudash in {where}, not the one in {src}")
    return float(load_s), float(facts_s)


def git_commit(src: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=src, capture_output=True,
                          text=True).stdout.strip() or str(src)


# ---- the table ---------------------------------------------------------------------------------------------
def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    if n >= 1e6:
        return f"{n / 1e6:.2f} MB"
    return f"{n / 1e3:.0f} kB"


def fmt_s(s: float | None) -> str:
    return "n/a" if s is None else f"{s:.2f} s"


def fmt_ms(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:.0f} ms"


def ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or b is None or b <= 0 else f"{a / b:.2f}×"


def median_or_none(values: Iterable[float | None]) -> float | None:
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else None


def summarize(pages: list[dict[str, Any]], tool: str, spike: float) -> dict[str, Any]:
    drawn = [p for p in pages if p.get("drawn") is not None]
    verdicts = [spike_verdict(tool, p, spike) for p in pages]
    answers = sorted({v for v, _ in verdicts})
    return {
        "runs": len(pages), "drawn": len(drawn),
        "launch": median_or_none(p.get("launch_to_drawn_s") for p in pages),
        "launch_all": [p.get("launch_to_drawn_s") for p in pages],
        "nav": median_or_none(p["drawn"] / 1e3 for p in drawn),
        "ready": median_or_none(max(p["t_port"], p["t_ready"]) - p["t_launch"] for p in pages),
        "bytes": median_or_none(p.get("bytes") for p in drawn),
        "first_screen": median_or_none((p.get("snap") or {}).get("loss_first_screen") for p in drawn),
        "spike": "/".join(answers), "spike_why": verdicts[0][1] if verdicts else "",
        "browser": pages[0].get("browser", "?") if pages else "?",
        "reloads": [p.get("reloads", 0) for p in pages],
    }


def versions() -> dict[str, str]:
    out = {}
    code = ("import importlib.metadata as m\nfor p in ('trackio', 'tensorboard', 'tensorboardX'):\n"
            "    try: print(p, m.version(p))\n    except Exception: print(p, 'missing')")
    try:
        text = subprocess.run([str(BENCH_VENV / "bin" / "python"), "-c", code], capture_output=True, text=True,
                              timeout=60).stdout
        out.update(line.split(" ", 1) for line in text.splitlines() if " " in line)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return out


def table(results: dict[int, dict[str, Any]], args: argparse.Namespace, env: dict[str, Any]) -> str:
    v = env["versions"]
    lines = [SECTION, ""] + ([args.note.strip(), ""] if args.note.strip() else []) + [
             f"Measured {env['date']} on CPU only, {os.cpu_count()} cores, load average {env['load_start']} at the "
             f"start and {env['load_end']} at the end (the machine is shared with other work: timings are noisy, "
             f"compare the tools within one run), Python {platform.python_version()}, headless Chromium "
             f"{env['browser']}, gpudash at `{env['commit']}`, trackio {v.get('trackio', '?')}, TensorBoard "
             f"{v.get('tensorboard', '?')} (tensorboardX {v.get('tensorboardX', '?')}): "
             f"`.venv/bin/python benchmarks/first_paint.py {' '.join(sys.argv[1:])}`. Median of {args.repeats}, each "
             "with a cold server and a fresh browser; the run: 8 scalars per step, the loss ×8 at one step.", "",
             "| steps | tool | process launch → loss chart drawn | navigation → drawn | server ready after | "
             "bytes to the browser by then | loss chart in the first screen | spike drawn |",
             "|---|---|---|---|---|---|---|---|"]
    for steps, res in results.items():
        for tool, r in res["tools"].items():
            runs = ", ".join("—" if t is None else f"{t:.2f}" for t in r["launch_all"])
            if any(r["reloads"]):
                runs += "; page reloaded " + "/".join(str(n) for n in r["reloads"]) + " times"
            fs = r["first_screen"]
            lines.append(f"| {steps:,} | {TOOLS[tool].label} | {fmt_s(r['launch'])} ({runs}) | {fmt_s(r['nav'])} | "
                         f"{fmt_s(r['ready'])} | {fmt_bytes(r['bytes'])} | "
                         f"{'n/a' if fs is None else 'yes' if fs >= 0.5 else 'no'} | {r['spike']}: {r['spike_why']} |")
    lines += ["", "gpudash against the others (gpudash / other; below 1× gpudash is ahead):", "",
              "| steps | time vs trackio | bytes vs trackio | time vs TensorBoard | bytes vs TensorBoard |",
              "|---|---|---|---|---|"]
    for steps, res in results.items():
        t = res["tools"]
        g, tr, tb = t.get("gpudash", {}), t.get("trackio", {}), t.get("tensorboard", {})
        lines.append(f"| {steps:,} | {ratio(g.get('launch'), tr.get('launch'))} | {ratio(g.get('bytes'), tr.get('bytes'))} "
                     f"| {ratio(g.get('launch'), tb.get('launch'))} | {ratio(g.get('bytes'), tb.get('bytes'))} |")
    lines += ["", "Where gpudash's time goes (medians; times from the process launch unless said):", "",
              "| what | " + " | ".join(f"{s:,} steps" for s in results) + " |",
              "|---|" + "---|" * len(results)]
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("server process start → port open; → URL printed", lambda b: f"{fmt_s(b.get('port_s'))}; "
         f"{fmt_s(b.get('ready_s'))}"),
        ("document `GET /run/…`: time, bytes",
         lambda b: f"{b['doc_ms']:.0f} ms (first byte {b['doc_ttfb_ms']:.0f} ms), {fmt_bytes(b['doc_bytes'])}"),
        ("`_dash-layout`: time, bytes", lambda b: "n/a" if b.get("layout_ms") is None else
         f"{b['layout_ms']:.0f} ms, {fmt_bytes(b['layout_bytes'])}"),
        ("scripts before the chart: count, bytes, the last one in (after navigation)",
         lambda b: f"{b['scripts']}, {fmt_bytes(b['script_bytes'])}, {b['last_script']} at "
                   f"{fmt_ms(b['scripts_done_ms'])}"),
        ("`_dash-update-component` round-trips before the chart: count, time summed, bytes",
         lambda b: f"{b['calls']}, {b['calls_ms'] / 1e3:.2f} s, {fmt_bytes(b['calls_bytes'])}"),
        ("those round-trips: outputs, time, bytes, response in at (after navigation)",
         lambda b: b.get("calls_detail") or "none"),
        ("browser: the largest of them (the figures) received → loss chart drawn; the last → drawn",
         lambda b: f"{fmt_ms(b.get('browser_after_largest_ms'))}; {fmt_ms(b.get('browser_after_last_ms'))}"),
        ("largest callback response (JSON; on the wire)",
         lambda b: f"{fmt_bytes(b['largest_response_bytes'])}; {fmt_bytes(b['largest_response_wire'])}"),
        ("graphs drawn when the loss chart is: in the first screen / all / graphs on the page",
         lambda b: f"{b['graphs_first_screen']} / {b['graphs_drawn']} / {b['graph_slots']}"),
        ("whole page settled (no request for 1.5 s): time, bytes, graphs drawn",
         lambda b: "n/a" if b.get("settled_s") is None else
         f"{b['settled_s']:.2f} s, {fmt_bytes(b['settled_bytes'])}, {b['settled_graphs']}"),
    ]
    for label, fn in rows:
        cells = []
        for res in results.values():
            b = res.get("breakdown")
            cells.append(fn(b) if b else "n/a")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    cells = []
    for res in results.values():
        fc = res.get("facts") or {}
        cells.append("; ".join(f"{f:.3f} s (`load_run` {load:.2f} s) at `{git_commit(src)}`"
                               for src, (load, f) in fc.items()) or "n/a")
    lines.append("| `run_facts` cold (a freshly loaded run; server side) | " + " | ".join(cells) + " |")
    lines += ["", "Notes: \"drawn\" is per tool: gpudash, the loss graph's plotly SVG line paths exist; trackio, "
              "the loss card's vega canvas holds coloured pixels; TensorBoard draws in a web worker "
              "(OffscreenCanvas) that the page cannot read, so: the loss card has its canvas and y-axis ticks "
              "and its series has arrived (the worker draws within a frame after). \"Spike drawn\" reads what each "
              "chart was given: gpudash, the largest y of the loss line in the browser's figure; trackio and "
              "TensorBoard, the loss points in the answers their pages received (trackio serves a strided subset, "
              "TensorBoard a reservoir sample of 1,000 points per tag). A TensorBoard page opened before it has "
              "read the run says \"No dashboards are active\" and stays so: the benchmark reloads it every 2 s "
              "(as a user would), the time still counts from the process launch and the bytes of every load. "
              + written(results)]
    return "\n".join(lines)


def written(results: dict[int, dict[str, Any]]) -> str:
    """How long writing the runs took (not written here: kept from an earlier invocation)."""
    parts = []
    for steps, res in results.items():
        w = res.get("writes") or {}
        took = ", ".join(f"{TOOLS[t].label} {w[t]:.0f} s" for t in TOOLS if t in w)
        parts.append(f"{steps:,} steps: " + (took or "kept from an earlier invocation (`--keep`)"))
    return "Writing the runs (the peers in parallel with gpudash's writer): " + "; ".join(parts) + "."


def main() -> int:
    ap = argparse.ArgumentParser(description="first paint of the loss chart: gpudash, trackio, TensorBoard")
    ap.add_argument("--steps", type=int, nargs="+", default=[10_000, 1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tools", nargs="+", default=list(TOOLS), choices=list(TOOLS))
    ap.add_argument("--quick", action="store_true", help="10,000 steps, 1 repeat (a smoke run)")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for one chart")
    ap.add_argument("--keep", type=Path, help="write the runs here and reuse them next time (default: a temp dir)")
    ap.add_argument("--gpudash-src", type=Path, default=ROOT,
                    help="the gpudash source tree to serve (default: this checkout), e.g. a clone of main")
    ap.add_argument("--note", default="", help="a sentence put first in the section (what this run is)")
    ap.add_argument("--write", action="store_true", help="update the section in benchmarks/RESULTS.md")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.repeats = [10_000], 1
    GPUDASH_SRC[0] = args.gpudash_src.resolve()
    if any(t != "gpudash" for t in args.tools) and not (BENCH_VENV / "bin" / "python").exists():
        print(f"{BENCH_VENV} not found: run benchmarks/setup_env.sh, or pass --tools gpudash", file=sys.stderr)
        return 2
    work = args.keep or Path(tempfile.mkdtemp(prefix="gpudash-first-paint-"))
    work.mkdir(parents=True, exist_ok=True)
    load_start = "/".join(f"{x:.1f}" for x in os.getloadavg())
    results: dict[int, dict[str, Any]] = {}
    browser = "?"
    try:
        for steps in args.steps:
            writes = write_all(work, steps, args.tools)
            spike = spike_value(steps)
            res: dict[str, Any] = {"tools": {}, "writes": writes}
            pages_by_tool: dict[str, list[dict[str, Any]]] = {t: [] for t in args.tools}
            for _ in range(args.repeats):  # tools interleaved, so that drift in the load hits all of them
                for tool in args.tools:
                    data = work / f"{tool}-{steps}"
                    page = measure(TOOLS[tool], data, args.timeout, settle=tool == "gpudash")
                    pages_by_tool[tool].append(page)
                    print(f"{steps:,} steps, {tool}: {fmt_s(page.get('launch_to_drawn_s'))}, "
                          f"{fmt_bytes(page.get('bytes'))}", file=sys.stderr, flush=True)
            for tool, pages in pages_by_tool.items():
                res["tools"][tool] = summarize(pages, tool, spike)
                browser = res["tools"][tool]["browser"]
            if "gpudash" in pages_by_tool:
                drawn = [gpudash_breakdown(p) for p in pages_by_tool["gpudash"] if p.get("drawn") is not None]
                if drawn:
                    res["breakdown"] = {k: median_or_none(b.get(k) for b in drawn)
                                        if all(isinstance(b.get(k), (int, float, type(None))) for b in drawn)
                                        else drawn[0].get(k) for k in drawn[0]}
                res["facts"] = {src: facts_cold(work / f"gpudash-{steps}" / RUN, args.repeats, src)
                                for src in dict.fromkeys([GPUDASH_SRC[0], ROOT])}
            results[steps] = res
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    commit = git_commit(GPUDASH_SRC[0])
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_start": load_start,
           "load_end": "/".join(f"{x:.1f}" for x in os.getloadavg()), "browser": browser, "commit": commit,
           "versions": versions()}
    text = table(results, args, env)
    print(text)
    if args.write:
        import results as results_md  # benchmarks/results.py, next to this script

        results_md.write_section(SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
