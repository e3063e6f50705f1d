"""Assemble pages from a reader: the run page's figures and state, snapshots, range re-queries,
the summary verdicts. Callbacks in :mod:`gpudash.server.app` are thin wrappers over these."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
from dash import html
from gpudash.server.layouts import events, hotspots, memory, ranks
from gpudash.server.layouts.data import STEP_TABLES, RunView, downsample_frame, load_view, rolled_frame
from gpudash.server.layouts.downsample import MAX_POINTS
from gpudash.server.layouts.live import initial_state
from gpudash.server.layouts.run_page import (
    EAGER,
    GRAPH_CONFIG,
    LIVE_GRAPHS,
    STEP_GRAPHS,
    graph_specs,
    page_graph,
    placeholder,
    run_page,
)
from gpudash.server.layouts.run_page_data import RunPageData
from gpudash.server.layouts.snapshot_page import is_snapshot_only, snapshot_page
from gpudash.server.layouts.snapshot_views import (
    alloc_timeline_child,
    alloc_timeline_figure,
    alloc_timeline_view,
    load_snapshots,
    map_key,
    pick_snapshot,
    segment_map_view,
    snapshot_options,
    timeline_of,
)
from gpudash.server.layouts.xaxis import XAxis, x_origin
from gpudash.store.reader import RunReader
from gpudash.store.schema import NUMERIC_TABLES, SNAPSHOT_REQUEST_FILE

__all__ = [
    "activations_at",
    "build_run_page",
    "facts_for",
    "known_tables",
    "load_snapshots",
    "memory_row_at",
    "pick_snapshot",
    "range_view",
    "request_snapshot",
    "segment_map_view",
    "snapshot_options",
    "verdicts_for",
]


def request_snapshot(run_dir: Path) -> Path:
    """Ask a live run for an allocator snapshot: the snapshots collector takes one at the end of the next
    step when ``RUN_DIR/snapshot.request`` appears (``run_dir`` is already resolved inside RUNS_DIR)."""
    from gpudash.store.bounded import open_below

    path = run_dir / SNAPSHOT_REQUEST_FILE
    # never through a link: a snapshot.request linked to another file (another run's rank0.db) is refused
    fd = open_below(run_dir, SNAPSHOT_REQUEST_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with os.fdopen(fd, "w") as f:
        f.write(f"{time.time()}\n")
    return path


def memory_row_at(reader: RunReader, step: int, rank: int = 0, lookback: int = 500) -> pd.DataFrame:
    """Memory rows of ``rank`` just before and at ``step`` (for the breakdown at the cursor)."""
    r = reader.ranks.get(rank)
    if r is None:
        return pd.DataFrame()
    df = r.rows_near_step("memory", step, lookback)
    if "_rowid" in df:
        df = df.drop(columns="_rowid")
    df.insert(0, "rank", rank)
    return df


def activations_at(reader: RunReader, step: int, rank: int = 0) -> pd.DataFrame:
    """Activation rows of the last sampled step at or before ``step``."""
    r = reader.ranks.get(rank)
    if r is None:
        return pd.DataFrame()
    df = r.last_sample_at("activations", step)
    if "_rowid" in df:
        df = df.drop(columns="_rowid")
    df.insert(0, "rank", rank)
    return df


def verdicts_for(path: Any) -> list[Any] | None:
    """``gpudash.analysis.summarize`` of the run, through the one run cache (computed once per change)."""
    from gpudash.server.runcache import shared_cache

    try:
        return list(shared_cache().get(path).verdicts())
    except Exception:  # noqa: BLE001 - analysis bugs or a damaged run must not take the page down
        return None


def facts_for(path: Any) -> Any | None:
    """The run's :class:`gpudash.analysis.facts.Facts` from the one run cache; None if it cannot be read."""
    from gpudash.server.runcache import shared_cache

    try:
        return shared_cache().get(path).facts
    except Exception:  # noqa: BLE001 - a damaged run must not take the page down
        return None


def warm_run(path: Any) -> None:
    """A head start on a run's page before anyone asks for it (``gpudash serve`` does it for the newest run): its
    facts, and its snapshots decoded with the newest one's whole-trace timeline built, into the caches the first
    request reads (a million-entry snapshot takes seconds to decode). Errors are left to that request."""
    from gpudash.server.runcache import shared_cache

    facts_for(path)
    reader, lock = shared_cache().reader(path)
    with lock:
        maps = load_snapshots(reader)
    if maps and timeline_of(maps[-1]) is not None:
        alloc_timeline_figure(maps[-1])


def known_tables(path: Any) -> dict[str, Any] | None:
    """The step tables of a finished run as the run cache read them, when no file of the run changed since:
    a page then reads a million-step run once (for the analysis), not once more for its charts. None for a
    live run (its page notes how far it read, and must hold exactly those rows) or one not cached."""
    from gpudash.server.runcache import shared_cache

    hit = shared_cache().current(path)
    if hit is None or hit.run.status == "live":
        return None
    # with what reading them found damaged (the page's reader does not read them again, so cannot say)
    return {"steps": hit.run.steps.copy(deep=False), "memory": hit.run.memory.copy(deep=False),
            "problems": list(hit.run.problems)}


