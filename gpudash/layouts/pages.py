"""Assemble pages from a reader: the run page's figures and state, snapshots, range re-queries,
the summary verdicts. Callbacks in :mod:`gpudash.app` are thin wrappers over these."""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from dash import html
from gpudash.layouts import events, hotspots, memory, ranks
from gpudash.layouts.common import source_reason
from gpudash.layouts.data import STEP_TABLES, RunView, downsample_frame, load_view, rolled_frame
from gpudash.layouts.downsample import MAX_POINTS
from gpudash.layouts.fig import Fig
from gpudash.layouts.live import initial_state
from gpudash.layouts.run_page import EAGER, LIVE_GRAPHS, STEP_GRAPHS, graph_specs, page_graph, placeholder, run_page
from gpudash.store.reader import RunReader
from gpudash.store.schema import NUMERIC_TABLES, SNAPSHOT_REQUEST_FILE

__all__ = [
    "activations_at",
    "build_run_page",
    "facts_for",
    "load_snapshots",
    "memory_row_at",
    "pick_snapshot",
    "range_view",
    "request_snapshot",
    "segment_map_view",
    "snapshot_options",
    "verdicts_for",
]


_SNAP_CACHE: dict[tuple[str, int], list[Any]] = {}


def load_snapshots(reader: RunReader, problems: list[str] | None = None) -> list[Any]:
    """MemoryMap objects of the run's allocator snapshots ([] if none or the parser is missing).

    Decoded once per run and snapshot count: the cursor asks for them on every move."""
    key = (str(reader.path.resolve()), sum(r.max_rowid("snapshots") for r in reader.ranks.values()))
    if key in _SNAP_CACHE:
        return _SNAP_CACHE[key]
    maps = _decode_snapshots(reader, problems)
    if len(_SNAP_CACHE) > 16:
        _SNAP_CACHE.clear()
    _SNAP_CACHE[key] = maps
    return maps


def _decode_snapshots(reader: RunReader, problems: list[str] | None) -> list[Any]:
    frame = reader.read_table("snapshots")
    if not len(frame):
        return []
    try:
        mod = importlib.import_module("gpudash.store.snapshot")
    except ImportError:
        return []
    try:
        return list(mod.snapshots_from_frame(frame, problems if problems is not None else []))
    except Exception as exc:  # noqa: BLE001 - a bad snapshot must not break the page
        if problems is not None:
            problems.append(f"snapshots unreadable: {exc}")
        return []


def snapshot_options(maps: list[Any]) -> list[dict[str, Any]]:
    opts: list[dict[str, Any]] = [{"label": "snapshot at the cursor", "value": "cursor"}]
    for i, mm in enumerate(maps):
        step = getattr(mm, "step", None)
        reason = getattr(mm, "reason", None) or ""
        opts.append({"label": f"step {step} {reason}".strip(), "value": str(i)})
    return opts


def pick_snapshot(maps: list[Any], step: int | None, choice: str | None = "cursor") -> Any | None:
    """The chosen snapshot, or the last one taken at or before ``step`` (else the first)."""
    if not maps:
        return None
    if choice and choice != "cursor":
        try:
            return maps[int(choice)]
        except (ValueError, IndexError):
            pass
    if step is None:
        return maps[-1]
    before = [m for m in maps if getattr(m, "step", None) is not None and int(m.step) <= step]
    return before[-1] if before else maps[0]


def segment_map_view(maps: list[Any], step: int | None, choice: str | None, meta: dict[str, Any],
                     ev: pd.DataFrame | None = None) -> Fig | str:
    mm = pick_snapshot(maps, step, choice)
    if mm is None:
        return source_reason("snapshots", meta, ev) + " (no snapshot recorded; snapshot_every or an OOM takes one)"
    return memory.segment_map_figure(mm)


def request_snapshot(run_dir: Path) -> Path:
    """Ask a live run for an allocator snapshot: the snapshots collector takes one at the end of the next
    step when ``RUN_DIR/snapshot.request`` appears (``run_dir`` is already resolved inside RUNS_DIR)."""
    path = run_dir / SNAPSHOT_REQUEST_FILE
    path.write_text(f"{time.time()}\n")
    return path


def memory_row_at(reader: RunReader, step: int, rank: int = 0, lookback: int = 500) -> pd.DataFrame:
    """Memory rows of ``rank`` just before and at ``step`` (for the breakdown at the cursor)."""
    r = reader.ranks.get(rank)
    if r is None:
        return pd.DataFrame()
    df = r.read("memory", "step <= ? AND step > ?", (int(step), int(step) - lookback))
    if "_rowid" in df:
        df = df.drop(columns="_rowid")
    df.insert(0, "rank", rank)
    return df


