"""The writer's failures: which are "for now" (retried) and which are the records' fault (dropped), and
saying each problem once.

A disk that is full, a file that is locked or unwritable for a while, an I/O
error or a lack of memory pass: the writer keeps the records in memory and
retries every flush. Any other error is caused by what is written, so the
writer narrows it down to the records that cause it and drops only those.
Whatever it is, :class:`Problems` says it once: in a list the caller reads, on
stderr, and as an event in the run.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_REPORTS", "Problems", "is_transient"]

#: Different problems said (and remembered, so each is said once) per run; past this, one line says that
#: more are not shown and they are only counted (``unreported``): ever-new messages must not grow memory.
MAX_REPORTS = 256

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


class Problems:
    """Say each problem once (by ``key``, the message itself unless given): appended to :attr:`errors`,
    printed on stderr as ``gpudash: <name>: <message>``, and (``event``) handed to ``put_event`` as an event
    row of ``kind`` at the step ``step()`` says. Past :data:`MAX_REPORTS` different problems they are only
    counted (:attr:`unreported`, handed to ``count`` as it grows)."""

    def __init__(self, name: str, put_event: Callable[[dict[str, Any]], None], step: Callable[[], Any],
                 count: Callable[[int], None]) -> None:
        self.name = name
        self.errors: list[str] = []
        self.unreported = 0
        self.said: set[str] = set()
        self._put_event = put_event
        self._step = step
        self._count = count

    def __call__(self, msg: str, *, key: str | None = None, event: bool = True, kind: str = "write_error") -> None:
        key = msg if key is None else key
        if key in self.said:
            return
        if len(self.said) >= MAX_REPORTS:
            self.unreported += 1
            if self.unreported == 1:
                print(f"gpudash: {self.name}: {MAX_REPORTS} different problems said; more are only counted "
                      f"(run meta unreported_problems)", file=sys.stderr)
            self._count(self.unreported)
            return
        self.said.add(key)
        self.errors.append(msg)
        print(f"gpudash: {self.name}: {msg}", file=sys.stderr)
        if event:
            self._put_event({"time": time.time(), "step": self._step(), "kind": kind, "message": msg, "data": None})
