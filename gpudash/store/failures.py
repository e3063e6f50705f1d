"""Which write failures are "for now" (retried) and which are the records' fault (dropped).

A disk that is full, a file that is locked or unwritable for a while, an I/O
error or a lack of memory pass: the writer keeps the records in memory and
retries every flush. Any other error is caused by what is written, so the
writer narrows it down to the records that cause it and drops only those.
"""

from __future__ import annotations

import sqlite3

__all__ = ["is_transient"]

#: SQLite primary result codes that mean "not now" (disk full, I/O, locked, unwritable, out of memory):
#: the records are kept and retried. Any other error is the records' fault: they are isolated and dropped.
_TRANSIENT_CODES = frozenset({5, 6, 7, 8, 10, 13, 14, 15})  # BUSY LOCKED NOMEM READONLY IOERR FULL CANTOPEN PROTOCOL
_TRANSIENT_WORDS = ("disk is full", "disk i/o", "locked", "readonly", "unable to open", "out of memory")


def is_transient(exc: BaseException) -> bool:
    """Whether a write that raised ``exc`` may succeed later, unchanged."""
    if isinstance(exc, MemoryError):
        return True
    if not isinstance(exc, sqlite3.Error):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in _TRANSIENT_CODES
    return any(w in str(exc).lower() for w in _TRANSIENT_WORDS)  # pragma: no cover - Python < 3.11
