"""The dashboard's CSS and page shell (inline: the app serves no asset files)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CSS", "DRAW_FIRST", "FIRST_SCREEN_CHUNKS", "PLOTLY_BUNDLE", "PLOTLY_URL", "TYPED_JS", "index_string"]

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 0; background: #f6f7f9; color: #222; }
#page { max-width: 1500px; margin: 0 auto; padding: 12px 20px 60px; }
.topbar { background: #1f2937; color: #fff; padding: 8px 20px; font-weight: 600; }
.topbar a { color: #fff; text-decoration: none; }
.muted { color: #666; }
.note { color: #555; background: #fff; border: 1px dashed #bbb; padding: 10px 12px; margin: 6px 0; font-size: 14px; }
.view { background: #fff; border: 1px solid #e3e5e8; border-radius: 6px; padding: 8px 14px; margin: 14px 0; }
.view h3 { margin: 6px 0; font-size: 16px; display: inline-block; }
.view > summary { cursor: pointer; list-style-position: outside; }
.view, .run-header { scroll-margin-top: 120px; }
.section-nav { flex-basis: 100%; display: flex; gap: 14px; font-size: 13px; border-top: 1px solid #eee; padding-top: 4px; }
.section-nav a { color: #1f77b4; text-decoration: none; } .section-nav a:hover { text-decoration: underline; }
.row { display: flex; gap: 12px; flex-wrap: wrap; }
.half { flex: 1 1 480px; min-width: 0; }
.status { padding: 1px 8px; border-radius: 10px; font-size: 13px; color: #fff; background: #888; }
.status-live { background: #2ca02c; } .status-finished { background: #1f77b4; } .status-crashed { background: #d62728; }
.runs-table { border-collapse: collapse; width: 100%; background: #fff; margin: 10px 0; }
.runs-table th, .runs-table td { border-bottom: 1px solid #e3e5e8; padding: 6px 10px; text-align: left; font-size: 14px; }
.button { padding: 4px 10px; margin-right: 6px; border: 1px solid #bbb; border-radius: 4px; background: #fff;
  cursor: pointer; text-decoration: none; color: #222; font-size: 13px; }
.replay-bar { display: flex; align-items: center; gap: 8px; flex-wrap: wrap; background: #fff; border: 1px solid #e3e5e8;
  border-radius: 6px; padding: 8px 14px; position: sticky; top: 0; z-index: 10; }
.replay-bar .step-box { width: 110px; padding: 3px 6px; border: 1px solid #bbb; border-radius: 4px; }
.replay-bar .slider { flex: 1 1 400px; min-width: 300px; }
.lights { display: flex; gap: 18px; flex-wrap: wrap; margin: 6px 0; font-size: 13px; }
.light { display: inline-block; width: 12px; height: 12px; border-radius: 6px; margin-right: 5px; vertical-align: -1px; }
.light-green { background: #2ca02c; } .light-amber { background: #ffb000; } .light-red { background: #d62728; }
.light-grey { background: #bbb; }
.stats { display: flex; gap: 22px; flex-wrap: wrap; list-style: none; padding: 0; margin: 4px 0; font-size: 14px; }
.verdict { border-left: 4px solid #bbb; padding: 4px 10px; margin: 6px 0; background: #fff; }
.sev { font-size: 12px; padding: 0 6px; border-radius: 8px; margin-right: 6px; color: #fff; background: #888; }
.sev-bad { background: #d62728; } .sev-warn { background: #ffb000; } .sev-ok { background: #2ca02c; }
#last-step { font-weight: 600; }
.run-progress { display: flex; align-items: center; gap: 10px; margin: 4px 0; font-size: 14px; }
.progress-track { width: 260px; height: 8px; border-radius: 4px; background: #e3e5e8; overflow: hidden; }
.progress-fill { height: 100%; background: #2ca02c; }
body.dark .progress-track { background: #2a2e36; }
.x-mode-row { display: flex; align-items: center; gap: 6px; font-size: 13px; margin: 2px 0; }
.x-mode label { margin-right: 10px; }
/* Dash's dropdown keeps a hidden focus input wider than a narrow dropdown: no page-wide horizontal scrollbar */
.dash-dropdown-wrapper .dash-dropdown-focus-target { max-width: 100%; }
.theme-toggle { float: right; background: none; border: 1px solid #556; color: #fff; border-radius: 4px;
  font-size: 12px; cursor: pointer; padding: 1px 8px; }
/* dark mode: follows the system unless toggled (the choice is remembered) or set by ?theme=dark|light */
body.dark { background: #0f1115; color: #ddd; }
body.dark .view, body.dark .replay-bar, body.dark .runs-table, body.dark .verdict, body.dark .note {
  background: #181b21; border-color: #2a2e36; color: #ddd; }
body.dark .topbar { background: #000; }
body.dark .muted, body.dark .note { color: #9aa3ad; }
body.dark a, body.dark .section-nav a, body.dark .rank-link { color: #7fb3e6; }
body.dark .rank-link.current { color: #fff; }
body.dark .button, body.dark input, body.dark .step-box, body.dark .search { background: #222730; color: #ddd;
  border-color: #3a3f48; }
body.dark .runs-table th, body.dark .runs-table td { border-color: #2a2e36; }
body.dark .section-nav { border-color: #2a2e36; }
body.dark .js-plotly-plot .main-svg text { fill: #d0d4da !important; }
body.dark .js-plotly-plot .gridlayer path, body.dark .js-plotly-plot .zerolinelayer path { stroke: #2c313a !important; }
body.dark .dash-spreadsheet td, body.dark .dash-spreadsheet th { background: #181b21 !important; color: #ddd !important; }
.runs-tools { display: flex; gap: 10px; align-items: center; margin: 8px 0; }
.status-filter label { margin-right: 10px; font-size: 13px; }
.runs-tools .search { padding: 6px 8px; border: 1px solid #bbb; border-radius: 4px; width: 280px; font-size: 14px; }
.rank-link { margin-right: 6px; color: #1f77b4; } .rank-link.current { font-weight: 700; color: #222; }
"""


