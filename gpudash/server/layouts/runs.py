"""The runs page: every run in RUNS_DIR with status, device, duration, steps, peak memory and
tokens/s, newest first, a page of :data:`PER_PAGE` at a time; tick two or more to compare them.

A folder may hold thousands of runs, so the list is built in two steps. Every run gets a cheap
entry (:func:`scan_runs`: its name and start time from ``run.json``, its files' stamp; its status
and device from the rank files' meta tables only when a search or status filter needs them); the
entries are searched, filtered, sorted and cut into pages, and only the rows of the page shown are
summarised (:func:`cached_summary`: the run loaded once, its facts kept in memory and on disk).

A cold list does not wait for a whole page of runs to load: at most :data:`SYNC_SUMMARIES` of its rows are
summarised while it waits; the others are rows from their metadata (:func:`pending_summary`: the same
columns, derived by :func:`gpudash.analysis.listing.listed_row` as a bucket's runs are, ``"pending": True``),
summarised by a background thread (:mod:`gpudash.server.background`) so the next refresh shows their facts."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dash import dcc, html
from gpudash.analysis.listing import listed_row, listed_run_row
from gpudash.analysis.progress import Progress
from gpudash.analysis.rates import fmt_mfu, fmt_rate
from gpudash.errors import RunError
from gpudash.server.background import summariser
from gpudash.server.layouts.common import fmt_s, note
from gpudash.server.layouts.links import href
from gpudash.server.layouts.progressbar import progress_cell
from gpudash.server.runcache import WAIT_S, RunBusy, shared_cache
from gpudash.server.runcache import run_stamp as _run_stamp
from gpudash.store.bounded import damage
from gpudash.store.listed import listed_run
from gpudash.store.listing import rank_listings
from gpudash.store.meta import parse_run_json
from gpudash.store.mirror import origin_of
from gpudash.store.reader import read_run_json
from gpudash.store.run import merged_meta, run_start
from gpudash.store.runid import list_run_dirs
from gpudash.store.schema import rank_from_db_name
from gpudash.store.segments import SEGMENTS_DIR
from gpudash.store.summarystore import summary_store
from gpudash.units import human_bytes

__all__ = ["PER_PAGE", "REFRESH_MS", "STATUS_FILTERS", "RunEntry", "RunsPage", "list_page", "listed_summary", "pending_summary", "SYNC_SUMMARIES", "page_of", "scan_runs", "runs_count", "cached_summary", "device_label", "filter_runs", "list_runs", "row_signature", "shown_signature",
           "page_label", "read_meta", "run_stamp", "run_summary", "runs_page", "runs_table"]

#: The runs page's status filter: (value, label).
STATUS_FILTERS = (("all", "all runs"), ("live", "live"), ("finished", "finished"), ("crashed", "crashed"),
                  ("unreadable", "unreadable"))
#: How often the runs page asks for the list again (a run started after the page opened appears within ~2 s).
REFRESH_MS = 1000
#: Rows on one page of the runs list (only these are summarised).
PER_PAGE = 50
#: Runs one list request summarises while it waits; a page's other runs never summarised are shown from their
#: metadata and summarised in the background (a cold first page of 50 runs answers in well under 2 s).
SYNC_SUMMARIES = 10


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
                           "samples_per_s": None, "mfu": None, "ranks": 0, "end_reason": None, "problems": [], "facts": None,
                           "progress": None}
    try:
        loaded = shared_cache().get(path, timeout=WAIT_S)
    except RunBusy as exc:
        out.update(problems=[str(exc)], retry=True)
        return out
    except RunError as exc:
        out["problems"] = [str(exc)]
        return out
    except Exception as exc:  # noqa: BLE001 - one run's damage is its row's note; the others are listed
        out["problems"] = [f"{path.name}: unreadable ({damage(exc)})"]
        return out
    run, facts = loaded.run, loaded.facts
    meta = run.meta
    head = facts.to_json()["headline"]
    out.update(name=str(meta.get("name") or run_id), status=facts.status, ranks=facts.ranks,
               device=device_label(meta), started=run.start,
               end_reason=meta.get("end_reason") if isinstance(meta.get("end_reason"), str) else None,
               steps=facts.steps, peak_bytes=head["peak_memory_bytes"], duration_s=head["duration_s"],
               tokens_per_s=head["tokens_per_s"], samples_per_s=head["samples_per_s"], mfu=head.get("mfu"),
               problems=list(run.problems), facts=facts.to_json())
    out["progress"] = out["facts"]["progress"]
    return out


def run_stamp(path: Path) -> tuple[Any, ...]:
    """Changes whenever any file of the run changes (see :func:`gpudash.server.runcache.run_stamp`)."""
    return _run_stamp(path)


#: Summaries kept in memory: more than a team's runs folder holds (a bound smaller than the folder would
#: load every run again on every listing: a scan through an LRU cache evicts what the next scan needs).
CACHE_RUNS = 20_000
_CACHE: OrderedDict[Path, tuple[tuple[Any, ...], dict[str, Any]]] = OrderedDict()


def cached_summary(run_id: str, path: Path, stamp: tuple[Any, ...] | None = None,
                   status: str | None = None, sync: list[int] | None = None) -> dict[str, Any]:
    """:func:`run_summary`, kept per run until one of its files changes (a list of many finished runs
    must not keep the run cache busy loading them again); finished and crashed runs' summaries are also
    kept on disk (:mod:`gpudash.store.summarystore`), so a restarted server lists them at once.

    ``stamp`` / ``status``: the run's stamp and cheap status when the caller has them (:class:`RunEntry`).
    A live run whose files did not change is summarised again only when its status moved (its writer
    stopped: the heartbeat went stale).

    ``sync``: how many more runs the caller waits to summarise (``[n]``, counted down; None: no limit). A run
    never summarised in this process, with none kept on disk, past that count is its :func:`pending_summary`,
    summarised in the background (a run summarised before, now changed, is summarised at once)."""
    if origin_of(path) is not None and shared_cache().current(path) is None:
        listed = listed_summary(run_id, path)  # in an object store and not opened: its metadata, no segment
        listed.pop("meta", None)
        return listed
    stamp = run_stamp(path) if stamp is None else stamp
    hit = _CACHE.get(path)
    if hit is not None and hit[0] == stamp:
        if hit[1]["status"] != "live" or (status or _read_status(path)) == "live":
            _CACHE.move_to_end(path)
            return dict(hit[1], id=run_id)
    out = summary_store().get(path, stamp)
    if out is None:
        if sync is not None and sync[0] <= 0 and hit is None:
            pending = pending_summary(run_id, path)
            if pending is not None:
                summariser().ask(path, lambda: cached_summary(run_id, path))
                return pending
        if sync is not None:
            sync[0] -= 1
        out = run_summary(run_id, path)
        if out.pop("retry", False):
            return dict(out, id=run_id)  # busy elsewhere: asked again next time, never kept
        if out["status"] in ("finished", "crashed"):
            summary_store().put(path, stamp, out)
    out = dict(out, id=run_id)
    _CACHE[path] = (stamp, out)
    _CACHE.move_to_end(path)
    while len(_CACHE) > CACHE_RUNS:
        _CACHE.popitem(last=False)
    return out


def list_runs(runs_dir: Path) -> list[dict[str, Any]]:
    """Summaries of every run in ``runs_dir``, newest first (``/api/runs``; the page summarises one page)."""
    rows = [cached_summary(run_id, path) for run_id, path in list_run_dirs(runs_dir)]
    rows.sort(key=lambda r: r.get("started") or 0.0, reverse=True)
    return rows


# ---- the cheap list: every run, nothing loaded ----------------------------------------------------------

@dataclass
class RunEntry:
    """What the runs list knows of a run without loading it: ``name`` and ``started`` from ``run.json``;
    ``status`` and ``device`` (``None`` until read) from the rank files' meta tables (:func:`read_meta`)."""

    id: str
    path: Path
    stamp: tuple[Any, ...]
    name: str
    started: float | None
    status: str | None = None
    device: str | None = None

    def row(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "started": self.started, "status": self.status,
                "device": self.device}


