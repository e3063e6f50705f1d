"""Reading the recorded frames as numbers: the one rule every fact uses for a column."""

from __future__ import annotations

from typing import Any

import pandas as pd

__all__ = ["numeric", "sampled"]


def sampled(run: Any, table: str) -> pd.DataFrame:
    """The run's ``host`` or ``device`` rows; empty for a run built in memory without a reader or those rows."""
    if table in getattr(run, "__dict__", {}) or getattr(run, "_reader", None) is not None:
        return getattr(run, table)  # type: ignore[no-any-return]
    return pd.DataFrame()


def numeric(df: pd.DataFrame, col: str) -> pd.Series | None:
    """``df[col]`` as numbers (text and damaged cells read as NaN); None when the column is absent or holds no
    number at all (a source that recorded nothing, not a zero)."""
    if col not in df:
        return None
    v = pd.to_numeric(df[col], errors="coerce")
    return v if v.notna().any() else None
