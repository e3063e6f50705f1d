"""The memory columns derived from recorded ones: frozen parameters (all parameters less the trainable ones),
the allocator's cache (reserved less allocated, and its share of reserved) and the breakdown at a step.

Derived here once; the memory chart (whole run and live extends), the breakdown at the cursor, the report's
memory chart and the facts (``frozen_params_bytes``) all use these, so they cannot disagree on what
"frozen" or "cache" is. The two differences work on numpy arrays and plain floats alike.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import numpy as np
import pandas as pd

from gpudash.store.schema import MEMORY_PARTS

__all__ = ["BREAKDOWN", "DERIVED", "allocator_cache", "cache_share_pct", "frozen_params", "has_frozen_params",
           "memory_at"]

#: Derived column -> the recorded (minuend, subtrahend) it is the non-negative difference of.
DERIVED = {"frozen_params_bytes": ("params_bytes", "trainable_params_bytes"),
           "cache_bytes": ("reserved_bytes", "allocated_bytes")}
#: The breakdown's keys, bottom of the memory stack to top (:func:`memory_at`); the parameters are
#: ``frozen_params_bytes`` and ``trainable_params_bytes`` instead of ``params_bytes`` where some are frozen.
BREAKDOWN = (*MEMORY_PARTS, "cache_bytes", "non_pytorch_bytes")

# named, not read: `gpudash serve` defers numpy and pandas until after its first page, and the memory chart
# imports this module
A = TypeVar("A", "np.ndarray", float)


def frozen_params(params: A, trainable: A) -> A:
    """Parameter bytes that do not require grad (a frozen base under LoRA): all of them less the trainable
    ones, never below 0 (the two are read at slightly different moments)."""
    return cast(A, np.clip(params - trainable, 0, None))


def allocator_cache(reserved: A, allocated: A) -> A:
    """Bytes the caching allocator holds but no tensor uses: reserved less allocated, never below 0."""
    return cast(A, np.clip(reserved - allocated, 0, None))


def cache_share_pct(reserved: np.ndarray, allocated: np.ndarray) -> np.ndarray:
    """The allocator cache as a share (%) of reserved memory (NaN where nothing is reserved)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(reserved > 0, 100.0 * allocator_cache(reserved, allocated) / reserved, np.nan)


def has_frozen_params(memory: pd.DataFrame) -> bool:
    """Some parameters do not require grad (the recorded trainable bytes are below the parameter bytes)."""
    if "trainable_params_bytes" not in memory or "params_bytes" not in memory:
        return False
    t = pd.to_numeric(memory["trainable_params_bytes"], errors="coerce")
    p = pd.to_numeric(memory["params_bytes"], errors="coerce")
    return bool((p - t).gt(0).any())


def _derived(row: Any, name: str) -> float | None:
    a, b = DERIVED[name]
    if pd.isna(row.get(a)) or pd.isna(row.get(b)):
        return None
    fn = frozen_params if name == "frozen_params_bytes" else allocator_cache
    return float(fn(float(row[a]), float(row[b])))


def memory_at(memory: pd.DataFrame, step: int | None, rank: int = 0) -> dict[str, float]:
    """Bytes by part in the last memory record of ``rank`` at or before ``step`` (the newest if None), keyed
    as :data:`BREAKDOWN` (parts not recorded left out), with ``step`` (the record's) and ``peak`` (that step's
    own measured peak); {} when there is no such record."""
    if not len(memory):
        return {}
    m = memory[memory["rank"] == rank] if "rank" in memory else memory
    if step is not None and "step" in m:
        m = m[m["step"] <= step]
    if not len(m):
        return {}
    # sampled columns (activations) are NaN on most rows: take each one's latest value
    tail = m.tail(200).ffill().iloc[-1]
    out: dict[str, float] = {"step": float(tail.get("step", np.nan))}
    last = m.iloc[-1]
    if pd.notna(last.get("peak_bytes")):
        out["peak"] = float(last["peak_bytes"])  # that step's own measured peak (not carried forward)
    for key in BREAKDOWN:
        if key == "params_bytes" and has_frozen_params(m):
            frozen = _derived(tail, "frozen_params_bytes")
            if frozen is not None:
                out["frozen_params_bytes"] = frozen
                out["trainable_params_bytes"] = float(tail["trainable_params_bytes"])
                continue
        value = _derived(tail, key) if key in DERIVED else (None if pd.isna(tail.get(key)) else float(tail[key]))
        if value is not None:
            out[key] = value
    return out