def _run_json(path: Path) -> dict[str, Any]:
    """``run.json`` read as the store reads it (regular file, bounded size, facts checked and trimmed);
    what is wrong with it is said by the run's summary. A run listed from an object store: as listed."""
    listed = listed_run(path)
    if listed is not None:
        return parse_run_json(listed.run_json, []) if listed.run_json is not None else {}
    return read_run_json(path, [])


def _has_rank_files(stamp: tuple[Any, ...]) -> bool:
    return any(rank_from_db_name(str(name).removesuffix("-wal")) is not None for name, *_ in stamp)


def listed_summary(run_id: str, path: Path) -> dict[str, Any]:
    """The row of a run listed from an object store and not opened (:func:`gpudash.analysis.listing.listed_row`:
    its ``run.json`` and ranks' ``meta.json`` only), with ``meta`` (the merged meta)."""
    row = listed_run_row(run_id, path)
    row["device"] = device_label(row["meta"])
    return row


def pending_summary(run_id: str, path: Path) -> dict[str, Any] | None:
    """The row of a local run not summarised yet, from its metadata (``run.json``, its ranks' meta tables
    and a tally of their steps and memory, :func:`gpudash.store.listing.rank_listings`; a run published as
    segments: its ``meta.json``): :func:`gpudash.analysis.listing.listed_row`, the columns its facts give
    once summarised, with ``"pending": True``. None when its files cannot be opened (its summary says why)."""
    if (path / SEGMENTS_DIR).is_dir():
        row = listed_run_row(run_id, path)
    else:
        problems: list[str] = []
        try:
            reader, lock = shared_cache().reader(path)
            if not lock.acquire(timeout=WAIT_S):
                return None
            try:
                metas = rank_listings(reader.ranks)
            finally:
                lock.release()
        except Exception:  # noqa: BLE001 - RunError, a damaged file: summarised at once, which says why
            return None
        if not metas:
            return None
        row = listed_row(run_id, read_run_json(path, problems), metas, problems)
        row["problems"] = problems  # not a published run's: no rank left records unpublished
    row["device"] = device_label(row.pop("meta"))
    row["pending"] = True
    return row


