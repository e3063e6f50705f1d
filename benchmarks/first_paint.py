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
started first, then the tool's server process is launched cold; as soon as
its port answers, the browser opens the page. A script injected before the
page's own polls every animation frame for the loss chart being drawn (a
per-tool DOM condition, see ``TOOLS``) and stamps ``performance.now()``.
Reported: process launch → chart drawn, navigation → chart drawn, the bytes
the browser received until then (Resource Timing ``transferSize`` of the
document and of every resource that ended before the chart was drawn: bytes
on the wire, so a compressed response counts compressed), and whether the
spike is drawn. Then a gpudash breakdown: server start, the document and
``_dash-layout``, the ``_dash-update-component`` round-trips, the largest
callback response, the browser's share after the loss figure arrived, graphs
drawn in the first screen, and ``run_facts`` on the cold run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## First paint (issue 18)"
BENCH_VENV = Path(os.environ.get("BENCH_VENV", ROOT / ".venv-bench"))
if not (BENCH_VENV / "bin" / "python").exists() and Path("/work/main/.venv-bench/bin/python").exists():
    BENCH_VENV = Path("/work/main/.venv-bench")  # a worktree without its own bench venv
sys.path.insert(0, str(ROOT / "tests" / "browser"))

#: The 8 scalars every tool records; "loss" sorts first (trackio and TensorBoard order their charts by name).
SCALARS = ("loss", "lr", "mfu", "param_norm", "perplexity", "tokens_per_s", "update_ratio", "val_accuracy")
SPIKE_FACTOR = 8.0
PROJECT = "firstpaint"
RUN = "run"
STEP_S = 0.1


def spike_step(steps: int) -> int:
    """The one step whose loss is ``SPIKE_FACTOR`` times what it would be (away from both ends)."""
    return int(steps * 0.637)


