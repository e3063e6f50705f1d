"""The names a logged value is stored under.

A value keeps its own name unless gpudash uses that column itself (``step``,
``time``, ``rank``, ``loss__min``...): then it is stored under a namespaced
name, said once (one stderr line and a ``reserved_name`` event). Names the
reader or the roll-ups use are also renamed by the writer, for every source;
this is the Monitor's side of that rule, for ``log`` and ``log_memory``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from gpudash.store.schema import TABLE_BASE_COLUMNS, column_name, is_reserved_column, namespaced_column

__all__ = ["MAX_NAMES", "OWN_COLUMNS", "StoredNames"]

#: Names the Monitor itself writes into a table's rows: a user's value under one is renamed.
OWN_COLUMNS = {t: frozenset(c for c, _ in TABLE_BASE_COLUMNS[t]) for t in ("steps", "memory")}
MAX_NAMES = 10_000  # names remembered per table (log() of ever-new names must not grow memory)

#: ``event(kind, message, **data)``: how a rename is recorded in the run.
EventSink = Callable[..., None]


class StoredNames:
    """User name -> stored name, per table, remembered up to :data:`MAX_NAMES` names."""

    __slots__ = ("_event", "_names")

    def __init__(self, event: EventSink) -> None:
        self._event = event
        self._names: dict[str, dict[str, str]] = {t: {} for t in OWN_COLUMNS}

    def stored(self, table: str, key: str) -> str:
        """The name ``key`` is stored under in ``table`` (renamed, and said once, when it is ours)."""
        names = self._names[table]
        known = names.get(key)
        if known is not None:
            return known
        col = column_name(key)
        name = key
        if is_reserved_column(col) or col in OWN_COLUMNS[table]:
            name = namespaced_column(col)
            where = "log" if table == "steps" else "log_memory"
            msg = (f"monitor.{where}({key[:60]!r}=...): {col!r} is a name gpudash uses itself; "
                   f"recorded as {name!r} (rename it to silence this)")
            print(f"gpudash: {msg}", file=sys.stderr)
            self._event("reserved_name", msg, name=key[:200], stored_as=name)
        if len(names) < MAX_NAMES:
            names[key] = name
        return name

    def rename_own(self, row: dict[str, Any]) -> None:
        """Move a step row's user values logged under the Monitor's own column names aside."""
        for c in OWN_COLUMNS["steps"]:
            if c in row:
                row[self.stored("steps", c)] = row.pop(c)
