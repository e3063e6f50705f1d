"""A rank's record read and closed from outside the process that wrote it (standard library only, so a small
watcher may load it): ``gpudash run``'s end watcher (:mod:`gpudash.zerocode.endwatch`) closes the rank of a
process the kernel's OOM killer took (it could write nothing itself) with its end cause."""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any

__all__ = ["close_rank", "rank_state"]


def rank_state(db: str | os.PathLike[str]) -> tuple[dict[str, Any], float | None, float | None] | None:
    """(the rank's meta, values parsed; its last host sample's available and total bytes, None where it has none);
    None where the file cannot be read as a rank database."""
    try:
        conn = sqlite3.connect(db, timeout=10)
    except sqlite3.Error:
        return None
    try:
        meta: dict[str, Any] = {}
        for key, value in conn.execute("SELECT key, value FROM meta"):
            try:
                meta[str(key)] = json.loads(value)
            except (TypeError, ValueError):
                meta[str(key)] = value
        try:
            row = conn.execute("SELECT available_bytes, total_bytes FROM host ORDER BY rowid DESC LIMIT 1").fetchone()
        except sqlite3.Error:  # no host table, or one without these columns
            row = None
        avail, total = (float(row[0]), float(row[1])) if row and row[0] is not None and row[1] is not None \
            else (None, None)
        return meta, avail, total
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def close_rank(db: str | os.PathLike[str], items: dict[str, Any]) -> bool:
    """Store ``items`` in the rank's meta (``status``, ``end_reason``, ``end_cause``, ...); whether it was stored."""
    try:
        conn = sqlite3.connect(db, timeout=10)
    except sqlite3.Error:
        return False
    try:
        with conn:
            conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                             [(k, json.dumps(v)) for k, v in items.items()])
        return True
    except sqlite3.Error:
        return False
    finally:
        conn.close()
