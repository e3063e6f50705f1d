"""The phase set of a run: what ``monitor.phase()`` opened, never a guess from a column suffix.

The Monitor records each phase name in the run meta (``phases``) the first
time it is opened; a step writes its time in that phase to ``<name>_s``.
Runs recorded before that record existed fall back to the known phase names
only, so a user's ``eval_time_s`` scalar or the trainer's ``ckpt_total_s``
never become phases.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

__all__ = ["KNOWN_PHASES", "phase_columns", "run_phases"]

#: Phase names of the trainer and the integrations (the fallback for runs without a ``phases`` record).
KNOWN_PHASES = ("data", "forward", "backward", "optimizer", "offload")


def _names(meta: Mapping[str, Any] | None) -> list[str]:
    rec = (meta or {}).get("phases")
    if isinstance(rec, (list, tuple)) and all(isinstance(p, str) for p in rec):
        return list(dict.fromkeys(rec))
    return list(KNOWN_PHASES)


def run_phases(meta: Mapping[str, Any] | None, steps: pd.DataFrame | Iterable[str]) -> list[str]:
    """Phase names of a run that have a ``<name>_s`` column with data: known phases first, then in the
    order they were first opened. ``steps`` is the steps frame (or just its column names)."""
    names = _names(meta)
    ordered = [p for p in KNOWN_PHASES if p in names] + [p for p in names if p not in KNOWN_PHASES]
    if isinstance(steps, pd.DataFrame):  # only the phases' own columns are looked at
        return [p for p in ordered if f"{p}_s" in steps and bool(steps[f"{p}_s"].notna().any())]
    present = set(steps)
    return [p for p in ordered if f"{p}_s" in present]


def phase_columns(steps: pd.DataFrame, meta: Mapping[str, Any] | None = None) -> list[str]:
    """The ``<phase>_s`` columns of :func:`run_phases`."""
    return [f"{p}_s" for p in run_phases(meta, steps)]
