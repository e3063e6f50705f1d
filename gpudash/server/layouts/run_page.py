"""The run page: header, replay bar, and the memory, throughput, device, stability, events and
hot-spot views, for live and saved runs alike."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from dash import dcc, html
from gpudash.analysis.attempts import resumes
from gpudash.server.layouts import device, events, hotspots, memory, stability, throughput
from gpudash.server.layouts.common import base_figure, note, plot_text, recorded_reason, source_reason, waiting_figure
from gpudash.server.layouts.data import RunView
from gpudash.server.layouts.downsample import downsample_indices
from gpudash.server.layouts.fig import Fig
from gpudash.server.layouts.leakline import leak_line
from gpudash.server.layouts.links import href
from gpudash.server.layouts.progressbar import progress_bar
from gpudash.server.layouts.run_page_data import RunPageData
from gpudash.server.layouts.runs import device_label
from gpudash.server.layouts.series import SMOOTHING, Series, series_xy
from gpudash.server.layouts.snapshot_diff_view import diff_options, largest_children
from gpudash.server.layouts.style import DRAW_FIRST
from gpudash.server.layouts.viewstate import zoom_store
from gpudash.server.layouts.xaxis import XMODES, XAxis, style_figure, time_range_of, with_x
from gpudash.units import human_bytes

__all__ = ["EAGER", "LAZY", "PLACEHOLDER", "TABLES", "TABLE_PLACEHOLDER", "build_table", "table_placeholder", "page_graph", "placeholder", "LIVE_GRAPHS", "REPLAY_S", "SECTIONS", "section_nav", "SPEEDS", "STEP_GRAPHS", "build_graph", "cursor_shape", "graph_specs", "replay_speed",
           "RunPageData", "run_page", "speed_options", "summary_children"]

#: Graphs that grow by extendData while a run is live.
LIVE_GRAPHS = ("memory-graph", "step-time-graph", "rates-graph", "phases-graph", "loss-graph", "signals-graph",
               "device-graph", "host-graph")
#: Graphs that carry the replay cursor as their first layout shape.
CURSOR_GRAPHS = ("memory-graph", "step-time-graph", "loss-graph", "phases-graph")
SPEEDS = (1, 2, 5, 10, 20, 50, 100)
#: Graphs whose x axis is the step (a zoom in the address applies to them).
STEP_GRAPHS = ("memory-graph", "step-time-graph", "rates-graph", "phases-graph", "loss-graph", "signals-graph")
#: Seconds the default replay speed takes to play a whole run.
REPLAY_S = 30.0
#: Milliseconds between replay ticks (the cursor moves this often while playing).
TICK_MS = 500


def replay_speed(n_steps: int, step_s: float, seconds: float = REPLAY_S) -> float:
    """The speed (× real time) at which ``n_steps`` of ``step_s`` seconds play in about ``seconds``."""
    return max(n_steps * max(step_s, 1e-6) / seconds, 1e-6)


def speed_options(auto: float) -> list[dict[str, Any]]:
    """The fixed speeds and ``auto`` (the run in about 30 s), in order."""
    opts = [{"label": f"{s}x", "value": s} for s in SPEEDS if abs(s - auto) > 1e-9]
    opts.append({"label": f"{auto:.3g}x (whole run in {REPLAY_S:.0f} s)", "value": auto})
    return sorted(opts, key=lambda o: float(o["value"]))
GRAPH_CONFIG: Any = {"displaylogo": False, "scrollZoom": False}


def _ranks(frames: dict[str, Any]) -> list[int]:
    ranks: set[int] = set()
    for df in frames.values():
        if df is not None and len(df) and "rank" in df:
            ranks.update(int(r) for r in df["rank"].unique())
    return sorted(ranks) or [0]


def graph_specs(graph: str, frames: dict[str, Any], rank: int = 0, meta: dict[str, Any] | None = None,
                smooth: float = 0.0) -> list[Series]:
    """The series ``graph`` shows for these frames (the same function decides rebuilds while live);
    ``meta["phases"]`` is the run's phase set."""
    import pandas as pd

    empty = pd.DataFrame()
    steps, mem = frames.get("steps", empty), frames.get("memory", empty)
    ranks = _ranks({"steps": steps})
    if graph == "memory-graph":
        return memory.memory_series(mem, rank)
    if graph == "step-time-graph":
        return throughput.step_time_series(steps, ranks)
    if graph == "rates-graph":
        return throughput.rate_series(steps, ranks, smooth)
    if graph == "phases-graph":
        return throughput.phase_series(steps, rank, meta)
    if graph == "loss-graph":
        return stability.loss_series(steps, ranks, smooth)
    if graph == "signals-graph":
        return stability.signal_series(steps, mem, rank)[0]
    if graph == "device-graph":
        return device.device_series(frames.get("device", empty))
    if graph == "host-graph":
        return device.host_series(frames.get("host", empty))
    raise KeyError(graph)