def activations_at(reader: RunReader, step: int, rank: int = 0) -> pd.DataFrame:
    """Activation rows of the last sampled step at or before ``step``."""
    r = reader.ranks.get(rank)
    if r is None:
        return pd.DataFrame()
    df = r.read("activations", "step = (SELECT max(step) FROM activations WHERE step <= ?)", (int(step),))
    if "_rowid" in df:
        df = df.drop(columns="_rowid")
    df.insert(0, "rank", rank)
    return df


def verdicts_for(path: Any) -> list[Any] | None:
    """``gpudash.analysis.summarize`` of the run, through the one run cache (computed once per change)."""
    from gpudash.analysis.runcache import shared_cache

    try:
        return list(shared_cache().get(path).verdicts())
    except Exception:  # noqa: BLE001 - analysis bugs or a damaged run must not take the page down
        return None


def facts_for(path: Any) -> Any | None:
    """The run's :class:`gpudash.analysis.facts.Facts` from the one run cache; None if it cannot be read."""
    from gpudash.analysis.runcache import shared_cache

    try:
        return shared_cache().get(path).facts
    except Exception:  # noqa: BLE001 - a damaged run must not take the page down
        return None


def build_run_page(run_id: str, reader: RunReader, rank: int = 0, view: RunView | None = None,
                   cursor: int | None = None, xrange: tuple[float, float] | None = None,
                   smooth: float = 0.0) -> html.Div:
    """The run page; ``cursor`` and ``xrange`` (a step range) come from the page's address, so a link
    reproduces the view it was copied from."""
    view = view if view is not None else load_view(reader)
    if rank not in view.ranks:
        rank = view.ranks[0]
    facts = facts_for(reader.path)
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
            figs[g], specs[g] = page_graph(g, view, zoomed, rank, at, xrange, spikes, smooth)
        else:  # drawn when scrolled to (gpudash.layouts.lazy); its series say whether it has anything to draw
            specs[g] = graph_specs(g, (zoomed if g in STEP_GRAPHS else view).frames, rank, view.meta, smooth)
            figs[g] = placeholder(g, specs[g])
    problems = list(view.problems)
    maps = load_snapshots(reader, problems)
    view.problems = problems
    mem_now = memory.memory_at(view.full.get("memory", view.frame("memory")), cursor, rank)
    extra: dict[str, Any] = {
        "cursor": cursor,
        "smooth": smooth,
        "memory_at": memory.memory_at_figure(mem_now),
        "segment_map": segment_map_view(maps, cursor if cursor is not None else last, "cursor", view.meta,
                                        view.frame("events")),
        "snapshot_options": snapshot_options(maps),
        "activations": memory.activations_figure(view.frame("activations"), cursor, rank),
        "event_rows": events.event_rows(view.frame("events")),
        "hotspot_rows": hotspots.hotspot_rows(view.frame("stacks")),
        "ranks": ranks.ranks_box(view.frame("steps"), view.frame("memory"), ranks.rank_nodes(reader.rank_meta())),
        "facts": facts,
    }
    state = initial_state(run_id, view, {g: specs[g] for g in EAGER}, rank)  # the live tick extends these
    state["downsampled"] = any(view.levels.values()) or any(
        len(view.frame(t)) >= MAX_POINTS or len(view.full.get(t, ())) > len(view.frame(t)) for t in NUMERIC_TABLES)
    return run_page(run_id, view, rank, figs, specs, state, extra)


def _step_times(reader: RunReader, s0: float, s1: float) -> tuple[float, float] | None:
    lo, hi = np.inf, -np.inf
    for r in reader.ranks.values():
        try:
            a, b = r.conn.execute("SELECT min(time), max(time) FROM steps WHERE step >= ? AND step <= ?",
                                  (s0, s1)).fetchone()
        except Exception:  # noqa: BLE001 - a damaged table: fall back to the whole run
            continue
        if a is not None:
            lo, hi = min(lo, a), max(hi, b)
    return None if lo == np.inf else (float(lo), float(hi))


def range_view(reader: RunReader, base: RunView, x0: float, x1: float, xmode: str = "step") -> RunView:
    """The view's numeric tables re-read for a zoomed range, at most MAX_POINTS rows per rank."""
    if xmode == "step":
        times = _step_times(reader, x0, x1)
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

