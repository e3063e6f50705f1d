"""The runs page: every run in RUNS_DIR with status, device, duration, steps, peak memory and
tokens/s, newest first; tick two or more to compare them."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

from dash import dcc, html
from gpudash.analysis.runcache import run_stamp as _run_stamp
from gpudash.analysis.runcache import shared_cache
from gpudash.analysis.summarystore import summary_store
from gpudash.errors import RunError
from gpudash.layouts.common import fmt_bytes, fmt_num, fmt_s, note
from gpudash.layouts.runid import list_run_dirs

__all__ = ["REFRESH_MS", "STATUS_FILTERS", "runs_count", "cached_summary", "device_label", "filter_runs", "list_runs", "row_signature",
           "run_stamp", "run_summary", "runs_page", "runs_table"]

#: The runs page's status filter: (value, label).
STATUS_FILTERS = (("all", "all runs"), ("live", "live"), ("finished", "finished"), ("crashed", "crashed"),
                  ("unreadable", "unreadable"))
#: How often the runs page asks for the list again (a run started after the page opened appears within ~2 s).
REFRESH_MS = 1000


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def device_label(meta: dict[str, Any]) -> str:
    """``NVIDIA H100 80GB HBM3`` on a GPU, ``cpu`` on a CPU run."""
    device = str(meta.get("device") or "")
    if device and not device.startswith("cuda"):
        return device
    return str(meta.get("device_name") or device or "?")


def run_summary(run_id: str, path: Path) -> dict[str, Any]:
    """One row of the runs page (and the head of ``/api/runs/<id>/summary``): the run as the one run cache
    loaded it, its headline numbers from :class:`gpudash.analysis.facts.Facts` (``"facts"`` holds them all)."""
    out: dict[str, Any] = {"id": run_id, "name": run_id, "status": "unreadable", "device": "?", "started": None,
                           "duration_s": None, "steps": 0, "peak_bytes": None, "tokens_per_s": None,
                           "samples_per_s": None, "ranks": 0, "end_reason": None, "problems": [], "facts": None}
    try:
        loaded = shared_cache().get(path)
    except RunError as exc:
        out["problems"] = [str(exc)]
        return out
    run, facts = loaded.run, loaded.facts
    meta = run.meta
    head = facts.to_json()["headline"]
    out.update(name=str(meta.get("name") or run_id), status=facts.status, ranks=facts.ranks,
               device=device_label(meta), started=_num(meta.get("created_at") or meta.get("started_at")),
               end_reason=meta.get("end_reason") if isinstance(meta.get("end_reason"), str) else None,
               steps=facts.steps, peak_bytes=head["peak_memory_bytes"], duration_s=head["duration_s"],
               tokens_per_s=head["tokens_per_s"], samples_per_s=head["samples_per_s"],
               problems=list(run.problems), facts=facts.to_json())
    return out


def run_stamp(path: Path) -> tuple[Any, ...]:
    """Changes whenever any file of the run changes (see :func:`gpudash.analysis.runcache.run_stamp`)."""
    return _run_stamp(path)


#: Summaries kept in memory: more than a team's runs folder holds (a bound smaller than the folder would
#: load every run again on every listing: a scan through an LRU cache evicts what the next scan needs).
CACHE_RUNS = 20_000
_CACHE: OrderedDict[Path, tuple[tuple[Any, ...], dict[str, Any]]] = OrderedDict()


def cached_summary(run_id: str, path: Path) -> dict[str, Any]:
    """:func:`run_summary`, kept per run until one of its files changes (a list of many finished runs
    must not keep the run cache busy loading them again); finished and crashed runs' summaries are also
    kept on disk (:mod:`gpudash.analysis.summarystore`), so a restarted server lists them at once."""
    stamp = run_stamp(path)
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == stamp and hit[1]["status"] != "live":
        _CACHE.move_to_end(path)
        return dict(hit[1], id=run_id)
    out = summary_store().get(path, stamp)
    if out is None:
        out = run_summary(run_id, path)
        if out["status"] in ("finished", "crashed"):
            summary_store().put(path, stamp, out)
    out = dict(out, id=run_id)
    _CACHE[path] = (stamp, out)
    _CACHE.move_to_end(path)
    while len(_CACHE) > CACHE_RUNS:
        _CACHE.popitem(last=False)
    return out


def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Summaries of every run in ``runs_dir``, newest first."""
    rows = [cached_summary(run_id, path) for run_id, path in list_run_dirs(runs_dir)]
    rows.sort(key=lambda r: r.get("started") or 0.0, reverse=True)
    return rows