def cursor_shape(step: int | None) -> dict[str, Any]:
    return {"type": "line", "xref": "x", "yref": "paper", "x0": step or 0, "x1": step or 0, "y0": 0, "y1": 1,
            "line": {"color": "#111", "width": 1.5, "dash": "dot"}, "visible": step is not None}


def _mark_spikes(fig: Fig, specs: list[Series], steps: Any, spikes: Sequence[int]) -> None:
    """Put the run's loss spikes (its facts, judged on every row) on the lowest rank's spike trace: on a
    downsampled or zoomed view the trailing windows of the rows shown are not the run's."""
    spec = min((s for s in specs if s.fn == "spike"), key=lambda s: s.rank, default=None)
    trace = next((t for t in fig.data if spec is not None and t.get("uid") == spec.key), None)
    if spec is None or trace is None or "loss" not in steps or "step" not in steps:
        return
    rows = steps[steps["rank"] == spec.rank] if "rank" in steps else steps
    rows = rows[rows["step"].isin(list(spikes))]
    rows = rows.dropna(subset=["step"]).drop_duplicates("step", keep="last").set_index("step")
    loss = rows["loss"]
    shown = [int(s) for s in spikes if s in loss.index]
    trace["x"], trace["y"] = shown, [float(loss.loc[s]) for s in shown]
    if spec.x in ("relative", "wall") and "time" in rows:  # drawn at the spike's time (ms on the date axis)
        trace["x"] = [(float(rows["time"].loc[s]) - spec.origin) * 1000.0 for s in shown]


