"""Adding columns to a table in one schema change.

SQLite's ``ALTER TABLE ... ADD COLUMN`` re-parses the whole database schema
after every column, so adding N columns to tables that already have S costs
O(N * S): the first flush of a loop logging 700 scalars (2,100 more roll-up
columns per level) took half a minute. :func:`add_columns` adds all of a
table's new columns at once with the procedure SQLite documents for schema
changes that leave the stored rows as they are ("Making Other Kinds Of Table
Schema Changes", lang_altertable.html): in a savepoint, rewrite the table's
``CREATE TABLE`` text in ``sqlite_schema`` and bump the schema version. A
nullable column without a default appended at the end is exactly what ADD
COLUMN stores (older rows read it as NULL), so the file stays an ordinary
SQLite database that any reader, old or new, opens. The new schema is parsed
and checked before the savepoint is released; if anything fails (a build in
defensive mode, an unexpected schema text), the savepoint is rolled back and
the columns are added one ALTER at a time, as before.

:data:`STATS` counts the schema statements per kind (a seam for tests).
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Sequence

from gpudash.store.failures import is_transient
from gpudash.store.schema import quote_ident

__all__ = ["STATS", "add_columns", "column_room", "table_columns"]

#: statements issued here, by kind ("schema_edit", "alter", "table_info"): read by tests
STATS: Counter[str] = Counter()
_SQLITE_MAX_COLUMN = 2000  # SQLite's default; Connection.getlimit (Python 3.11) reads the real one
_LIMIT_COLUMN: int = getattr(sqlite3, "SQLITE_LIMIT_COLUMN", 2)


def table_columns(conn: sqlite3.Connection, table: str) -> dict[str, str]:
    """The table's columns and declared types, read from the file."""
    STATS["table_info"] += 1
    return {name: ctype for _, name, ctype, *_ in conn.execute(f"PRAGMA table_info({quote_ident(table)})")}


def column_room(conn: sqlite3.Connection, ncols: int) -> int:
    """How many more columns a table of ``ncols`` columns can take on this connection. One below
    SQLite's limit: readers select the rowid with every column, and a result row has the same limit."""
    getlimit = getattr(conn, "getlimit", None)
    limit = getlimit(_LIMIT_COLUMN) if getlimit is not None else _SQLITE_MAX_COLUMN
    return max(0, limit - 1 - ncols)


def add_columns(conn: sqlite3.Connection, table: str, defs: Sequence[tuple[str, str]]) -> dict[str, sqlite3.Error]:
    """Append columns ``(name, sql_type)`` to ``table`` inside the open transaction.

    The caller keeps within :func:`column_room`. Returns the columns SQLite refused, with its
    error (the others are added); raises a failure "for now" (disk full, ...: see
    :func:`~gpudash.store.failures.is_transient`), and then none is added."""
    if not defs:
        return {}
    if len(defs) > 1:
        was_open = conn.in_transaction
        try:
            _edit_schema(conn, table, defs)
            return {}
        except sqlite3.Error as exc:
            if is_transient(exc) or (was_open and not conn.in_transaction):
                raise  # the ALTERs would fail the same way, or SQLite ended the transaction
    refused: dict[str, sqlite3.Error] = {}
    for name, ctype in defs:
        STATS["alter"] += 1
        try:
            conn.execute(f"ALTER TABLE {quote_ident(table)} ADD COLUMN {quote_ident(name)} {ctype}")
        except sqlite3.Error as exc:
            if is_transient(exc):
                raise
            refused[name] = exc
    return refused


def _edit_schema(conn: sqlite3.Connection, table: str, defs: Sequence[tuple[str, str]]) -> None:
    """All columns in one rewrite of the table's CREATE statement; undone unless it parses back."""
    STATS["schema_edit"] += 1
    conn.execute("SAVEPOINT gpudash_add_columns")
    try:
        row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        sql = (row[0] or "").rstrip() if row else ""
        if not sql.endswith(")"):
            raise sqlite3.OperationalError(f"unexpected schema of {table!r}")
        old = table_columns(conn, table)
        new_sql = sql[:-1] + "".join(f", {quote_ident(n)} {t}" for n, t in defs) + ")"
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        conn.execute("PRAGMA writable_schema = ON")
        try:
            conn.execute("UPDATE sqlite_master SET sql = ? WHERE type = 'table' AND name = ?", (new_sql, table))
            conn.execute(f"PRAGMA schema_version = {int(version) + 1}")
        finally:
            conn.execute("PRAGMA writable_schema = OFF")
        # parse it back (with writable_schema off a bad schema is an error, not ignored)
        got = table_columns(conn, table)
        want = {**old, **dict(defs)}
        if list(got) != list(want) or conn.execute("PRAGMA schema_version").fetchone()[0] != int(version) + 1:
            raise sqlite3.OperationalError(f"schema of {table!r} did not parse back as written")
    except BaseException:
        try:
            conn.execute("ROLLBACK TO gpudash_add_columns")
            conn.execute("RELEASE gpudash_add_columns")
        except sqlite3.Error:
            pass  # SQLite rolled the whole transaction back (e.g. disk full): the caller's error says so
        raise
    conn.execute("RELEASE gpudash_add_columns")