def series(steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """The 8 scalars of every step (float64), the loss spiked ×8 at :func:`spike_step`."""
    rng = np.random.default_rng(seed)
    s = np.arange(steps, dtype=float)
    decay = np.exp(-s / max(steps * 0.3, 1.0))
    loss = 0.5 + 2.5 * decay + 0.05 * rng.random(steps)
    loss[spike_step(steps)] *= SPIKE_FACTOR
    return {
        "loss": loss,
        "lr": 3e-4 * np.minimum(1.0, (s + 1) / max(steps * 0.01, 1.0)),
        "mfu": 0.41 + 0.01 * rng.standard_normal(steps),
        "param_norm": 100.0 + s / max(steps, 1),
        "perplexity": np.exp(np.minimum(loss, 20.0)),
        "tokens_per_s": 3.2e5 + 1e4 * rng.standard_normal(steps),
        "update_ratio": 1e-3 * (1.0 + 0.1 * rng.random(steps)),
        "val_accuracy": 1.0 - 0.9 * decay + 0.01 * rng.random(steps),
    }


def spike_value(steps: int) -> float:
    return float(series(steps)["loss"][spike_step(steps)])


# ---- writing the run, once per tool ------------------------------------------------------------------------
def write_gpudash(run_dir: Path, steps: int) -> float:
    """The run through gpudash's own writer: what a Monitor would have recorded, without a training loop."""
    from gpudash.store.writer import Recorder

    t0 = time.perf_counter()
    start = time.time() - steps * STEP_S
    values = series(steps)
    rec = Recorder(run_dir, flush_interval=3600, capacity=400_000,
                   meta={"name": "first-paint", "device": "cuda:0", "device_name": "synthetic H100",
                         "device_capacity_bytes": 80 * 2**30, "created_at": start,
                         "phases": ["data", "forward", "backward", "optimizer"]})
    rng = np.random.default_rng(1)
    batch = 100_000
    for lo in range(0, steps, batch):
        n = min(batch, steps - lo)
        dur = (STEP_S + 0.01 * rng.standard_normal(n)).tolist()
        cols = {k: v[lo:lo + n].tolist() for k, v in values.items()}
        for i in range(n):
            s = lo + i
            t = start + s * STEP_S
            row = {"step": s, "time": t, "duration_s": dur[i], "data_s": 0.005, "forward_s": 0.03,
                   "backward_s": 0.05, "optimizer_s": 0.015, "samples": 32, "tokens": 32 * 1024}
            for k in SCALARS:
                row[k] = cols[k][i]
            rec.put("steps", row)
            frac = (s % 1000) / 1000
            rec.put("memory", {"step": s, "time": t, "params_bytes": 2e9, "grads_bytes": 2e9,
                               "optimizer_bytes": 8e9, "activations_bytes": 30e9 + 1e9 * frac,
                               "allocated_bytes": 42e9 + 1e9 * frac, "reserved_bytes": 50e9})
            rec.put("device", {"time": t + 0.05, "gpu": 0, "sm_active_pct": 80.0, "pcie_tx_mib_s": 100.0,
                               "power_w": 500.0, "temp_c": 60.0})
        rec.flush(timeout=3600)
    rec.close()
    return time.perf_counter() - t0


def _write_trackio(root: Path, steps: int) -> None:
    os.environ["TRACKIO_DIR"] = str(root)
    import trackio

    cols = {k: v.tolist() for k, v in series(steps).items()}
    run = trackio.init(project=PROJECT, name=RUN, auto_log_cpu=False, auto_log_gpu=False)
    for i in range(steps):
        trackio.log({k: cols[k][i] for k in SCALARS}, step=i)
    trackio.finish()
    sender = getattr(run, "_local_sender_thread", None)
    if sender is not None:  # finish() waits 30 s for its sender, a long run needs longer: not a row lost
        sender.join()
    import sqlite3

    with sqlite3.connect(root / f"{PROJECT}.db") as db:
        stored = db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
    if stored != steps:
        raise RuntimeError(f"trackio stored {stored} of {steps} steps")


def _write_tensorboard(root: Path, steps: int) -> None:
    from tensorboardX import SummaryWriter
    from tensorboardX.proto.summary_pb2 import Summary

    cols = {k: v.tolist() for k, v in series(steps).items()}
    start = time.time() - steps * STEP_S
    w = SummaryWriter(str(root / RUN), flush_secs=3600, max_queue=100_000)
    fw = w._get_file_writer()
    for i in range(steps):
        fw.add_summary(Summary(value=[Summary.Value(tag=k, simple_value=cols[k][i]) for k in SCALARS]), i,
                       start + i * STEP_S)
    w.close()


WRITERS: dict[str, Callable[[Path, int], None]] = {"trackio": _write_trackio, "tensorboard": _write_tensorboard}


def write_all(work: Path, steps: int, tools: Iterable[str]) -> dict[str, float]:
    """Write the run for every tool into ``work/<tool>-<steps>`` (kept if already there): seconds each took,
    the peers in ``.venv-bench`` subprocesses at the same time as gpudash's writer in this process."""
    took: dict[str, float] = {}
    procs = {}
    for tool in tools:
        dest = work / f"{tool}-{steps}"
        if (dest / "done").exists():
            continue
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        if tool != "gpudash":
            procs[tool] = (time.perf_counter(), subprocess.Popen(
                [str(BENCH_VENV / "bin" / "python"), __file__, "--_write", tool, str(dest), str(steps)],
                stdout=subprocess.DEVNULL))
    for tool in tools:
        dest = work / f"{tool}-{steps}"
        if tool == "gpudash" and not (dest / "done").exists():
            took[tool] = write_gpudash(dest / RUN, steps)
            (dest / "done").touch()
    while procs:
        for tool, (t0, proc) in list(procs.items()):
            if proc.poll() is None:
                continue
            if proc.returncode != 0:
                raise RuntimeError(f"writing the {tool} run failed (is {BENCH_VENV} set up? benchmarks/setup_env.sh)")
            took[tool] = time.perf_counter() - t0
            (work / f"{tool}-{steps}" / "done").touch()
            del procs[tool]
        time.sleep(0.2)
    return took


# ---- the tools' servers and what "the loss chart is drawn" means in each page -------------------------------
@dataclass(frozen=True)
class Tool:
    name: str
    label: str
    path: str
    """The page opened: the run's page, or the project's charts."""
    drawn: str
    """JavaScript function body: true once the loss chart is drawn."""
    ready: str
    """Regex of the line the server prints when it is ready (the URL a user then opens)."""
    capture: str = ""
    """Regex of the URLs whose response bodies the page keeps (to read what the chart was given)."""
    empty: str = ""
    """Text of a page that will not recover by itself (opened before the server read the run): the
    benchmark reloads it every 2 s, as a user would."""


GPUDASH_DRAWN = """
const g = document.querySelector('#loss-graph .js-plotly-plot');
if (!g || !g._fullData || !g.querySelector('.main-svg')) return false;
const lines = Array.from(g.querySelectorAll('.scatterlayer .trace path.js-line'));
return lines.some(p => (p.getAttribute('d') || '').length > 10);
"""
# vega draws on a canvas: drawn = the loss card's canvas holds coloured pixels (grid and axes are grey)
TRACKIO_DRAWN = """
const c = document.querySelector('.plot-container[data-metric="loss"] canvas');
if (!c || !c.width || !c.height) return false;
const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
for (let i = 0; i < d.length; i += 4) {
  if (d[i + 3] > 128 && Math.max(d[i], d[i + 1], d[i + 2]) - Math.min(d[i], d[i + 1], d[i + 2]) > 40) return true;
}
return false;
"""
# TensorBoard draws in a web worker (OffscreenCanvas), out of the page's reach: drawn = the loss card has its
# canvas and y-axis ticks, and the loss series it asked for has arrived (the worker draws within a frame)
# TensorBoard draws in a web worker (OffscreenCanvas), out of the page's reach: drawn = the loss card has its
# canvas and its axes span the loss series it was sent (the x axis reaches half its last step; before the data
# the axes show a default [0, 1]); the worker draws the frame it is given then
TENSORBOARD_DRAWN = """
const card = tbLossCard();
if (!card || !card.querySelector('line-chart canvas')) return false;
const last = tbLossLastStep();
const xs = tbTicks(card, 'x').map(t => t[0]);
return last !== null && xs.length > 0 && Math.max(...xs) >= 0.5 * last && tbTicks(card, 'y').length > 0;
"""
TOOLS = {
    "gpudash": Tool("gpudash", "gpudash", f"run/{RUN}", GPUDASH_DRAWN, r"serving .* at http"),
    "trackio": Tool("trackio", "trackio", f"?project={PROJECT}", TRACKIO_DRAWN, r"launched at",
                    r"/api/get_logs_batch"),
    "tensorboard": Tool("tensorboard", "TensorBoard", "", TENSORBOARD_DRAWN, r"TensorBoard .* at http",
                        r"/timeseries/timeSeries", "No dashboards are active"),
}


#: The gpudash source tree whose server is measured (``--gpudash-src``): this checkout unless told.
GPUDASH_SRC = [ROOT]


def command(tool: str, data: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """The cold server for ``tool`` over the run written in ``data``."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    bench = str(BENCH_VENV / "bin" / "python")
    if tool == "gpudash":
        env["PYTHONPATH"] = str(GPUDASH_SRC[0]) + os.pathsep + env.get("PYTHONPATH", "")
        return [sys.executable, "-m", "gpudash", "serve", str(data), "--port", str(port)], env
    if tool == "trackio":
        env["TRACKIO_DIR"] = str(data)
        return [bench, "-c", f"import trackio; trackio.show(project={PROJECT!r}, open_browser=False, "
                f"server_port={port}, block_thread=True)"], env
    if tool == "tensorboard":
        return [str(BENCH_VENV / "bin" / "tensorboard"), "--logdir", str(data), "--port", str(port),
                "--host", "127.0.0.1"], env
    raise KeyError(tool)


INJECT = """
(() => {
  performance.setResourceTimingBufferSize(100000);
  const fp = window.__fp = {drawn: null, bodies: [], calls: [], error: null, snap: null};
  const capture = %(capture)s ? new RegExp(%(capture)s) : null;
  const keep = (url, req, body) => fp.bodies.push({url: String(url), t: performance.now(), req, body});
  const origFetch = window.fetch;
  window.fetch = function (input, init) {
    const url = typeof input === 'string' ? input : (input && input.url) || String(input);
    const req = init && typeof init.body === 'string' ? init.body : null;
    if (url.includes('_dash-update-component') && req) {
      try { fp.calls.push({t0: performance.now(), output: JSON.parse(req).output}); } catch (e) {}
    }
    const p = origFetch.apply(this, arguments);
    if (capture && capture.test(url)) p.then(r => r.clone().text()).then(t => keep(url, req, t), () => {});
    return p;
  };
  const open = XMLHttpRequest.prototype.open, send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (m, url) { this.__url = String(url); return open.apply(this, arguments); };
  XMLHttpRequest.prototype.send = function (body) {
    if (capture && capture.test(this.__url)) {
      const x = this;
      x.addEventListener('load', () => keep(x.__url, typeof body === 'string' ? body : null,
        (x.responseType === '' || x.responseType === 'text') ? x.responseText : JSON.stringify(x.response)));
    }
    return send.apply(this, arguments);
  };
  const tbLossCard = () => Array.from(document.querySelectorAll('scalar-card')).find(
    c => c.querySelector('tb-truncated-path.tag[title="loss"]'));
  const tickValue = s => {  // "2,000", "10k", "1.5M", "1e-3"
    const m = s.trim().replace(/,/g, '').match(/^(-?[0-9.]+(?:e[-+]?[0-9]+)?)([kMGT]?)$/);
    return m ? parseFloat(m[1]) * {'': 1, k: 1e3, M: 1e6, G: 1e9, T: 1e12}[m[2]] : NaN;
  };
  const tbTicks = (card, axis) => Array.from(card.querySelectorAll(`line-chart-axis[axis=${axis}] svg.ticks text`))
    .map(t => [tickValue(t.textContent), parseFloat(t.getAttribute(axis === 'y' ? 'y' : 'x'))])
    .filter(p => isFinite(p[0]) && isFinite(p[1]));
  const tbLossLastStep = () => {
    let last = null;
    for (const b of fp.bodies) {
      if (b.lossLast === undefined) {
        b.lossLast = null;
        try {
          const doc = JSON.parse(b.body);
          for (const item of Array.isArray(doc) ? doc : [doc]) {
            if (!item || item.tag !== 'loss') continue;
            for (const pts of Object.values(item.runToSeries || {}))
              for (const p of pts) if (b.lossLast === null || p.step > b.lossLast) b.lossLast = p.step;
          }
        } catch (e) {}
      }
      if (b.lossLast !== null) last = b.lossLast;
    }
    return last;
  };
  const drawn = () => { %(drawn)s };
  const snap = () => {
    const shown = r => r.bottom > 0 && r.top < window.innerHeight && r.width > 0;
    const graphs = Array.from(document.querySelectorAll('.js-plotly-plot')).filter(g => g.querySelector('.main-svg'));
    const out = {graphs: graphs.length, graphs_first_screen: graphs.filter(g => shown(g.getBoundingClientRect())).length,
                 graph_slots: document.querySelectorAll('.dash-graph').length, ymax: null, marker_ymax: null};
    const lossCard = document.querySelector('#loss-graph, .plot-container[data-metric="loss"]') || tbLossCard();
    if (tbLossCard()) out.tb_ticks = tbTicks(tbLossCard(), 'y');
    out.loss_first_screen = lossCard ? shown(lossCard.getBoundingClientRect()) : null;
    const g = document.querySelector('#loss-graph .js-plotly-plot');
    if (g && g._fullData) {
      for (const t of g._fullData) {
        if (t.visible === false || !t.y) continue;
        let m = -Infinity; for (let i = 0; i < t.y.length; i++) { const v = +t.y[i]; if (v > m) m = v; }
        const key = String(t.mode || '').includes('lines') ? 'ymax' : 'marker_ymax';
        if (m > -Infinity && (out[key] === null || m > out[key])) out[key] = m;
      }
    }
    return out;
  };
  const poll = () => {
    if (fp.drawn !== null) return;
    let ok = false;
    try { ok = !!drawn(); } catch (e) { fp.error = String(e); }
    if (ok) { fp.drawn = performance.now(); try { fp.snap = snap(); } catch (e) { fp.error = String(e); } }
    else requestAnimationFrame(poll);
  };
  requestAnimationFrame(poll);
})();
"""

COLLECT = """
const pick = e => ({name: e.name, type: e.initiatorType, start: e.startTime, req: e.requestStart,
  res: e.responseStart, end: e.responseEnd, transfer: e.transferSize, encoded: e.encodedBodySize,
  decoded: e.decodedBodySize});
const fp = window.__fp;
const shown = r => r.bottom > 0 && r.top < window.innerHeight && r.width > 0;
const graphs = Array.from(document.querySelectorAll('.js-plotly-plot')).filter(g => g.querySelector('.main-svg'));
return {origin: performance.timeOrigin, drawn: fp.drawn, error: fp.error, snap: fp.snap, calls: fp.calls,
        bodies: arguments[0] ? fp.bodies : [], nav: pick(performance.getEntriesByType('navigation')[0]),
        resources: performance.getEntriesByType('resource').map(pick), now: performance.now(),
        settled_graphs: graphs.length, settled_first_screen: graphs.filter(g => shown(g.getBoundingClientRect())).length};
"""


def inject_script(tool: Tool) -> str:
    return INJECT % {"capture": json.dumps(tool.capture), "drawn": tool.drawn}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server process launched cold, its output read on a thread: when its port first accepted a
    connection, and when it printed its ready line."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int, ready: str, cwd: Path | None = None) -> None:
        self.port, self.ready_re = port, re.compile(ready)
        self.t_ready: float | None = None
        self.lines: list[str] = []
        self.t_launch = time.time()
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, cwd=cwd)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.t_ready is None and self.ready_re.search(line):
                self.t_ready = time.time()
            if len(self.lines) < 200:
                self.lines.append(line.rstrip())

    def wait_ready(self, timeout: float) -> tuple[float, float]:
        """(port open, ready line printed) wall times; the page is opened after both, as a user would."""
        deadline = self.t_launch + timeout
        t_port = None
        while time.time() < deadline:
            if t_port is None:
                try:
                    with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                        t_port = time.time()
                except OSError:
                    pass
            if t_port is not None and self.t_ready is not None:
                return t_port, self.t_ready
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): " + " / ".join(self.lines[-5:]))
            time.sleep(0.01)
        raise TimeoutError(f"server not ready after {timeout:.0f} s: " + " / ".join(self.lines[-5:]))

    def stop(self) -> None:
        """End the server and what it started (its own process group)."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)


def wait_for(fn: Callable[[], Any], timeout: float, step: float = 0.05) -> Any:
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v or time.time() > deadline:
            return v
        time.sleep(step)


# ---- one measurement ---------------------------------------------------------------------------------------
def bytes_until(page: dict[str, Any], t_ms: float) -> int:
    """Bytes on the wire the browser had received by ``t_ms``: the document and every resource that ended
    by then (``transferSize``: headers + body as sent, compressed when the server compressed it)."""
    total = int(page["nav"]["transfer"] or 0)
    return total + sum(int(r["transfer"] or 0) for r in page["resources"] if r["end"] <= t_ms)


def measure(tool: Tool, data: Path, timeout: float, settle: bool) -> dict[str, Any]:
    """Cold server + fresh Chromium → the loss chart drawn; the page's timings as the browser saw them."""
    from conftest import make_driver

    driver = make_driver()
    try:
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": inject_script(tool)})
        port = free_port()
        argv, env = command(tool.name, data, port)
        # gpudash runs in its source tree: `python -m` puts the working directory first on sys.path
        server = Server(argv, env, port, tool.ready, cwd=GPUDASH_SRC[0] if tool.name == "gpudash" else None)
        t_launch = server.t_launch
        try:
            t_port, t_ready = server.wait_ready(timeout)
            driver.set_page_load_timeout(timeout)
            driver.get(f"http://127.0.0.1:{port}/{tool.path}")
            earlier_bytes, reloads = 0, 0
            while True:
                left = timeout - (time.time() - t_launch)
                drawn = wait_for(lambda: driver.execute_script("return window.__fp && window.__fp.drawn !== null"),
                                 max(1.0, min(left, 2.0) if tool.empty else left))
                if drawn or left <= 2.0 or not tool.empty or tool.empty not in driver.execute_script(
                        "return document.body ? document.body.innerText : ''"):
                    break
                earlier_bytes += bytes_until(driver.execute_script(COLLECT, False), float("inf"))
                reloads += 1
                driver.refresh()
            page = driver.execute_script(COLLECT, bool(tool.capture))
            page["earlier_bytes"], page["reloads"] = earlier_bytes, reloads
            if settle and page["drawn"] is not None:  # then until no new request for 1.5 s: the whole page
                seen, quiet_since = len(page["resources"]), time.time()
                deadline = time.time() + 30
                while time.time() - quiet_since < 1.5 and time.time() < deadline:
                    time.sleep(0.25)
                    n = driver.execute_script("return performance.getEntriesByType('resource').length")
                    if n != seen:
                        seen, quiet_since = n, time.time()
                page["settled"] = driver.execute_script(COLLECT, False)
        finally:
            server.stop()
        page["browser"] = driver.capabilities.get("browserVersion", "?")
    finally:
        driver.quit()
    page["t_launch"], page["t_port"], page["t_ready"] = t_launch, t_port, t_ready
    if page["drawn"] is not None:
        page["launch_to_drawn_s"] = (page["origin"] + page["drawn"]) / 1e3 - t_launch
        page["bytes"] = page["earlier_bytes"] + bytes_until(page, page["drawn"])
    return page


# ---- reading what was plotted ------------------------------------------------------------------------------
def _loss_values_trackio(bodies: list[dict[str, Any]]) -> list[float] | None:
    """The loss values in trackio's last ``get_logs_batch`` answer, or None if none carried the loss."""
    found: list[float] | None = None
    for b in bodies:
        try:
            doc = json.loads(b["body"])
        except ValueError:
            continue
        vals = list(_find_key(doc, "loss"))
        if vals:
            found = vals
    return found


def _find_key(doc: Any, key: str) -> Iterable[float]:
    """Every number stored under ``key`` anywhere in a JSON document (a row's ``{"loss": 2.1}``, or a
    column ``{"loss": [2.1, ...]}``)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k == key and isinstance(v, (int, float)) and not isinstance(v, bool):
                yield float(v)
            elif k == key and isinstance(v, list):
                yield from (float(x) for x in v if isinstance(x, (int, float)) and not isinstance(x, bool))
            else:
                yield from _find_key(v, key)
    elif isinstance(doc, list):
        for v in doc:
            yield from _find_key(v, key)


def _loss_values_tensorboard(bodies: list[dict[str, Any]]) -> list[float] | None:
    """The points of the ``loss`` tag in TensorBoard's ``timeSeries`` answers."""
    found: list[float] | None = None
    for b in bodies:
        try:
            doc = json.loads(b["body"])
        except ValueError:
            continue
        for item in doc if isinstance(doc, list) else [doc]:
            if isinstance(item, dict) and item.get("tag") == "loss":
                runs = item.get("runToSeries") or {}
                vals = [float(p["value"]) for pts in runs.values() for p in pts if isinstance(p, dict)]
                if vals:
                    found = vals
    return found


def spike_verdict(tool: str, page: dict[str, Any], spike: float) -> tuple[str, str]:
    """("yes" / "no" / "clipped" / "n/a", why): from what the chart was given and its y axis, never a guess."""
    near = spike * (1 - 1e-6)  # float32 on the wire may round the spike's last digits
    if page.get("drawn") is None:
        return "n/a", "chart not drawn"
    if tool == "gpudash":
        snap = page.get("snap") or {}
        y = snap.get("ymax")
        if y is None:
            return "n/a", "no loss line in the figure"
        marker = snap.get("marker_ymax") is not None and snap["marker_ymax"] >= near
        return ("yes" if y >= near else "no"), f"loss line max {y:.3g}{', spike marker drawn' if marker else ''}"
    vals = (_loss_values_trackio if tool == "trackio" else _loss_values_tensorboard)(
        [b for b in page.get("bodies", []) if b["t"] <= page["drawn"]])
    if vals is None:
        return "n/a", "could not read the loss series the chart was given"
    top = max(vals)
    if top < near:
        return "no", f"not among the {len(vals):,} loss points served (max {top:.3g})"
    if tool == "trackio":  # vega's y scale spans the data: a point served is inside the plot
        return "yes", (f"among the {len(vals):,} loss points served; faint (the raw line under trackio's "
                       "default smoothing)")
    top = axis_top((page.get("snap") or {}).get("tb_ticks") or [])
    if top is None:
        return "n/a", f"among the {len(vals):,} points served; y axis unreadable"
    if top < near:  # TensorBoard's default "ignore outliers in chart scaling"
        return "clipped", (f"among the {len(vals):,} points served, but the line leaves the chart: the y axis "
                           f"ends at {top:.3g}")
    return "yes", f"among the {len(vals):,} points served, y axis up to {top:.3g}"


def axis_top(ticks: list[list[float]]) -> float | None:
    """The value at the top (y = 0) of a y axis from its tick labels' (value, pixel y) pairs."""
    pts = sorted({(float(v), float(y)) for v, y in ticks}, key=lambda p: p[1])
    if len(pts) < 2 or pts[0][1] == pts[-1][1]:
        return None
    (v1, y1), (v2, y2) = pts[0], pts[-1]
    return v1 + (0.0 - y1) * (v2 - v1) / (y2 - y1)


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
    if len(sys.argv) == 5 and sys.argv[1] == "--_write":  # the peers' writers, run in .venv-bench
        WRITERS[sys.argv[2]](Path(sys.argv[3]), int(sys.argv[4]))
        return 0
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
