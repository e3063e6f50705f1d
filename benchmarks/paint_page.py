"""The pages of the first-paint benchmark (benchmarks/first_paint.py): each tool's cold server, what "the
loss chart is drawn" means in its page, one measurement in a fresh headless Chromium, and reading what the
chart was given (was the spike drawn)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paint_run import BENCH_VENV, PROJECT, ROOT, RUN

sys.path.insert(0, str(ROOT / "tests"))  # its helpers (tests/helpers/browser.py: the Chromium)

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
    from helpers.browser import make_driver

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