def build_run_page(run_id: str, reader: RunReader, rank: int = 0, view: RunView | None = None,
                   cursor: int | None = None, xrange: tuple[float, float] | None = None,
                   smooth: float = 0.0, xmode: str = "step") -> html.Div:
    """The run page; ``cursor``, ``xrange`` (a step range) and ``xmode`` (the step graphs' x axis) come from
    the page's address, so a link reproduces the view it was copied from."""
    view = view if view is not None else load_view(reader, known=known_tables(reader.path))
    problems = list(view.problems)
    maps = load_snapshots(reader, problems)
    view.problems = problems
    if is_snapshot_only(view, maps):  # an imported snapshot: its views, none of a training run's empty ones
        return snapshot_page(run_id, view, maps, GRAPH_CONFIG)
    facts = facts_for(reader.path)
    x = XAxis(xmode, x_origin(xmode, view.full.get("steps", view.frame("steps"))))
    if rank not in view.ranks:
        rank = view.ranks[0]
    spikes = list(facts.loss_spike_steps) if facts is not None else None
    last = view.last_step
    if cursor is not None and last is not None:
        first = int(view.frame("steps")["step"].min()) if len(view.frame("steps")) else 0
        cursor = min(max(cursor, first), last)
    elif cursor is not None:
        cursor = None
    zoomed = range_view(reader, view, xrange[0], xrange[1]) if xrange is not None else view
    figs, specs = {}, {}
    at = cursor if cursor is not None else None if view.status == "live" else last
    for g in LIVE_GRAPHS:
        if g in EAGER:
            figs[g], specs[g] = page_graph(g, view, zoomed, rank, at, xrange, spikes, smooth, x)
        else:  # drawn when scrolled to (gpudash.server.layouts.lazy); its series say whether it has anything to draw
            specs[g] = graph_specs(g, (zoomed if g in STEP_GRAPHS else view).frames, rank, view.meta, smooth)
            figs[g] = placeholder(g, specs[g])
    mem_now = memory.memory_at(view.full.get("memory", view.frame("memory")), cursor, rank)
    at_cursor = cursor if cursor is not None else last
    shown = pick_snapshot(maps, at_cursor, "cursor")  # the snapshot at the cursor: its largest blocks, its timeline
    state = initial_state(run_id, view, {g: specs[g] for g in EAGER}, rank)  # the live tick extends these
    state["x"] = x.as_dict()
    state["downsampled"] = any(view.levels.values()) or any(
        len(view.frame(t)) >= MAX_POINTS or len(view.full.get(t, ())) > len(view.frame(t)) for t in NUMERIC_TABLES)
    return run_page(RunPageData(
        run_id=run_id, view=view, rank=rank, figs=figs, specs=specs, state=state, facts=facts,
        cursor=cursor, smooth=smooth, x=x,
        memory_at=memory.memory_at_figure(mem_now),
        segment_map=segment_map_view(maps, at_cursor, "cursor", view.meta, view.frame("events")),
        snapshots=maps, snapshot_options=snapshot_options(maps),
        largest=shown,
        alloc_timeline=alloc_timeline_child(alloc_timeline_view(maps, at_cursor, "cursor")),
        alloc_timeline_key=map_key(maps, shown),
        activations=memory.activations_figure(view.frame("activations"), cursor, rank),
        event_rows=events.event_rows(view.frame("events")),
        hotspot_rows=hotspots.hotspot_rows(view.frame("stacks")),
        ranks=ranks.ranks_box(view.frame("steps"), view.frame("memory"), ranks.rank_nodes(reader.rank_meta()),
                              view.full_frames())))


def range_view(reader: RunReader, base: RunView, x0: float, x1: float, xmode: str = "step") -> RunView:
    """The view's numeric tables re-read for a zoomed range, at most MAX_POINTS rows per rank."""
    if xmode == "step":
        times = reader.time_span(x0, x1)
        if times is None:
            return base
        t0, t1 = times
    else:
        t0, t1 = base.t0 + x0, base.t0 + x1
    frames = dict(base.frames)
    levels = dict(base.levels)
    for table in NUMERIC_TABLES:
        whole = base.full.get(table)
        if table in STEP_TABLES and whole is not None:  # step charts: the full-resolution rows of the range
            key, lo, hi = ("step", x0, x1) if xmode == "step" else ("time", t0, t1)
            if key in whole and len(whole):
                v = pd.to_numeric(whole[key], errors="coerce")
                part = whole[(v >= lo) & (v <= hi)].reset_index(drop=True)
            else:
                part = whole
            frames[table] = downsample_frame(part, table, MAX_POINTS)
            levels[table] = 0
            continue
        df, level = reader.read_range(table, t0, t1, max_rows=MAX_POINTS)
        if level:
            df = rolled_frame(df)
        elif "_rowid" in df:
            df = df.drop(columns="_rowid")
        for c in ("step", "gpu"):
            if c in df and df[c].notna().all():
                df[c] = df[c].astype("int64")
        frames[table] = downsample_frame(df, table, MAX_POINTS)
        levels[table] = level
    return RunView(path=base.path, meta=base.meta, status=base.status, frames=frames, levels=levels,
                   problems=base.problems, cursor=base.cursor, last=base.last, t0=base.t0, full=base.full)