def _cheap_meta(path: Path) -> tuple[dict[str, Any], str]:
    """The run's merged meta and status as the store decides them (the meta tables and heartbeats only:
    no table is read; a run in an object store: its metadata only, :func:`listed_summary`)."""
    if origin_of(path) is not None:
        row = listed_summary(path.name, path)
        return row["meta"], row["status"]
    try:
        reader, lock = shared_cache().reader(path)  # the one place the server opens runs
        if not lock.acquire(timeout=WAIT_S):
            return {}, "unreadable"
        try:
            rank_meta = reader.rank_meta()
            status = reader.status()
            return merged_meta(reader, rank_meta, status), status
        finally:
            lock.release()
    except Exception:  # noqa: BLE001 - RunError, or a run that cannot be read at all: its summary says why
        return {}, "unreadable"


def _read_status(path: Path) -> str:
    return _cheap_meta(path)[1]


def read_meta(entry: RunEntry) -> RunEntry:
    """Fill ``status``, ``device`` (and ``name`` / ``started`` where ``run.json`` lacks them) from the meta tables."""
    meta, status = _cheap_meta(entry.path)
    entry.status = status
    entry.device = device_label(meta) if meta else "?"
    entry.name = str(meta.get("name") or entry.name)
    if entry.started is None:
        entry.started = run_start(meta)
    return entry


_ENTRIES: dict[Path, RunEntry] = {}


