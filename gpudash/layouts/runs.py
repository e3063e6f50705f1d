"""The runs page: every run in RUNS_DIR with status, device, duration, steps, peak memory and
tokens/s, newest first; tick two or more to compare them."""

from __future__ import annotations

import math
import sqlite3
import time
from pathlib import Path
from typing import Any

from dash import dcc, html
from gpudash.errors import RunError
from gpudash.layouts.common import fmt_bytes, fmt_num, fmt_s, note
from gpudash.layouts.data import run_meta
from gpudash.layouts.runid import list_run_dirs
from gpudash.store.reader import RunReader

__all__ = ["cached_summary", "device_label", "list_runs", "run_stamp", "run_summary", "runs_page"]

_CATS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")


def _agg(conn: sqlite3.Connection, sql: str) -> Any:
    try:
        return conn.execute(sql).fetchone()
    except sqlite3.DatabaseError:
        return None


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
    """Headline numbers of one run from SQL aggregates (fast on a million steps)."""
    out: dict[str, Any] = {"id": run_id, "name": run_id, "status": "unreadable", "device": "?", "started": None,
                           "duration_s": None, "steps": 0, "peak_bytes": None, "tokens_per_s": None,
                           "samples_per_s": None, "ranks": 0, "end_reason": None, "problems": []}
    try:
        reader = RunReader(path)
    except RunError as exc:
        out["problems"] = [str(exc)]
        return out
    try:
        meta = run_meta(reader)
        out.update(name=str(meta.get("name") or run_id), status=reader.status(), ranks=len(reader.ranks),
                   device=device_label(meta),
                   started=_num(meta.get("created_at") or meta.get("started_at")),
                   end_reason=meta.get("end_reason") if isinstance(meta.get("end_reason"), str) else None)
        steps = 0
        t_lo, t_hi, tokens, samples, peak = math.inf, -math.inf, 0.0, 0.0, None
        for r in reader.ranks.values():
            row = _agg(r.conn, "SELECT max(step), min(time), max(time) FROM steps")
            if row and row[0] is not None:
                steps = max(steps, int(row[0]) + 1)
                t_lo, t_hi = min(t_lo, row[1]), max(t_hi, row[2])
            cols = set(r.columns("steps"))
            for col in ("tokens", "samples"):
                if col in cols:
                    v = _agg(r.conn, f'SELECT sum("{col}") FROM steps')
                    if v and v[0] is not None:
                        if col == "tokens":
                            tokens += float(v[0])
                        else:
                            samples += float(v[0])
            mcols = set(r.columns("memory"))
            best = [c for c in ("reserved_bytes", "allocated_bytes") if c in mcols]
            if best:
                v = _agg(r.conn, f'SELECT max("{best[0]}") FROM memory')
            else:
                cats = [c for c in _CATS if c in mcols]
                v = _agg(r.conn, "SELECT " + " + ".join(f'coalesce(max("{c}"), 0)' for c in cats) + " FROM memory") \
                    if cats else None
            if v and v[0] is not None:
                peak = max(peak or 0.0, float(v[0]))
        span = t_hi - t_lo if t_hi > t_lo else None
        end = _num(meta.get("ended_at")) or _num(meta.get("heartbeat")) or (t_hi if t_hi > -math.inf else None)
        out.update(steps=steps, peak_bytes=peak,
                   duration_s=(end - out["started"]) if end and out["started"] else span,
                   tokens_per_s=tokens / span if span and tokens else None,
                   samples_per_s=samples / span if span and samples else None,
                   problems=reader.all_problems())
    finally:
        reader.close()
    return out


_CACHE: dict[Path, tuple[tuple[Any, ...], dict[str, Any]]] = {}


def run_stamp(path: Path) -> tuple[Any, ...]:
    """Changes whenever any file of the run changes (a finished run's summary is computed once)."""
    out = []
    for p in sorted(path.iterdir()):
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((p.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


def cached_summary(run_id: str, path: Path) -> dict[str, Any]:
    stamp = run_stamp(path)
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == stamp and hit[1]["status"] != "live":
        return dict(hit[1], id=run_id)
    out = run_summary(run_id, path)
    if len(_CACHE) > 512:
        _CACHE.clear()
    _CACHE[path] = (stamp, out)
    return out


def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Summaries of every run in ``runs_dir``, newest first."""
    rows = [cached_summary(run_id, path) for run_id, path in list_run_dirs(runs_dir)]
    rows.sort(key=lambda r: r.get("started") or 0.0, reverse=True)
    return rows


_STATUS_CLASS = {"live": "status-live", "finished": "status-finished", "crashed": "status-crashed"}


def _started(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def runs_page(runs_dir: Path, rows: list[dict[str, Any]]) -> html.Div:
    head = ["", "run", "status", "device", "started", "duration", "steps", "peak memory", "tokens/s", "samples/s"]
    body = []
    for r in rows:
        body.append(html.Tr([
            html.Td(dcc.Checklist(id={"type": "compare-pick", "run": r["id"]}, options=[{"label": "", "value": r["id"]}],
                                  value=[], inline=True)),
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
        ], className="run-row"))
    table = html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)], id="runs-table",
                       className="runs-table") if rows else note(f"no runs in {runs_dir} yet "
                                                                 "(start one: gpudash demo, or wrap a loop in Monitor)")
    return html.Div([
        html.H2("Runs"),
        html.Div(f"{len(rows)} run(s) in {runs_dir}", className="muted"),
        table,
        html.Div([dcc.Link("Compare selected runs", id="compare-link", href="/compare", className="button"),
                  html.Span(" tick two or more runs", className="muted")], className="compare-bar"),
    ], id="runs-page")