_STATUS_CLASS = {"live": "status-live", "finished": "status-finished", "crashed": "status-crashed"}


def _started(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def filter_runs(rows: list[dict[str, Any]], query: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
    """The rows whose name, id or device contains every word of ``query`` (any case), of ``status`` ("all": any)."""
    words = [w for w in str(query or "").lower().split() if w]
    out = []
    for r in rows:
        if status and status != "all" and r.get("status") != status:
            continue
        hay = " ".join(str(r.get(k) or "") for k in ("name", "id", "device")).lower()
        if all(w in hay for w in words):
            out.append(r)
    return out


def row_signature(rows: list[dict[str, Any]]) -> list[list[Any]]:
    """What the table shows of each row: the table is redrawn only when this changes."""
    keys = ("id", "name", "status", "device", "started", "duration_s", "steps", "peak_bytes", "tokens_per_s",
            "samples_per_s", "end_reason")
    return [[r.get(k) for k in keys] for r in rows]


def runs_table(runs_dir: Path, rows: list[dict[str, Any]], picked: set[str] | None = None,
               total: int | None = None) -> Any:
    """The table of ``rows`` (``picked``: run ids whose compare box stays ticked), or a line saying why it is empty."""
    picked = picked or set()
    if not rows:
        if total:
            return note(f"no run matches the search or status filter ({total} run(s) in {runs_dir})")
        return note(f"no runs in {runs_dir} yet (start one: gpudash demo, or wrap a loop in Monitor); "
                    "this list updates by itself")
    head = ["", "run", "status", "device", "started", "duration", "steps", "peak memory", "tokens/s", "samples/s"]
    body = []
    for r in rows:
        body.append(html.Tr([
            html.Td(dcc.Checklist(id={"type": "compare-pick", "run": r["id"]}, options=[{"label": "", "value": r["id"]}],
                                  value=[r["id"]] if r["id"] in picked else [], inline=True)),
            html.Td(dcc.Link(r["name"], href=f"/run/{r['id']}", className="run-link")),
            html.Td(html.Span(r["status"], className=f"status {_STATUS_CLASS.get(r['status'], '')}"),
                    title=r.get("end_reason") or ""),
            html.Td(r["device"]),
            html.Td(_started(r.get("started"))),
            html.Td(fmt_s(r.get("duration_s"))),
            html.Td(f"{r['steps']:,}"),
            html.Td(fmt_bytes(r.get("peak_bytes"))),
            html.Td(fmt_num(r.get("tokens_per_s"))),
            html.Td(fmt_num(r.get("samples_per_s"))),
        ], className="run-row", id={"type": "run-row", "run": r["id"]}))
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)], id="runs-table",
                      className="runs-table")


def runs_count(runs_dir: Path, shown: int, total: int) -> str:
    return f"{total} run(s) in {runs_dir}" + (f", {shown} shown" if shown != total else "")


def runs_page(runs_dir: Path, rows: list[dict[str, Any]]) -> html.Div:
    return html.Div([
        html.H2("Runs"),
        html.Div([
            dcc.Input(id="runs-search", type="search", placeholder="search name, id or device", debounce=False,
                      value="", className="search"),
            dcc.RadioItems(id="runs-status", options=[{"label": label, "value": v} for v, label in STATUS_FILTERS],
                           value="all", inline=True, className="status-filter"),
            html.Span(runs_count(runs_dir, len(rows), len(rows)), id="runs-count", className="muted"),
        ], className="runs-tools"),
        html.Div(runs_table(runs_dir, rows), id="runs-table-box"),
        dcc.Store(id="runs-shown", data=row_signature(rows)),
        dcc.Interval(id="runs-interval", interval=REFRESH_MS),
        html.Div([dcc.Link("Compare selected runs", id="compare-link", href="/compare", className="button"),
                  html.Span(" tick two or more runs", className="muted")], className="compare-bar"),
    ], id="runs-page")
