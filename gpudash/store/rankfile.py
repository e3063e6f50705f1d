"""Opening one rank's database in whatever state a run left it, without writing beside it.

A finished run opens immutable; a run with a write-ahead log opens read-only
(SQLite may add the ``-shm`` index when the folder allows). What SQLite refuses
is read from a private copy in a :class:`Scratch` folder: a truncated file
(padded to its declared size), a killed run on read-only storage (database and
log copied together), and a log whose database is gone (replayed onto an empty
page). The original files are never changed.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from gpudash.store.bounded import UnsafeFile, check_regular, connect

__all__ = ["Scratch", "log_heartbeat", "open_rank_db", "wal_path"]

_MMAP_BYTES = 1 << 32


class Scratch:
    """A private temporary folder, made on first use, removed by :meth:`cleanup`."""

    def __init__(self) -> None:
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def path(self) -> Path:
        if self._dir is None:
            self._dir = tempfile.TemporaryDirectory(prefix="gpudash-salvage-")
        return Path(self._dir.name)

    def cleanup(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


def wal_path(db: Path) -> Path:
    """``rankN.db-wal``, SQLite's write-ahead log beside ``rankN.db``."""
    return db.with_name(db.name + "-wal")


def log_heartbeat(db: Path) -> float | None:
    """When the writer of ``db`` was last seen: its write-ahead log's modification time (the writer
    renews it at every flush, see :mod:`gpudash.store.writer`); None when there is no log."""
    try:
        return wal_path(db).stat().st_mtime
    except (OSError, ValueError):
        return None


def open_rank_db(path: Path, scratch: Scratch, note: Callable[[str], None]) -> sqlite3.Connection:
    """A read-only view of ``rankN.db``; damage that costs records is passed to ``note``.
    Only regular files are opened (a FIFO named ``rank0.db`` would block the open for good)."""
    for p in (path, wal_path(path)):
        try:
            check_regular(p)
        except FileNotFoundError:
            pass
        except (UnsafeFile, OSError) as exc:
            raise sqlite3.DatabaseError(str(exc) if isinstance(exc, UnsafeFile) else f"{p.name}: {exc}") from None
    if not path.exists() and wal_path(path).exists():
        return _open_orphan_wal(path, scratch, note)
    try:
        return _connect(path, scratch)
    except sqlite3.DatabaseError as exc:
        padded = _pad_truncated(path, scratch)
        if padded is None:
            raise
        note(f"{path.name}: file is truncated ({exc}); reading the intact part")
        return _connect(padded, scratch)


def _connect(path: Path, scratch: Scratch) -> sqlite3.Connection:
    # no -wal file: no writer is attached and every record is in the main file, so open it
    # immutable (reads only; creates no -wal/-shm beside someone else's run)
    flags = "mode=ro" if wal_path(path).exists() else "mode=ro&immutable=1"
    try:
        conn = connect(f"file:{quote(str(path))}?{flags}", uri=True)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        conn.execute(f"PRAGMA mmap_size={_MMAP_BYTES}")  # big chunk blobs read without copies
        return conn
    except sqlite3.OperationalError as exc:
        if "malformed" in str(exc) or "not a database" in str(exc):
            raise
    try:
        # a WAL database in a folder we may write to: let SQLite create the -shm file
        conn = connect(path)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as exc:
        if "malformed" in str(exc) or "not a database" in str(exc):
            raise
    # read-only storage, log present, no -shm (a killed run on a read-only mount): SQLite cannot
    # attach to the log in place, so read a private copy of the database and its log
    folder = scratch.path()
    for src in (path, wal_path(path)):
        shutil.copyfile(src, folder / src.name)
    conn = connect(folder / path.name)
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    return conn


def _open_orphan_wal(path: Path, scratch: Scratch, note: Callable[[str], None]) -> sqlite3.Connection:
    """``rankN.db`` is gone but its log is left. The log holds every page written since the
    last checkpoint: replay it onto an empty one-page database (a zero-length file would
    make SQLite discard the log) in a private folder, and say what is lost."""
    wal = wal_path(path)
    missing = f"{path.name} is missing, only its write-ahead log {wal.name} is left"
    try:
        with open(wal, "rb") as f:
            header = f.read(32)
    except OSError as exc:
        raise sqlite3.DatabaseError(f"{missing} and unreadable ({exc.strerror or exc})") from None
    page = int.from_bytes(header[8:12], "big") if len(header) == 32 else 0
    if header[:4] not in (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83") or page < 512 or page & (page - 1):
        raise sqlite3.DatabaseError(f"{missing}, and that is not a SQLite log; copy {path.name} beside it")
    folder = scratch.path()
    shutil.copyfile(wal, folder / wal.name)
    (folder / path.name).write_bytes(bytes(page))
    conn = connect(folder / path.name)
    try:
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
    except sqlite3.DatabaseError:
        tables = 0
    if not tables:
        conn.close()
        raise sqlite3.DatabaseError(f"{missing}, and the log holds no table; copy {path.name} beside it "
                                    "if you still have it")
    note(f"{missing}: read the records the log still holds (those already moved into "
         f"{path.name} are lost; copy it beside the log if you still have it)")
    return conn


def _pad_truncated(path: Path, scratch: Scratch) -> Path | None:
    """SQLite refuses a file shorter than its header says. Copy it (never touch
    the original), pad the copy with empty pages and read that instead."""
    try:
        with open(path, "rb") as f:
            header = f.read(100)
        size = path.stat().st_size
    except OSError:
        return None
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        return None
    page = int.from_bytes(header[16:18], "big")
    page = 65536 if page == 1 else page
    declared = int.from_bytes(header[28:32], "big") * page
    if declared <= size:
        return None
    copy = scratch.path() / path.name
    shutil.copyfile(path, copy)
    with open(copy, "r+b") as f:
        f.truncate(declared)
    return copy