def scan_runs(runs_dir: Path) -> list[RunEntry]:
    """A :class:`RunEntry` per run in ``runs_dir`` (its files stat'ed, ``run.json`` read when they changed).
    Kept per run until a file changes; a live run's status is read again each scan that needs it (it turns
    ``crashed`` when its heartbeat goes stale, without any file changing)."""
    out = []
    seen = set()
    for run_id, path in list_run_dirs(runs_dir):
        stamp = run_stamp(path)
        seen.add(path)
        entry = _ENTRIES.get(path)
        if entry is None or entry.stamp != stamp or entry.id != run_id:
            meta = _run_json(path)
            entry = RunEntry(id=run_id, path=path, stamp=stamp, name=str(meta.get("name") or run_id),
                             started=run_start(meta))
            if entry.started is None and (_has_rank_files(stamp) or listed_run(path) is not None):
                read_meta(entry)  # the start time is only in the rank files
            _ENTRIES[path] = entry
        elif entry.status == "live":
            entry.status = None  # read again when needed
        out.append(entry)
    root = runs_dir.resolve()
    for gone in set(_ENTRIES) - seen:
        if gone.parent == root:
            _ENTRIES.pop(gone, None)  # a run deleted (another server thread may have dropped it already)
    return out


@dataclass
class RunsPage:
    """One page of the runs list: ``rows`` (page ``page`` of ``pages``, 0-based), ``matching`` runs pass the
    search and status filter, ``total`` runs in the folder."""

    rows: list[dict[str, Any]]
    page: int
    pages: int
    matching: int
    total: int
    first: int  # index of the page's first row among the matching runs


