"""One step's memory record, gathered from every source and written as the step ends.

The allocator collector adds ``allocated_bytes``/``peak_bytes``, the category
collector ``params_bytes``/``grads_bytes``/..., the user ``log_memory(...)``;
they all land in one row per step. When categories are known, ``other_bytes``
is what they leave unexplained: of the peak when every category describes it,
else of what is allocated now.
"""

from __future__ import annotations

import time
from typing import Any

from gpudash.store.schema import MEMORY_CATEGORIES as CATEGORIES

__all__ = ["CATEGORIES", "MemoryRow", "with_other_bytes"]


def with_other_bytes(mem: dict[str, Any]) -> dict[str, Any]:
    """Add ``other_bytes`` to ``mem`` where its categories and a total allow it (in place; returns it)."""
    if "allocated_bytes" in mem and any(c in mem for c in CATEGORIES):
        known = sum(int(mem.get(c) or 0) for c in CATEGORIES)
        if "peak_bytes" not in mem:
            mem["other_bytes"] = max(0, int(mem["allocated_bytes"]) - known)
        elif all(c in mem for c in CATEGORIES):  # categories describe the peak: the rest of it
            mem["other_bytes"] = max(0, int(mem["peak_bytes"]) - known)
    return mem


class MemoryRow:
    """The memory record being gathered for the current step (at most one at a time)."""

    __slots__ = ("row",)

    def __init__(self) -> None:
        self.row: dict[str, Any] | None = None

    def add(self, step: int, values: dict[str, Any]) -> None:
        """Add byte counts to the record of ``step`` (started by the first source that adds one)."""
        if self.row is None:
            self.row = {"step": step, "time": time.time()}
        self.row.update(values)

    def discard(self) -> None:
        """Drop what was gathered (a failed step records no memory row; its retry is sampled instead)."""
        self.row = None

    def take(self) -> dict[str, Any]:
        """The finished record, with ``other_bytes`` (call it when :attr:`row` is not None)."""
        mem, self.row = self.row, None
        return with_other_bytes(mem if mem is not None else {})
