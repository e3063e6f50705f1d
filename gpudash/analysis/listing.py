"""A run's row in the runs list from its metadata alone (``run.json`` and each rank's ``meta.json``).

A run in an object store is listed without reading any of its segments: the publisher keeps, in each
rank's ``meta.json``, the few numbers the list shows (:mod:`gpudash.store.listing`), and this module
turns them into the same columns the loaded run's facts give (:func:`gpudash.analysis.facts.run_facts`):
the status from the heartbeats, the steps counted as :func:`steps_through` counts them, the peak memory
in :func:`gpudash.analysis.facts.peak_memory`'s order of columns, the duration from the run's start to its
last step (or its end). A run published by an older gpudash, whose meta has no listing, shows its status,
ranks and last step; its peak and duration wait for the run to be opened.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gpudash.analysis.memory import MEASURED_PEAK_COLUMNS
from gpudash.store.listed import listed_run
from gpudash.store.listing import LISTING_KEY, PARTS_KEY, published_metas
from gpudash.store.meta import parse_run_json, read_run_json
from gpudash.store.mirror import unpublished_note
from gpudash.store.rankreader import meta_status
from gpudash.store.run import run_start, settle_status
from gpudash.store.schema import RUN_META_FILE

__all__ = ["PENDING", "PEAK_ORDER", "listed_row", "listed_run_row", "run_status", "steps_through"]

#: The status of a run named by a listing whose metadata is still being read.
PENDING = "listing"
PENDING_NOTE = "its run.json and meta.json are still being read from the store (newest runs first)"
#: Memory columns whose largest value is the run's peak, first found wins (as :func:`facts.peak_memory`).
PEAK_ORDER = (*MEASURED_PEAK_COLUMNS, "reserved_bytes", "allocated_bytes")


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def steps_through(last: float | None, meta: dict[str, Any] | None) -> int:
    """Steps a run recorded when its last step number is ``last``: ``last + 1 -`` its first (``first_step``
    in the meta where HF or Lightning numbered steps from 1; else 0)."""
    if last is None or not math.isfinite(last):
        return 0
    first = (meta or {}).get("first_step")
    first = int(first) if isinstance(first, int | float) and not isinstance(first, bool) and first <= last else 0
    return int(last) + 1 - first


def run_status(rank_meta: dict[int, dict[str, Any]]) -> str:
    """``live`` if any rank is live, else ``crashed`` if any crashed, else ``finished`` (no rank: ``crashed``)."""
    if not rank_meta:
        return "crashed"
    states = [meta_status(m) for m in rank_meta.values()]
    for s in ("live", "crashed"):
        if s in states:
            return s
    return "finished"


def listed_row(run_id: str, run_json: dict[str, Any], rank_meta: dict[int, dict[str, Any]],
               problems: list[str]) -> dict[str, Any]:
    """The runs list's row of a run not opened: the keys of the loaded run's summary, those only the
    loaded run knows (rates, facts, progress) None. ``meta`` holds the merged meta (status settled)."""
    status = run_status(rank_meta)
    meta: dict[str, Any] = {}
    for rm in reversed(list(rank_meta.values())):
        meta.update(rm)
    meta.pop(LISTING_KEY, None)
    meta.update(run_json)
    if rank_meta:
        meta["world_size"] = max(int(_num(meta.get("world_size")) or 1), len(rank_meta))
    settle_status(meta, rank_meta, status)
    listings: list[dict[str, Any]] = [x for x in (m.get(LISTING_KEY) for m in rank_meta.values())
                                      if isinstance(x, dict)]
    lasts = [_num(x.get("last_step")) for x in listings] or [_num(m.get("last_step")) for m in rank_meta.values()]
    known = [v for v in lasts if v is not None]
    steps = steps_through(max(known), meta) if known else 0
    peak = None
    for col in PEAK_ORDER:
        found = [v for v in (_num((x.get("max") or {}).get(col)) if isinstance(x.get("max"), dict) else None
                             for x in listings) if v is not None]
        if found:
            peak = max(found)
            break
    if peak is None:  # no peak, reserved or allocated bytes measured (a CPU run): the largest sum of its parts
        sums = [v for v in (_num(x.get(PARTS_KEY)) for x in listings) if v is not None]
        peak = max(sums) if sums else None
    started = run_start(meta, rank_meta)
    firsts = [v for v in (_num(x.get("first_time")) for x in listings) if v is not None]
    ends = [v for v in (_num(x.get("last_time")) for x in listings) if v is not None]
    duration = None
    if ends:
        t1 = max(ends)
        ended = _num(meta.get("ended_at")) if status != "live" else None
        if ended is not None:
            t1 = max(t1, ended)
        t0 = min([*firsts, *([started] if started is not None else [])] or [min(ends)])
        duration = t1 - t0
    notes = list(problems)
    for rank, rm in sorted(rank_meta.items()):
        if meta_status(rm) == "crashed":
            notes.append(unpublished_note(rank, rm))
    return {"id": run_id, "name": str(meta.get("name") or run_id), "status": status, "started": started,
            "duration_s": duration, "steps": steps, "peak_bytes": peak, "tokens_per_s": None,
            "samples_per_s": None, "mfu": None, "ranks": max(len(rank_meta), 1 if steps else 0),
            "end_reason": meta.get("end_reason") if isinstance(meta.get("end_reason"), str) else None,
            "problems": notes, "facts": None, "progress": None, "meta": meta}


def listed_run_row(run_id: str, path: Path) -> dict[str, Any]:
    """:func:`listed_row` of the run at ``path`` from its metadata: as the listing of its object store read it
    (:mod:`gpudash.store.listed`, nothing on disk), else its folder's ``run.json`` and ranks' ``meta.json``."""
    problems: list[str] = []
    listed = listed_run(path)
    if listed is None:
        run_json = read_run_json(path, problems)
    else:
        problems.extend(p for p in listed.problems if p.startswith(RUN_META_FILE))
        run_json = parse_run_json(listed.run_json, problems) if listed.run_json is not None else {}
    row = listed_row(run_id, run_json, published_metas(path, problems), problems)
    if listed is not None and listed.pending:
        # named by the listing, its metadata still being read (a first listing of many runs): said so
        row.update(status=PENDING, problems=[PENDING_NOTE])
    return row