def _full_ema(fig: Fig, specs: list[Series], view: RunView) -> None:
    """Averages over every step, not over the downsampled rows: recompute EMA traces on the full frame."""
    full = view.full.get("steps")
    if full is None or len(full) <= len(view.frame("steps")):
        return
    for s in specs:
        if s.fn not in ("ema", "rate_ema"):
            continue
        trace = next((t for t in fig.data if t.get("uid") == s.key), None)
        if trace is None:
            continue
        x, y = series_xy(s, full)
        idx = downsample_indices(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
        trace["x"], trace["y"] = [x[i] for i in idx], [y[i] for i in idx]


def build_graph(graph: str, view: RunView, rank: int = 0, cursor: int | None = None,
                spikes: Sequence[int] | None = None, smooth: float = 0.0,
                x: XAxis | None = None) -> tuple[Fig, list[Series]]:
    """A whole figure for ``graph`` from the view's (downsampled) frames; ``spikes`` (the run's facts)
    are the loss chart's markers when given; ``smooth`` > 0 adds EMA lines to loss and throughput; ``x``:
    the step graphs' x axis (step, relative or wall time; :mod:`gpudash.server.layouts.xaxis`)."""
    live = view.status == "live"
    f = view.frames
    specs = graph_specs(graph, f, rank, view.meta, smooth)
    if graph in STEP_GRAPHS:
        specs = with_x(specs, x)
    if graph == "memory-graph":
        fig, _ = memory.memory_figure(view.frame("memory"), view.meta, view.frame("events"), rank, specs, live)
    elif graph == "step-time-graph":
        fig = throughput.step_time_figure(view.frame("steps"), specs, live)
    elif graph == "rates-graph":
        fig = throughput.rates_figure(view.frame("steps"), specs, live)
    elif graph == "phases-graph":
        fig = throughput.phase_figure(view.frame("steps"), specs, live)
    elif graph == "loss-graph":
        fig = stability.loss_figure(view.frame("steps"), specs, live)
        if spikes is not None:  # looked up in every row: a downsampled frame may have dropped a spike's row
            _mark_spikes(fig, specs, view.full.get("steps", view.frame("steps")), spikes)
    elif graph == "signals-graph":
        _, titles = stability.signal_series(view.frame("steps"), view.frame("memory"), rank)
        fig = device.panels_figure("Stability signals", f, specs, view.t0, live, axis_titles=titles, xaxis_title="step")
    elif graph == "device-graph":
        fig = device.panels_figure("Device", f, specs, view.t0, live)
    elif graph == "host-graph":
        fig = device.panels_figure("Host (CPU, process memory)", f, specs, view.t0, live)
    else:
        raise KeyError(graph)
    if smooth > 0:
        _full_ema(fig, specs, view)
    if graph in CURSOR_GRAPHS:
        fig.layout["shapes"] = [cursor_shape(cursor), *(fig.layout.shapes or ())]
    if graph in STEP_GRAPHS:
        style_figure(fig, x, view.full.get("steps", view.frame("steps")))
    _mark_resumes(fig, specs, view.frame("events"), view.t0)
    return fig, specs


def _mark_resumes(fig: Fig, specs: list[Series], events: Any, t0: float) -> None:
    """A line where each later attempt resumed (its step, or its start on a time axis), with what it says."""
    if not specs:
        return  # nothing drawn: no axis to mark
    spec = specs[0]
    for r in resumes(events):
        if spec.x == "elapsed":  # the device and host panels: seconds since the run began
            if r.time is None:
                continue
            at = r.time - t0
        elif spec.x in ("relative", "wall"):
            if r.time is None:
                continue
            at = (r.time - spec.origin) * 1000.0
        elif r.step is not None:
            at = float(r.step)
        else:
            continue
        text = r.message.split(" (")[0]
        fig.add_vline(at, color="#2ca02c", dash="dash", text=plot_text(text, 80))


#: Live charts sent with the page (the first screen, and the loss chart with its spikes); the others are drawn
#: when scrolled into view (:mod:`gpudash.server.layouts.lazy`).
EAGER = ("memory-graph", "step-time-graph", "loss-graph")
#: Live charts drawn when scrolled to or opened.
LAZY = tuple(g for g in LIVE_GRAPHS if g not in EAGER)
_TITLES = {"rates-graph": "Samples/s and tokens/s", "phases-graph": "Phase breakdown per step",
           "device-graph": "Device", "host-graph": "Host (CPU, process memory)", "signals-graph": "Stability signals"}
_PANELS = ("device-graph", "host-graph", "signals-graph")
#: ``layout.meta`` of a chart not drawn yet (what a test or script can look for).
PLACEHOLDER = "gpudash-lazy"


def placeholder(graph: str, specs: list[Series]) -> Fig:
    """The frame a lazy chart shows until drawn: its title and height (no jump when it fills), the cursor
    line the replay moves (shapes[0], as on the drawn chart)."""
    n = len({s.yaxis for s in specs}) or 1
    fig = waiting_figure(base_figure(_TITLES.get(graph, ""), height=170 + 130 * n if graph in _PANELS else 300),
                         "drawn when scrolled into view")
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    fig.layout["meta"] = PLACEHOLDER
    if graph in CURSOR_GRAPHS:
        fig.layout["shapes"] = [cursor_shape(None)]
    return fig


def page_graph(graph: str, view: RunView, zoomed: RunView, rank: int, at: int | None,
               xrange: tuple[float, float] | None, spikes: list[int] | None, smooth: float,
               x: XAxis | None = None) -> tuple[Fig, list[Series]]:
    """``graph`` as the page shows it: ``zoomed`` (the address's step range) for the step charts, the cursor
    line at ``at``, the run's spike facts on the loss chart, the step charts' x axis ``x`` (a step range
    drawn as the time those steps took on a time axis)."""
    x = x or XAxis()
    fig, specs = build_graph(graph, zoomed if graph in STEP_GRAPHS else view, rank, cursor=at, spikes=spikes,
                             smooth=smooth, x=x)
    if xrange is not None and graph in STEP_GRAPHS:
        rng = time_range_of(view.full.get("steps", view.frame("steps")), x, *xrange) if x.timed else list(xrange)
        fig.update_xaxes(range=rng)
    return fig, specs


#: The run page's tables, built when scrolled to or opened: (box id, rows store id).
TABLES = (("events-box", "events-rows"), ("hotspots-box", "hotspot-rows"))
#: Class of a table's stand-in until it is built.
TABLE_PLACEHOLDER = "table-placeholder"


def table_placeholder(what: str) -> html.Div:
    """What a table's box shows until the table is built: how many rows it holds."""
    return html.Div(f"{what}: the table is drawn when scrolled into view", className=f"muted {TABLE_PLACEHOLDER}")


def build_table(box: str, rows: list[dict[str, Any]]) -> Any | None:
    """The table of ``box`` (:data:`TABLES`) for ``rows``; None where the box keeps what it says (no hot spots:
    why). The events table is built empty too: a live run's events arrive in it."""
    if box == "events-box":
        return events.events_table(rows)
    if box == "hotspots-box":
        return hotspots.hotspots_table(rows) if rows else None
    raise KeyError(box)


def _graph(graph_id: str, fig: Fig) -> html.Div:
    # its height before plotly.js has drawn it: the page does not jump, and what is below the fold stays there.
    # The box around the graph holds it: until Dash's graph script has loaded, the graph is a bare div of no
    # height (its style is not applied yet), and a lazy chart below would be in view for that moment.
    height = fig.layout.get("height") if isinstance(fig, Fig) else None
    style = {"minHeight": f"{height}px"} if isinstance(height, int | float) else {}
    return html.Div(dcc.Graph(id=graph_id, figure=fig, config=GRAPH_CONFIG, style=style,
                              className=f"graph {DRAW_FIRST}" if graph_id in EAGER else "graph"),
                    style=style, className="graph-box")


#: Sources a collector gives up on at the start (no GPU, no NVML, no psutil): a live run says why at once.
_WHOLE_RUN_REASONS = ("device", "host")


def _view(graph_id: str, view: RunView, reason_source: str | None, figs: dict[str, Fig],
          specs: dict[str, list[Series]]) -> Any:
    """The graph, or for a run with nothing recorded, one line saying why (and a hidden graph): a live run's
    only for a source whose collector noted why it records nothing for the whole run (no GPU, no NVML, no
    permission), else it waits for the first records."""
    fig = figs[graph_id]
    if specs.get(graph_id) or reason_source is None:
        return _graph(graph_id, fig)
    if view.status == "live":
        if reason_source not in _WHOLE_RUN_REASONS:
            return _graph(graph_id, fig)
        reason = recorded_reason(reason_source, view.meta, view.frame("events"))
        if reason is None:
            return _graph(graph_id, fig)
    else:
        reason = source_reason(reason_source, view.meta, view.frame("events"))
    return html.Div([note(reason, id=f"{graph_id}-reason"),
                     html.Div(_graph(graph_id, fig), style={"display": "none"})])


def summary_children(verdicts: list[Any]) -> list[Any]:
    """The post-mortem verdicts as text (title, severity, steps, evidence, recommendation, saving)."""
    out: list[Any] = []
    for v in verdicts:
        sev = str(getattr(v, "severity", "ok"))
        items: list[Any] = [html.Span(sev, className=f"sev sev-{sev}"), html.B(str(getattr(v, "title", "")))]
        evidence = getattr(v, "evidence", None) or []
        body: list[Any] = [html.Li(str(e)) for e in evidence]
        rec = getattr(v, "recommendation", None)
        if rec:
            body.append(html.Li(["→ ", str(rec)], className="rec"))
        saving = getattr(v, "saving", None)
        if saving:
            body.append(html.Li(["saves: ", str(saving)], className="saving"))
        where = getattr(v, "step_range", None)
        if where:
            items.append(html.Span(f" ({where})", className="muted step-range"))
        out.append(html.Div([html.Div(items), html.Ul(body)], className="verdict"))
    return out


#: (anchor, label) of the section navigation, in page order; "ranks-view" only exists with more than one rank.
SECTIONS = (("run-header", "Summary"), ("memory-view", "Memory"), ("throughput-view", "Throughput"),
            ("ranks-view", "Ranks"), ("device-view", "Device"), ("stability-view", "Stability"),
            ("events-view", "Events"), ("hotspots-view", "Hot spots"))


def _section(title: str, children: list[Any], sid: str) -> html.Details:
    """A section of the page that folds away (click its title); open at first."""
    return html.Details([html.Summary(html.H3(title)), *children], id=sid, className="view", open=True)


def section_nav(ranks: int) -> html.Nav:
    """Links to every section, in the replay bar that stays on screen."""
    return html.Nav([html.A(label, href=f"#{sid}", className="nav-link")
                     for sid, label in SECTIONS if sid != "ranks-view" or ranks > 1],
                    id="section-nav", className="section-nav")


def _header(p: RunPageData, last: int | None) -> html.Div:
    """Name, status, device, ranks, last step, progress, the x-axis choice, problems and the summary panel
    (filled by the summary timer)."""
    view, meta = p.view, p.view.meta
    cap = meta.get("device_capacity_bytes")
    return html.Div([
        html.Div([dcc.Link("← all runs", href=href("/")), html.H2(str(meta.get("name") or p.run_id), id="run-name")]),
        html.Div([
            html.Span(view.status, id="run-status", className=f"status status-{view.status}"),
            html.Span(f" {device_label(meta)}" + (f" ({human_bytes(float(cap))})" if cap else ""), className="muted"),
            html.Span(" · rank ", className="muted"),
            *[dcc.Link(str(r), href=href(f"/run/{p.run_id}?rank={r}"),
                       className="rank-link" + (" current" if r == p.rank else "")) for r in view.ranks],
            html.Span(" · step ", className="muted"), html.Span("-" if last is None else str(last), id="last-step"),
            html.Span(" · end: " + str(p.facts.end_reason if p.facts is not None and p.facts.end_reason else
                                       meta.get("end_reason")), className="muted")
            if (meta.get("end_reason") or (p.facts is not None and p.facts.end_reason)) and view.status != "live"
            else None,
        ]),
        html.Div(progress_bar(p.facts.progress if p.facts is not None else None), id="run-progress",
                 className="run-progress"),
        leak_line(p.facts.leak if p.facts is not None else None),
        html.Div([html.Span("x axis ", className="muted"),
                  dcc.RadioItems(id="x-mode", options=[{"label": label, "value": v} for v, label in XMODES],
                                 value=p.x.mode, inline=True, className="x-mode")],
                 className="x-mode-row"),
        html.Div([note(problem) for problem in view.problems], id="run-problems"),
        html.Div([], id="summary-panel", style={"display": "none"}),
    ], className="run-header", id="run-header")


def _replay_bar(p: RunPageData, first_step: int, last: int | None, step_s: float) -> html.Div:
    """Play, speed, events, the cursor (box and slider), smoothing and the section links."""
    at = p.cursor if p.cursor is not None else last
    auto = replay_speed((last or 0) - first_step + 1, step_s)
    top = max(last or 0, first_step + 1)
    return html.Div([
        html.Button("▶ play", id="play-button", n_clicks=0, className="button"),
        dcc.Dropdown(id="speed", options=speed_options(auto), value=auto, clearable=False, style={"width": "230px"}),
        html.Button("« prev event", id="prev-event", n_clicks=0, className="button"),
        html.Button("next event »", id="next-event", n_clicks=0, className="button"),
        html.Span("cursor: ", className="muted"), html.Span("-" if at is None else str(at), id="cursor-label"),
        html.Span(" go to step ", className="muted"),
        dcc.Input(id="cursor-input", type="number", min=first_step, max=top, step=1,
                  debounce=True, className="step-box", placeholder=str(at if at is not None else "")),
        html.Div(dcc.Slider(id="cursor-slider", min=first_step, max=top,
                            value=at if at is not None else 0, step=1, updatemode="mouseup", marks=None,
                            tooltip={"placement": "bottom", "always_visible": False}), className="slider"),
        dcc.Interval(id="play-interval", interval=TICK_MS, disabled=True),
        html.Span(" smoothing ", className="muted"),
        dcc.Dropdown(id="smoothing", options=[{"label": "off" if v == 0 else f"EMA {v:g}", "value": v} for v in SMOOTHING],
                     value=p.smooth, clearable=False, searchable=False, style={"width": "110px"}),
        section_nav(len(p.view.ranks)),
    ], className="replay-bar", id="replay-bar")


def _memory_section(p: RunPageData) -> html.Details:
    view, maps = p.view, p.snapshots
    acts_reason = None if len(view.frame("activations")) else \
        source_reason("activations", view.meta, view.frame("events"))
    snap = p.segment_map
    return _section("Memory", [
        _view("memory-graph", view, "memory", p.figs, p.specs),
        html.Div([
            html.Div(_graph("memory-at-graph", p.memory_at), className="half"),
            html.Div([html.Div([
                dcc.Dropdown(id="snapshot-pick", options=p.snapshot_options, value="cursor",
                             clearable=False, style={"flex": "1"}),
                html.Button("take a snapshot now", id="snapshot-request", n_clicks=0, className="button",
                            style={} if view.status == "live" else {"display": "none"},
                            title="the run records an allocator snapshot at the end of its next step (GPU runs)"),
                html.Span(id="snapshot-requested", className="muted"),
            ], style={"display": "flex", "gap": "8px", "alignItems": "center"}),
                      # always in the page (its callback's inputs must all exist), shown with two snapshots to compare
                      html.Div(dcc.Dropdown(id="snapshot-diff-pick", options=diff_options(maps), value="none",
                                            clearable=False), style={} if len(maps) > 1 else {"display": "none"}),
                      html.Div(_graph("segment-map", snap) if isinstance(snap, Fig) else note(str(snap)),
                               id="segment-map-box")], className="half"),
        ], className="row"),
        html.Div(p.alloc_timeline, id="alloc-timeline-box"),
        dcc.Store(id="alloc-timeline-key", data=p.alloc_timeline_key),
        html.Div(largest_children(p.largest) if p.largest is not None else None, id="largest-box"),
        html.Div(id="snapshot-diff-box"),
        html.Div(note(acts_reason) if acts_reason else _graph("activations-graph", p.activations),
                 id="activations-box"),
    ], "memory-view")


def _tables(p: RunPageData) -> tuple[html.Details, html.Details]:
    """The Events and Python hot spots sections. Their tables (dash_table's ~600 kB of script) are built when
    scrolled to or opened (layouts.lazy), from their rows, which come with the page."""
    view, ev_rows, hot_rows = p.view, p.event_rows, p.hotspot_rows
    return _section("Events", [
        _graph("events-graph", events.events_figure(view.frame("events"))),
        html.Div(table_placeholder(f"{len(ev_rows)} event(s)" if ev_rows else "no events"), id="events-box"),
        dcc.Store(id="events-rows", data=ev_rows),
    ], "events-view"), _section("Python hot spots", [
        html.Div(table_placeholder(f"{len(hot_rows)} frame(s)") if hot_rows
                 else note(source_reason("stacks", view.meta, view.frame("events"))), id="hotspots-box"),
        dcc.Store(id="hotspot-rows", data=hot_rows),
    ], "hotspots-view")


def run_page(p: RunPageData) -> html.Div:
    """The page: header, replay bar, the Memory, Throughput, Ranks (more than one rank), Device, Stability,
    Events and hot-spot sections, and the stores its callbacks keep their state in."""
    view, figs, specs, facts = p.view, p.figs, p.specs, p.facts
    # the header's step is the run's facts (the summary says the same), the view's only before they exist
    last = facts.steps - 1 if facts is not None and facts.steps else view.last_step
    first_step = int(view.frame("steps")["step"].min()) if len(view.frame("steps")) else 0
    step_s = throughput.throughput_stats(facts.recent if facts is not None else None).get("median_s") or 0.1
    tp_section = _section("Throughput", [
        html.Ul([html.Li(t) for t in throughput.stats_lines(facts)], id="throughput-stats", className="stats"),
        _view("step-time-graph", view, None, figs, specs),
        html.Div([html.Div(_view("rates-graph", view, None, figs, specs), className="half"),
                  html.Div(_view("phases-graph", view, None, figs, specs), className="half")], className="row"),
    ], "throughput-view")
    dev_section = _section("Device", [
        _view("device-graph", view, "device", figs, specs),
        _view("host-graph", view, "host", figs, specs),
    ], "device-view")
    stab_section = _section("Stability", [
        html.Div(stability.lights_row(stability.stability_lights(facts)), id="stability-lights", className="lights"),
        _view("loss-graph", view, None, figs, specs),
        _view("signals-graph", view, "allocator", figs, specs),
    ], "stability-view")
    ranks_box = html.Div(p.ranks, id="ranks-box")  # the "Ranks" section when > 1 rank
    return html.Div([
        _header(p, last), _replay_bar(p, first_step, last, step_s), _memory_section(p), tp_section, ranks_box,
        dev_section, stab_section, *_tables(p),
        dcc.Store(id="live-state", data=p.state),
        dcc.Store(id="lazy-seen"), dcc.Store(id="lazy-drawn", data=[g for g in LIVE_GRAPHS if g in p.state.get("specs", {})]),
        dcc.Store(id="cursor-follow", data={"follow": view.status == "live"}),
        dcc.Store(id="ranks-tick"),  # every RANKS_EVERY-th live tick (run_callbacks)
        *(dcc.Store(id=zoom_store(g)) for g in LIVE_GRAPHS),  # their zooms, resizes left out (viewstate.ZOOM_JS)
        dcc.Store(id="page-run", data={"run": p.run_id, "rank": p.rank, "step_s": step_s}),
        dcc.Interval(id="summary-timer", interval=1200, max_intervals=1),
        dcc.Interval(id="live-interval", interval=500, disabled=view.status != "live"),
    ], id="run-page")
