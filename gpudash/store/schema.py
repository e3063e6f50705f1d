"""The run directory: file names, tables and column conventions.

A run is a folder::

    RUN_DIR/
      run.json          shared meta (name, created, world size), written once
      rank0.db          one SQLite database (WAL mode) per rank
      rank1.db          ...
      snapshot.request  optional: the dashboard asks the trainer for a snapshot
      segments/         instead of rankN.db on shared storage (NFS, Lustre, FUSE, S3): each rank's
                        rows as append-only Parquet files (see gpudash.store.segments)

Each ``rankN.db`` holds the tables below. Tables marked *dynamic* grow a new
column the first time a record carries a new key, so ``monitor.log(foo=1)``
becomes a ``foo`` column of ``steps``. Column names carry their unit
(``_bytes``, ``_s``, ``_pct``, ``_w``, ``_mib_s``...). Every table is plain
SQLite: ``sqlite3 rank0.db 'select * from steps'`` works without gpudash.
"""

from __future__ import annotations

import re

__all__ = [
    "CACHE_KIB",
    "NUMERIC_TABLES",
    "ROLLUP_KEYS",
    "ROLLUP_TABLES",
    "ROLLUP_LEVELS",
    "MEMORY_CATEGORIES",
    "MEMORY_PARTS",
    "RUN_META_FILE",
    "SAME_OOM_S",
    "SNAPSHOT_REQUEST_FILE",
    "TABLE_BASE_COLUMNS",
    "RESERVED_COLUMNS",
    "column_name",
    "is_reserved_column",
    "namespaced_column",
    "quote_ident",
    "rank_db_name",
    "rank_from_db_name",
    "rollup_table",
]

RUN_META_FILE = "run.json"
#: a rank meta's ``end_cause`` when the kernel's OOM killer took its process (:mod:`gpudash.zerocode.endwatch`)
OOM_KILLED = "oom_killed"
#: SQLite's page cache per connection, KiB (``PRAGMA cache_size``): SQLite's default, 2,000 KiB, fills at the
#: file's growth rate, so in the watched process (the writer, the leak watch's and the alert watcher's readers)
#: it grew malloc's in-use bytes by ~550 B/step over a run's first ~10,000 steps. Appends and reads of new rows
#: touch the last pages; a reader's main-file pages come through mmap, and the write-ahead log is kept small.
CACHE_KIB = 256
SNAPSHOT_REQUEST_FILE = "snapshot.request"
#: The bytes by category the Monitor records in the ``memory`` table (parameters, gradients, optimizer state,
#: activations), in this order; :data:`MEMORY_PARTS` adds the rest of the allocated bytes (``other_bytes``).
MEMORY_CATEGORIES = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes")
MEMORY_PARTS = (*MEMORY_CATEGORIES, "other_bytes")
#: One OOM seen twice: the allocator's observer and the caught exception report it within this many seconds
#: (same rank and step). The recording side (``collectors/oom.py``) joins the two into one event when it can;
#: the reading side (``analysis/facts.py``) counts two such events as one OOM. A fact of how OOMs are stored,
#: so it lives here, where both sides may import it (collectors never import analysis).
SAME_OOM_S = 10.0
_RANK_DB = re.compile(r"^rank(\d+)\.db$")