#: Light or dark: ``?theme=dark|light`` in the address, else the last choice of the toggle, else the system's;
#: the toggle writes its choice into the address too.
THEME_JS = """(function () {
  var q = new URLSearchParams(location.search).get('theme');
  q = (q === 'dark' || q === 'light') ? q : null;
  var saved = null;
  try { saved = localStorage.getItem('gpudash-theme'); } catch (e) {}
  var mq = window.matchMedia ? window.matchMedia('(prefers-color-scheme: dark)') : null;
  var theme = q || saved || (mq && mq.matches ? 'dark' : 'light');
  function apply(t) {
    theme = t;
    document.body.classList.toggle('dark', t === 'dark');
    var b = document.getElementById('theme-toggle');
    if (b) { b.textContent = t === 'dark' ? 'light mode' : 'dark mode'; }
  }
  apply(theme);
  if (mq && mq.addEventListener) {
    mq.addEventListener('change', function (e) { if (!q && !saved) { apply(e.matches ? 'dark' : 'light'); } });
  }
  function intoAddress(t) {
    // theme=... in the address, so a copied link opens in this theme; through the page's dcc.Location
    // (its search is what the view's own address updates start from), else straight into the history
    var params = new URLSearchParams(location.search);
    params.set('theme', t);
    var search = '?' + params.toString();
    var dc = window.dash_clientside;
    if (dc && dc.set_props) {
      try { dc.set_props('url', {search: search}); return; } catch (e) {}
    }
    history.replaceState(history.state, '', location.pathname + search + location.hash);
  }
  window.gpudashTheme = {
    get: function () { return theme; },
    toggle: function () {
      saved = theme === 'dark' ? 'light' : 'dark';
      try { localStorage.setItem('gpudash-theme', saved); } catch (e) {}
      q = saved;
      apply(saved);
      intoAddress(saved);
    }
  };
})();"""


#: Class of the graphs a page draws first (the first screen's charts); the page's other graphs are first drawn
#: a task later (``TYPED_JS``), once these are painted.
DRAW_FIRST = "draw-first"

#: The plotly.js gpudash's pages load (``gpudash/<this path>``): plotly.js's cartesian partial bundle, 1.5 MB
#: instead of the full 4.8 MB (gpudash/server/layouts/vendor/README.md); served by :mod:`gpudash.server.app` in place of Dash's.
PLOTLY_BUNDLE = "gpudash/server/layouts/vendor/plotly-cartesian.min.js"


def _stamp(rel: str) -> str:
    try:
        st = (Path(__file__).parent / rel).stat()
    except OSError:
        return "0"
    return f"{st.st_size}-{st.st_mtime_ns}"


#: The address the page asks plotly.js at (under ``_dash-component-suites/``): the file's size and modification
#: time in it, as Dash's own bundle addresses carry theirs, so a cached copy (the browser's, or the server's
#: compressed one) of an older file is never used.
PLOTLY_URL = f"{PLOTLY_BUNDLE}?v={_stamp(PLOTLY_BUNDLE.split('/', 2)[2])}"

