"""Reading files someone else made: every run folder is hostile input.

A run folder may come from anyone (a colleague's crashed run, a cluster job
copied to a laptop), so the read side never trusts a byte of it:

* SQLite: :func:`connect` gives a connection that runs no schema code from the
  file (``trusted_schema=OFF``), writes nothing (``query_only``), refuses
  values over :data:`LENGTH_LIMIT`, and stops any query that runs longer than
  :data:`QUERY_S` (a progress handler: a recursive view, a huge scan). Only
  real tables are read (:func:`real_tables`), never views; identifiers are
  always quoted (:func:`gpudash.store.schema.quote_ident`).
* Files: :func:`read_regular` opens only regular files (a FIFO or a device would
  block or never end) and refuses one larger than the caller's limit before
  reading a byte of it.
* Text: :func:`trim` cuts a string read from a run to a length every surface
  can show; the reader says so in the run's problems.
* :func:`damage` turns what reading can raise (``MemoryError``, a stopped
  query, a refused file) into the one line a run's problems hold.

Every limit is a module constant, so tests can make a case small and quick.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpudash.store.schema import CACHE_KIB, quote_ident
from gpudash.units import human_bytes

__all__ = [
    "LENGTH_LIMIT",
    "QUERY_S",
    "TEXT_CHARS",
    "UnsafeFile",
    "GuardedConnection",
    "check_regular",
    "open_below",
    "read_below",
    "walk_below",
    "count_trimmed",
    "connect",
    "damage",
    "is_interrupt",
    "large_values",
    "read_regular",
    "real_tables",
    "trim",
    "trimmed_column",
]

#: A query running longer than this is stopped (SQLite's progress handler) and named as damage.
QUERY_S = 10.0
#: The largest value SQLite loads for a row read (larger: the query fails with "string or blob too big",
#: before the value is in memory; the reader names the row lost). Text up to it is trimmed to TEXT_CHARS.
LENGTH_LIMIT = 32 << 20
#: The same for the columnar chunks (:func:`large_values`): a merged chunk of a long run is ~150 MB.
CHUNK_LENGTH_LIMIT = 1 << 30
#: The longest SQL statement the reader builds (a wide table's column list).
SQL_LENGTH_LIMIT = 4 << 20
#: Characters kept of one text cell read from a run (an event message, a stack, a meta value).
TEXT_CHARS = 64 << 10
#: Progress handler period in SQLite virtual-machine instructions (~1 ms of work).
_TICKS = 20_000
_TRIMMED = " characters, trimmed]"


class UnsafeFile(OSError):
    """A file in a run folder that is not a regular file, or too large to read."""


class GuardedConnection(sqlite3.Connection):
    """A read-only connection whose every ``execute`` gets its own deadline of :data:`QUERY_S`
    (checked by SQLite's progress handler while the statement runs and while its rows are fetched)."""

    deadline: float = float("inf")
    query_s: float | None = None
    length_limit: int | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        self.deadline = time.monotonic() + (self.query_s if self.query_s is not None else QUERY_S)
        return super().execute(sql, parameters)

    def _tick(self) -> int:
        return 1 if time.monotonic() > self.deadline else 0


def connect(target: str | os.PathLike[str], *, uri: bool = False, timeout: float = 5.0) -> GuardedConnection:
    """A hardened read-only connection to a run's database file (see the module doc)."""
    conn = sqlite3.connect(target, uri=uri, check_same_thread=False, timeout=timeout, factory=GuardedConnection)
    assert isinstance(conn, GuardedConnection)
    try:
        conn.set_progress_handler(conn._tick, _TICKS)
        setlimit = getattr(conn, "setlimit", None)  # Python 3.11+
        if setlimit is not None:  # SQLite's SQLITE_LIMIT_LENGTH (0), _SQL_LENGTH (1), _ATTACHED (7)
            setlimit(0, LENGTH_LIMIT)
            conn.length_limit = LENGTH_LIMIT
            setlimit(1, SQL_LENGTH_LIMIT)
            setlimit(7, 0)
            # the column limit stays SQLite's maximum (2,000): lower, a wide table would make the whole
            # schema unreadable; the reader selects at most MAX_COLUMNS of a table instead
        conn.execute("PRAGMA trusted_schema=OFF")  # no function a view, trigger or index names runs for us
        conn.execute("PRAGMA query_only=ON")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")  # bounded, and full early in a watched run
    except BaseException:
        conn.close()
        raise
    return conn


@contextlib.contextmanager
def large_values(conn: sqlite3.Connection) -> Iterator[None]:
    """Within the block, values up to :data:`CHUNK_LENGTH_LIMIT` load (the columnar chunks)."""
    setlimit = getattr(conn, "setlimit", None)
    if setlimit is None or not isinstance(conn, GuardedConnection):
        yield
        return
    setlimit(0, CHUNK_LENGTH_LIMIT)
    try:
        yield
    finally:
        setlimit(0, conn.length_limit if conn.length_limit is not None else LENGTH_LIMIT)


def real_tables(conn: sqlite3.Connection) -> set[str]:
    """Names of the real tables in the file (views, triggers and indexes are never read)."""
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' LIMIT 10000").fetchall()
    return {r[0] for r in rows if isinstance(r[0], str)}


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a folder" if stat.S_ISDIR(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def check_regular(path: Path) -> os.stat_result:
    """``path``'s stat when it is a regular file, itself no link (``lstat``: a link below a run folder is
    never followed, so a run cannot show a file from elsewhere); raises :class:`UnsafeFile` for a link, a
    FIFO, a device, a socket or a folder, ``FileNotFoundError`` when it is not there."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        kind = _kind(st.st_mode)
        raise UnsafeFile(f"{path.name} is {kind}, not a regular file; not "
                         + ("followed" if kind == "a symbolic link" else "read"))
    return st


def _link_error(exc: OSError, name: str) -> OSError:
    if exc.errno in (errno.ELOOP, getattr(errno, "EMLINK", -1)):
        return UnsafeFile(f"{name}: a symbolic link on its path; not followed")
    if exc.errno == errno.ENOTDIR:
        return UnsafeFile(f"{name}: a symbolic link or a file where a folder belongs on its path; not followed")
    return exc


def open_below(root: str | os.PathLike[str], name: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A file descriptor of ``root/name`` opened with no link followed below ``root``: every folder of
    ``name`` opened ``O_NOFOLLOW | O_DIRECTORY`` from the one above, the file itself ``O_NOFOLLOW``
    (and ``O_NONBLOCK``: a FIFO never blocks the open). ``root`` itself may be a link (a run folder linked
    inside the runs folder). Raises :class:`UnsafeFile` for a link anywhere below ``root``."""
    parts = [p for p in name.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise UnsafeFile(f"{name!r}: not a name inside the run folder")
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    dirflags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | nofollow
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        for part in parts[:-1]:
            try:
                nfd = os.open(part, dirflags, dir_fd=fd)
            except OSError as exc:
                raise _link_error(exc, name) from None
            os.close(fd)
            fd = nfd
        try:
            return os.open(parts[-1], flags | nofollow | getattr(os, "O_NONBLOCK", 0), mode, dir_fd=fd)
        except OSError as exc:
            raise _link_error(exc, name) from None
    finally:
        os.close(fd)


def read_below(root: str | os.PathLike[str], name: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``root/name`` (no link followed below ``root``, :func:`open_below`),
    of at most ``max_bytes``."""
    return _read_fd(open_below(root, name), name.rsplit("/", 1)[-1], max_bytes)


def walk_below(root: str | os.PathLike[str], prefix: str) -> tuple[list[str], list[str]]:
    """(files, links): names (``prefix/...``, relative to ``root``) of the regular files under folder
    ``root/prefix`` and of the links there, no link followed (a linked folder is not entered; reading a
    linked file's name with :func:`read_below` is refused, so the caller can name it)."""
    root_s = os.fspath(root)
    parts = [p for p in prefix.split("/") if p]
    for i in range(len(parts)):
        if os.path.islink(os.path.join(root_s, *parts[:i + 1])):
            return [], ["/".join(parts[:i + 1])]
    files: list[str] = []
    links: list[str] = []
    for top, dirs, names in os.walk(os.path.join(root_s, *parts), followlinks=False):
        rel = os.path.relpath(top, root_s).replace(os.sep, "/")
        for d in list(dirs):
            if os.path.islink(os.path.join(top, d)):
                dirs.remove(d)
                links.append(d if rel == "." else f"{rel}/{d}")
        for f in names:
            try:
                mode = os.lstat(os.path.join(top, f)).st_mode
            except OSError:
                continue
            name = f if rel == "." else f"{rel}/{f}"
            if stat.S_ISLNK(mode):
                links.append(name)
            elif stat.S_ISREG(mode):
                files.append(name)
    return files, links


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path``, which must be a regular file (not a link) of at most ``max_bytes``
    (checked before reading, and again while reading: a file that grows is cut off)."""
    check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise _link_error(exc, path.name) from None
    return _read_fd(fd, path.name, max_bytes)


def _read_fd(fd: int, name: str, max_bytes: int) -> bytes:
    try:
        st = os.fstat(fd)  # the file opened, not the name stat'ed before (it may have been swapped)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{name} is {_kind(st.st_mode)}, not a regular file; not read")
        if st.st_size > max_bytes:
            raise UnsafeFile(f"{name} is {_size(st.st_size)}, over the {_size(max_bytes)} a reader accepts; "
                             "not read")
        with os.fdopen(fd, "rb", closefd=False) as f:  # its size, not the limit, sets what is allocated
            data = f.read(min(max_bytes, st.st_size) + 1)
            while st.st_size < len(data) <= max_bytes:  # growing while read: on, a MiB at a time, to the limit
                more = f.read(min(1 << 20, max_bytes + 1 - len(data)))
                if not more:
                    break
                data += more
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UnsafeFile(f"{name} grew past {_size(max_bytes)} while read; not read")
    return data


def _size(n: int) -> str:
    return human_bytes(n) if n >= 1024 else f"{n} bytes"


def trim(text: str, limit: int | None = None) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters (default :data:`TEXT_CHARS`) with a marker; (text, was it cut)."""
    limit = TEXT_CHARS if limit is None else limit
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"… [{len(text):,} characters, trimmed]", True


def is_interrupt(exc: BaseException) -> bool:
    """A query that the deadline stopped."""
    return isinstance(exc, sqlite3.OperationalError) and "interrupt" in str(exc)


def damage(exc: BaseException) -> str:
    """What went wrong reading, in words for a run's one-line damage note."""
    if isinstance(exc, MemoryError):
        return "ran out of memory reading it"
    if is_interrupt(exc):
        return f"a query ran over {QUERY_S:g} s and was stopped"
    if isinstance(exc, sqlite3.DataError) or "too big" in str(exc):
        return f"a value over {human_bytes(LENGTH_LIMIT, 0)}, more than any record gpudash writes"
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "…"


def trimmed_column(col: str) -> str:
    """A column as the reader selects it: a text cell over :data:`TEXT_CHARS` cut in SQL, so a long
    value never reaches Python whole (numbers and blobs as they are)."""
    q = quote_ident(col)
    n = TEXT_CHARS
    return (f"CASE WHEN typeof({q}) = 'text' AND length({q}) > {n} THEN substr({q}, 1, {n}) || "
            f"'… [' || length({q}) || '{_TRIMMED}' ELSE {q} END")


def count_trimmed(df: Any) -> dict[str, int]:
    """Per column of a frame read with :func:`trimmed_column`: how many of its cells were cut."""
    import pandas as pd

    out: dict[str, int] = {}
    if not len(df):  # most tables of a many-rank run are empty: no pandas string machinery for them
        return out
    for col in df.columns:
        if pd.api.types.is_numeric_dtype(df[col].dtype):
            continue
        try:
            lengths = df[col].str.len()  # vectorised; a column of None or numbers has no .str
        except AttributeError:
            continue
        n = int((lengths > TEXT_CHARS).sum())
        if n:
            out[str(col)] = n
    return out