#: Base columns of each table (name, SQL type); dynamic tables add REAL/TEXT columns.
TABLE_BASE_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    # one row per training step; phases as <phase>_s; logged scalars by name
    "steps": (("step", "INTEGER"), ("time", "REAL"), ("duration_s", "REAL")),
    # memory by category per step (params/grads/optimizer/activations/other_bytes)
    # and, on CUDA, allocator columns (allocated_bytes, reserved_bytes, ...)
    "memory": (("step", "INTEGER"), ("time", "REAL")),
    # psutil samples of the training process and its host
    "host": (("time", "REAL"),),
    # NVML samples, one row per GPU per tick
    "device": (("time", "REAL"), ("gpu", "INTEGER")),
    # activations saved for backward per top-level module on sampled steps
    "activations": (
        ("step", "INTEGER"),
        ("time", "REAL"),
        ("module", "TEXT"),
        ("bytes", "INTEGER"),
        ("tensors", "INTEGER"),
    ),
    # OOMs, batch-size changes, fallbacks, collector unavailable, ...
    "events": (
        ("time", "REAL"),
        ("step", "INTEGER"),
        ("kind", "TEXT"),
        ("message", "TEXT"),
        ("data", "TEXT"),  # JSON object
    ),
    # allocator snapshot summaries: data is zlib-compressed JSON (see snapshot module)
    "snapshots": (
        ("time", "REAL"),
        ("step", "INTEGER"),
        ("reason", "TEXT"),
        ("format", "TEXT"),
        ("data", "BLOB"),
    ),
    # py-spy folded stacks, aggregated per flush window
    "stacks": (("time", "REAL"), ("stack", "TEXT"), ("count", "INTEGER")),
}

#: Tables whose extra columns are added on first use.
DYNAMIC_TABLES = frozenset({"steps", "memory", "host", "device"})
#: Tables with only numeric columns (columnar chunks for fast loads, read by time range).
NUMERIC_TABLES = ("steps", "memory", "host", "device")
#: The tables sampled by the clock, rolled up to coarser time buckets for long time charts. Tables written
#: once a step (steps, memory) are not: their charts are drawn by step from the full-resolution chunks, and
#: a roll-up of them would be written at the step rate and never read.
ROLLUP_TABLES = ("host", "device")
#: Roll-up bucket widths in seconds; table ``<name>_r<width>`` per level.
ROLLUP_LEVELS = (1, 60)
#: Extra group-by keys per rolled-up table (besides the time bucket).
ROLLUP_KEYS: dict[str, tuple[str, ...]] = {"device": ("gpu",)}

_BAD_CHARS = re.compile(r"[^0-9a-zA-Z_]")


def column_name(key: str) -> str:
    """Map a user's scalar name to a safe SQL column name (``a.b/c`` -> ``a_b_c``)."""
    name = _BAD_CHARS.sub("_", key)
    if not name or name[0].isdigit():
        name = "_" + name
    return name.lower()


def quote_ident(name: str) -> str:
    """``name`` as an SQL identifier: in double quotes, inner quotes doubled (``a"b`` -> ``"a""b"``)."""
    return '"' + name.replace('"', '""') + '"'


#: Column names gpudash itself adds to what it reads (``rank``, ``_rowid``), SQLite's names for
#: the row id, the roll-up tables' own columns (``bucket``, ``n``, ``<column>__min/__max``) and the
#: attempt each row of a resumed run belongs to (``attempt``, see :mod:`gpudash.store.attempts`).
#: A user's value under one of these names would make the run unreadable, so it is renamed.
RESERVED_COLUMNS = frozenset({"rank", "_rowid", "rowid", "oid", "_rowid_", "bucket", "n", "attempt"})
_RESERVED_SUFFIXES = ("__min", "__max")


def is_reserved_column(col: str) -> bool:
    """Whether a (sanitized) column name is one the reader or the roll-ups use themselves."""
    return col in RESERVED_COLUMNS or col.endswith(_RESERVED_SUFFIXES)


def namespaced_column(col: str) -> str:
    """The name a reserved column is stored under: ``rank`` -> ``user_rank``, ``loss__min`` -> ``loss_min``."""
    if col.endswith(_RESERVED_SUFFIXES):
        return f"{col[:-5].rstrip('_') or 'user'}_{col[-3:]}"
    return f"user_{col}"


def rank_db_name(rank: int) -> str:
    return f"rank{rank}.db"


def rank_from_db_name(name: str) -> int | None:
    """The rank of ``rankN.db``; None for other names, and for an N no launcher gives (above 2**31 - 1)."""
    m = _RANK_DB.match(name)
    if not m or len(m.group(1)) > 10 or int(m.group(1)) > 2**31 - 1:
        return None
    return int(m.group(1))


def rollup_table(table: str, level: int) -> str:
    return f"{table}_r{level}"