def page_of(rows: list[dict[str, Any]], query: str | None = None, status: str | None = None, page: int = 0,
            per_page: int = PER_PAGE) -> tuple[list[dict[str, Any]], int, int, int]:
    """Search and filter ``rows`` (:func:`filter_runs`), sort them newest first, cut page ``page`` (0-based,
    clamped to the last page). Returns (the page's rows, the page, the number of pages, matching rows)."""
    matching = filter_runs(rows, query, status)
    matching.sort(key=lambda r: r.get("started") or 0.0, reverse=True)
    pages = max(1, -(-len(matching) // per_page))
    page = min(max(0, int(page)), pages - 1)
    return matching[page * per_page:(page + 1) * per_page], page, pages, len(matching)


def list_page(runs_dir: Path, query: str | None = None, status: str | None = None, page: int = 0,
              per_page: int | None = None) -> RunsPage:
    """Page ``page`` of the runs list, newest first, after the search and status filter; only its rows are
    summarised (:func:`cached_summary`), at most :data:`SYNC_SUMMARIES` of them while the caller waits."""
    entries = scan_runs(runs_dir)
    if (status and status != "all") or str(query or "").strip():
        for e in entries:
            if e.status is None:  # the filter and the device search need the meta tables (kept per stamp)
                read_meta(e)
    per_page = per_page or PER_PAGE
    by_id = {e.id: e for e in entries}
    shown, page, pages, matching = page_of([e.row() for e in entries], query, status, page, per_page)
    rows = []
    sync = [SYNC_SUMMARIES]
    for r in shown:
        e = by_id[r["id"]]
        rows.append(cached_summary(e.id, e.path, e.stamp, e.status, sync))
    return RunsPage(rows=rows, page=page, pages=pages, matching=matching, total=len(entries),
                    first=page * per_page)


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
            "samples_per_s", "mfu", "end_reason", "progress")
    return [[r.get(k) for k in keys] for r in rows]


def shown_signature(listing: RunsPage) -> list[Any]:
    """What the page shows (the pager and the rows): the live refresh redraws only when this changes."""
    return [listing.page, listing.pages, listing.matching, listing.total, row_signature(listing.rows)]


def runs_table(runs_dir: Path, rows: list[dict[str, Any]], picked: set[str] | None = None,
               total: int | None = None) -> Any:
    """The table of ``rows`` (``picked``: run ids whose compare box stays ticked), or a line saying why it is empty."""
    picked = picked or set()
    if not rows:
        if total:
            return note(f"no run matches the search or status filter ({total} run(s) in {runs_dir})")
        return note(f"no runs in {runs_dir} yet (start one: gpudash demo, or wrap a loop in Monitor); "
                    "this list updates by itself")
    head = ["", "run", "status", "device", "started", "duration", "steps", "progress", "peak memory", "tokens/s",
            "samples/s", "MFU"]
    body = []
    for r in rows:
        body.append(html.Tr([
            html.Td(dcc.Checklist(id={"type": "compare-pick", "run": r["id"]}, options=[{"label": "", "value": r["id"]}],
                                  value=[r["id"]] if r["id"] in picked else [], inline=True)),
            html.Td(dcc.Link(r["name"], href=href(f"/run/{r['id']}"), className="run-link")),
            html.Td(html.Span(r["status"], className=f"status {_STATUS_CLASS.get(r['status'], '')}"),
                    title=r.get("end_reason") or ""),
            html.Td(r["device"]),
            html.Td(_started(r.get("started"))),
            html.Td(fmt_s(r.get("duration_s"))),
            html.Td(f"{r['steps']:,}"),
            html.Td(progress_cell(Progress.from_json(r.get("progress")), r.get("status")), className="progress-cell"),
            html.Td(human_bytes(r.get("peak_bytes"))),
            html.Td(fmt_rate(r.get("tokens_per_s"))),
            html.Td(fmt_rate(r.get("samples_per_s"))),
            html.Td(fmt_mfu(r.get("mfu"))),
        ], className="run-row", id={"type": "run-row", "run": r["id"]}))
    return html.Table([html.Thead(html.Tr([html.Th(h) for h in head])), html.Tbody(body)], id="runs-table",
                      className="runs-table")


def runs_count(runs_dir: Path, shown: int, total: int) -> str:
    """``1000 run(s) in RUNS_DIR``, and how many pass the search and status filter when not all do."""
    return f"{total} run(s) in {runs_dir}" + (f", {shown} match" if shown != total else "")


def page_label(listing: RunsPage) -> str:
    """``1–50 of 1000 · page 1 of 20``."""
    if not listing.rows:
        return ""
    return (f"{listing.first + 1}–{listing.first + len(listing.rows)} of {listing.matching} · "
            f"page {listing.page + 1} of {listing.pages}")


def runs_page(runs_dir: Path, rows: list[dict[str, Any]], listing: RunsPage | None = None) -> html.Div:
    """The page: ``listing`` (:func:`list_page`), or all of ``rows`` on one page."""
    if listing is None:
        listing = RunsPage(rows=rows, page=0, pages=1, matching=len(rows), total=len(rows), first=0)
    return html.Div([
        html.H2("Runs"),
        html.Div([
            dcc.Input(id="runs-search", type="search", placeholder="search name, id or device", debounce=False,
                      value="", className="search"),
            dcc.RadioItems(id="runs-status", options=[{"label": label, "value": v} for v, label in STATUS_FILTERS],
                           value="all", inline=True, className="status-filter"),
            html.Span(runs_count(runs_dir, listing.matching, listing.total), id="runs-count", className="muted"),
        ], className="runs-tools"),
        html.Div(runs_table(runs_dir, listing.rows, total=listing.total), id="runs-table-box"),
        html.Div([
            html.Button("← newer", id="runs-prev", n_clicks=0, className="button", disabled=listing.page == 0),
            html.Span(page_label(listing), id="runs-page-label", className="muted"),
            html.Button("older →", id="runs-next", n_clicks=0, className="button",
                        disabled=listing.page >= listing.pages - 1),
        ], className="runs-tools runs-pager"),  # laid out like the search bar
        dcc.Store(id="runs-page-no", data=listing.page),
        dcc.Store(id="runs-shown", data=shown_signature(listing)),
        dcc.Interval(id="runs-interval", interval=REFRESH_MS),
        html.Div([dcc.Link("Compare selected runs", id="compare-link", href=href("/compare"), className="button"),
                  html.Span(" tick two or more runs", className="muted")], className="compare-bar"),
    ], id="runs-page")