#: plotly.js for the page, and typed arrays (:func:`gpudash.server.layouts.fig.wire`) back into plain arrays before it
#: draws them: the page parses a base64 string instead of thousands of numbers, and live ``extendData`` appends
#: to an array as before. On a run or compare page plotly.js (:data:`PLOTLY_BUNDLE`) is fetched and parsed at once, while the
#: server builds the page, not after the first graph is mounted; until it has run, ``window.Plotly`` is a
#: promise of it, which is what Dash's graph waits on (``Promise.resolve(window.Plotly || load())``).
TYPED_JS = r"""(function () {
  var TYPES = {f4: Float32Array, f8: Float64Array, i4: Int32Array};
  function decode(v) {
    if (!v || typeof v.bdata !== 'string' || !TYPES[v.dtype]) { return v; }
    var s = atob(v.bdata), n = s.length, u = new Uint8Array(n);
    for (var i = 0; i < n; i++) { u[i] = s.charCodeAt(i); }
    return Array.from(new TYPES[v.dtype](u.buffer));
  }
  function plain(data) {
    (Array.isArray(data) ? data : []).forEach(function (t) {
      if (t) { t.x = decode(t.x); t.y = decode(t.y); }
    });
  }
  // a page's first draw: the charts of class DRAW_FIRST_CLASS (the first screen's) are drawn in the task that mounts them,
  // the others' first draw waits a task, so the first screen is painted before them
  function later(gd) {
    return !!(gd && gd.nodeType === 1 && !gd._fullLayout && document.querySelector('.DRAW_FIRST_CLASS')
              && !(gd.parentElement && gd.parentElement.classList.contains('DRAW_FIRST_CLASS')));
  }
  function wrap(P) {
    if (!P || P.__gpudashTyped || typeof P.then === 'function') { return P; }
    ['react', 'newPlot'].forEach(function (name) {
      var f = P[name];
      if (typeof f !== 'function') { return; }
      P[name] = function (gd, data) {
        var self = this, args = arguments;
        function draw() {
          plain(data && data.data ? data.data : data);
          return f.apply(self, args);
        }
        if (!later(gd)) { return draw(); }
        return new Promise(function (resolve) {  // after the first-screen charts (a task later, once painted)
          setTimeout(function () { resolve(gd.isConnected ? draw() : gd); }, 0);
        });
      };
    });
    P.__gpudashTyped = true;
    return P;
  }
  var current = wrap(window.Plotly), loaded = null, done = null, bundle = null;
  try {  // Dash's renderer names the full plotly.js for its graphs to load: they load gpudash's bundle instead
    var cfg = JSON.parse(document.getElementById('_dash-config').textContent);
    bundle = (cfg.requests_pathname_prefix || '/') + '_dash-component-suites/' + PLOTLY_PATH;
    Object.defineProperty(window, '_dashPlotlyJSURL', {configurable: true, enumerable: true,
      get: function () { return bundle; }, set: function (v) {}});
  } catch (e) { bundle = null; }
  var started = false;
  function start() {  // fetch and run plotly.js now (once)
    if (started || !loaded) { return; }
    started = true;
    try {
      var el = document.createElement('script');
      el.src = bundle;
      el.async = true;
      el.onerror = function () { loaded = null; };
      document.head.appendChild(el);
    } catch (e) { loaded = null; }
  }
  if (!current && bundle && /\/(run|compare)(\/|$)/.test(location.pathname)) {
    loaded = new Promise(function (resolve) { done = resolve; });
    // evaluated while the server builds the page: started by the page's first callback request (the renderer
    // has asked for its layout by then), or by whoever asks for Plotly first, or after 1.5 s at the latest
    var f = window.fetch;
    if (typeof f === 'function') {
      window.fetch = function (u) {
        try { if (!started && String((u && u.url) || u).indexOf('_dash-update-component') >= 0) { setTimeout(start, 0); } }
        catch (e) {}
        return f.apply(this, arguments);
      };
    }
    setTimeout(start, 1500);
  }
  Object.defineProperty(window, 'Plotly', {configurable: true, enumerable: true,
    get: function () { if (!current && loaded) { start(); } return current || loaded || undefined; },
    set: function (v) { current = wrap(v); if (done && current) { done(current); } }});
})();""".replace("PLOTLY_PATH", repr(PLOTLY_URL)).replace("DRAW_FIRST_CLASS", DRAW_FIRST)


#: Dash's lazily loaded component scripts a run page's first screen mounts (graphs, the replay bar's dropdowns
#: and slider), under ``_dash-component-suites/``: fetched with the page's own scripts, not after its first
#: answer (the renderer asks for them only when it mounts those components).
FIRST_SCREEN_CHUNKS = ("dash/dcc/async-graph.js", "dash/dcc/async-dropdown.js", "dash/dcc/async-slider.js")


def index_string(title: str = "gpudash", prefix: str = "/") -> str:
    """The page shell; ``prefix``: the path the browser reaches the server under (``requests_pathname_prefix``)."""
    preload = "".join(f"<link rel='preload' as='script' href='{prefix}_dash-component-suites/{c}'>"
                      for c in FIRST_SCREEN_CHUNKS)
    return ("<!DOCTYPE html><html><head>{%metas%}<title>" + title + "</title>" + preload + "{%favicon%}{%css%}<style>" + CSS
            + "</style></head><body><div class='topbar'><a href='/'>gpudash</a>"
            "<button id='theme-toggle' class='theme-toggle' type='button' onclick='gpudashTheme.toggle()'>"
            "dark mode</button></div><script>" + THEME_JS + "</script>{%app_entry%}<footer>"
            "{%config%}<script>" + TYPED_JS + "</script>{%scripts%}{%renderer%}</footer></body></html>")
