"""What a runs list shows of a published rank, kept in its ``meta.json`` so a list never reads a segment.

The publisher folds the rows it exports into a small ``listing`` object (:class:`ListingTally`): the rank's
last step, the first and last time a step ended (and the first step's start), and the largest value of each
``*_bytes`` column of its memory table (and the largest per-row sum of its memory categories, the peak of a run
that measured no peak: :func:`gpudash.analysis.facts.peak_memory`). Only the rows new since the last publish are read (by rowid), so
the cost per publish is that of the new rows, whatever the run's length. The runs list reads it back with
:func:`published_metas` (each rank's ``meta.json`` in a run folder) and :mod:`gpudash.analysis.listing`
turns it into the row shown; a run published before this existed has no ``listing`` and shows what its
meta holds (status, last step, times). A local run not summarised yet is listed the same way, its ranks'
meta tables tallied where they lie (:func:`rank_listings`).

The rank that put the run's ``run.json`` also carries a copy of it in its listing (:func:`embedded_run_json`,
when it is at most :data:`RUN_JSON_COPY_BYTES`): a bucket's lister then reads one object per run, not two
(:func:`run_json_copy`; :mod:`gpudash.store.runsync` checks the copy against the listed ``run.json`` object
and reads that one where they differ, or where a run was published before the copy existed).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from gpudash.store.schema import MEMORY_PARTS, quote_ident
from gpudash.store.segments import LISTING_KEY, SEGMENTS_DIR, rank_of_folder

__all__ = ["LISTING_KEY", "PARTS_KEY", "RUN_JSON_COPY_KEY", "ListingTally", "embedded_run_json", "published_metas",
           "rank_listings", "run_json_copy"]

#: The largest ``meta.json`` read to list a run (gpudash writes a few kB).
LIST_META_BYTES = 4 << 20
#: The listing's key for the largest per-row sum of the memory categories (:data:`MEMORY_PARTS`).
PARTS_KEY = "max_parts_sum"
#: The listing's key for the copy of ``run.json`` (its ``size`` in bytes and its ``text``).
RUN_JSON_COPY_KEY = "run_json"
#: The largest ``run.json`` copied into a ``meta.json`` (gpudash writes a few kB; a larger one is read itself).
RUN_JSON_COPY_BYTES = 64 << 10


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    try:
        return [str(r[1]) for r in conn.execute(f"PRAGMA table_info({quote_ident(table)})")]
    except sqlite3.Error:
        return []


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v == v else None


class ListingTally:
    """The running listing of one rank, extended by the rows written since the last :meth:`update`."""

    def __init__(self) -> None:
        self.after: dict[str, int] = {"steps": 0, "memory": 0}
        self.out: dict[str, Any] = {"last_step": None, "first_time": None, "last_time": None, "max": {},
                                    PARTS_KEY: None}

    def _fold(self, key: str, value: Any, pick: Any) -> None:
        v = _num(value)
        if v is not None:
            old = self.out[key] if key != "max" else None
            self.out[key] = v if old is None else pick(old, v)

    def update(self, conn: sqlite3.Connection, real: set[str] | None = None) -> dict[str, Any]:
        """Fold the new rows in; the listing (a JSON-ready copy). A table that cannot be read is skipped, as is
        one not in ``real`` when given (a file gpudash did not write: its views are someone else's code)."""
        cols = _columns(conn, "steps") if real is None or "steps" in real else []
        if {"step", "time"} <= set(cols):
            start = "time - coalesce(duration_s, 0)" if "duration_s" in cols else "time"
            try:
                row = conn.execute(f"SELECT max(rowid), max(step), max(time), min({start}) FROM steps "
                                   "WHERE rowid > ?", (self.after["steps"],)).fetchone()
            except sqlite3.Error:
                row = None
            if row and row[0] is not None:
                self.after["steps"] = int(row[0])
                self._fold("last_step", row[1], max)
                self._fold("last_time", row[2], max)
                self._fold("first_time", row[3], min)
        mem = [c for c in _columns(conn, "memory") if c.endswith("_bytes")][:64] if real is None or "memory" in real \
            else []
        if mem:
            sql = ", ".join(f"max({quote_ident(c)})" for c in mem)
            # a category that is not a number counts 0, as the loaded run's facts count it
            nums = [f"(CASE WHEN typeof({quote_ident(c)}) IN ('integer', 'real') THEN {quote_ident(c)} END)"
                    for c in mem if c in MEMORY_PARTS]
            parts = (f"CASE WHEN coalesce({', '.join(nums)}, NULL) IS NULL THEN NULL ELSE "
                     f"{' + '.join(f'coalesce({n}, 0)' for n in nums)} END") if nums else "NULL"
            try:
                row = conn.execute(f"SELECT max(rowid), max({parts}), {sql} FROM memory WHERE rowid > ?",
                                   (self.after["memory"],)).fetchone()
            except sqlite3.Error:
                row = None
            if row and row[0] is not None:
                self.after["memory"] = int(row[0])
                self._fold(PARTS_KEY, row[1], max)
                for c, v in zip(mem, row[2:], strict=True):
                    n = _num(v)
                    if n is not None:
                        old = self.out["max"].get(c)
                        self.out["max"][c] = n if old is None else max(old, n)
        if isinstance(self.out["last_step"], float) and self.out["last_step"].is_integer():
            self.out["last_step"] = int(self.out["last_step"])
        return {**self.out, "max": dict(self.out["max"])}


def embedded_run_json(data: bytes) -> dict[str, Any] | None:
    """What a rank's listing carries of the ``run.json`` it put (``data``, as put): ``{"run_json": {"size",
    "text"}}``; None for one too large to copy, or not UTF-8 text (then it is read itself)."""
    if len(data) > RUN_JSON_COPY_BYTES:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return {RUN_JSON_COPY_KEY: {"size": len(data), "text": text}}


def run_json_copy(meta_json: bytes) -> tuple[int, bytes] | None:
    """(size, bytes) of the ``run.json`` copy a rank's ``meta.json`` carries in its listing, None when it
    carries none (a run published by an older gpudash, a rank that did not put ``run.json``) or a damaged one."""
    if len(meta_json) > LIST_META_BYTES:
        return None
    try:
        doc = json.loads(meta_json)
    except (ValueError, RecursionError):
        return None
    listing = doc.get(LISTING_KEY) if isinstance(doc, dict) else None
    copy = listing.get(RUN_JSON_COPY_KEY) if isinstance(listing, dict) else None
    if not isinstance(copy, dict) or not isinstance(copy.get("text"), str) or not isinstance(copy.get("size"), int):
        return None
    try:
        data = copy["text"].encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: not what gpudash wrote
        return None
    return (copy["size"], data) if len(data) == copy["size"] <= RUN_JSON_COPY_BYTES else None


def rank_listings(ranks: dict[int, Any]) -> dict[int, dict[str, Any]]:
    """Each rank's meta with its listing tallied from its file as it lies (``ranks``: rank -> an open
    :class:`gpudash.store.rankreader.RankReader`): a local run listed as a published one is."""
    return {rank: {**rr.meta(), LISTING_KEY: ListingTally().update(rr.conn, rr.tables())}
            for rank, rr in sorted(ranks.items())}


def published_metas(run_dir: Path, problems: list[str]) -> dict[int, dict[str, Any]]:
    """Each rank's ``meta.json`` in ``run_dir/segments`` (regular files below the folder only, bounded in
    size; a run listed from an object store: as the listing read them, :mod:`gpudash.store.listed`); what
    cannot be read is named in ``problems`` and left out."""
    from gpudash.store.bounded import read_below
    from gpudash.store.listed import listed_run

    out: dict[int, dict[str, Any]] = {}
    listed = listed_run(run_dir)
    if listed is not None:
        for msg in listed.problems:
            if msg.startswith(f"{SEGMENTS_DIR}/") and msg not in problems:
                problems.append(msg)
        for listed_rank, data in sorted(listed.metas.items()):
            _parse_meta(out, listed_rank, f"{SEGMENTS_DIR}/rank={listed_rank}/meta.json", data, problems)
        return out
    try:
        folders = sorted(p.name for p in (run_dir / SEGMENTS_DIR).iterdir())
    except OSError:
        return out
    for name in folders:
        rank = rank_of_folder(name)
        if rank is None:
            continue
        rel = f"{SEGMENTS_DIR}/{name}/meta.json"
        try:
            data = read_below(run_dir, rel, LIST_META_BYTES)
        except FileNotFoundError:
            continue
        except Exception as exc:  # noqa: BLE001 - too large, a link: named, the other ranks listed
            problems.append(f"{rel}: unreadable ({str(exc)[:200] or type(exc).__name__})")
            continue
        _parse_meta(out, rank, rel, data, problems)
    return out


def _parse_meta(out: dict[int, dict[str, Any]], rank: int, rel: str, data: bytes, problems: list[str]) -> None:
    try:
        doc = json.loads(data)
    except Exception as exc:  # noqa: BLE001 - not JSON: named, the other ranks listed
        problems.append(f"{rel}: unreadable ({str(exc)[:200] or type(exc).__name__})")
        return
    if isinstance(doc, dict):
        out[rank] = doc
    else:
        problems.append(f"{rel}: not a JSON object")
