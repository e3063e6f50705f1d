"""Stability lights and their thresholds: green = fine, amber = look at it, red = act, grey = not recorded.

The dashboard's row of lights, ``/api/.../summary`` and the report render
these; the thresholds live here only.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from gpudash.analysis.frames import numeric as _col

__all__ = ["FRAG_BAD_PCT", "FRAG_WARN_PCT", "NONFINITE_BAD_SHARE", "RETRIES_BAD", "SPIKES_BAD", "Light",
           "fragmentation_pct", "stability_lights"]

FRAG_WARN_PCT = 30.0
"""Inactive split blocks above this share of reserved memory: amber light and a fragmentation verdict."""
FRAG_BAD_PCT = 50.0
"""... above this: red light."""
SPIKES_BAD = 2
"""More loss spikes than this: red (one or two: amber)."""
NONFINITE_BAD_SHARE = 0.05
"""Non-finite steps above this share of the run: red."""
RETRIES_BAD = 10
"""cudaMalloc retries at or above this: red (fewer: amber)."""


@dataclass(frozen=True)
class Light:
    signal: str
    light: str  # green | amber | red | grey
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"signal": self.signal, "light": self.light, "detail": self.detail}


def fragmentation_pct(memory: pd.DataFrame) -> float | None:
    """The worst share (%) of reserved memory that sat in inactive split blocks over the run
    (``fragmentation_pct`` as the allocator collector records it, else split / reserved); None if not recorded."""
    frag = _col(memory, "fragmentation_pct")
    if frag is None:
        split, reserved = _col(memory, "inactive_split_bytes"), _col(memory, "reserved_bytes")
        if split is None or reserved is None:
            return None
        frag = 100.0 * split / reserved.where(reserved > 0)
        if not frag.notna().any():
            return None
    return float(frag.max())


def stability_lights(*, steps: int, loss_logged: bool, spikes: int, nonfinite: int, nonfinite_recorded: bool,
                     ooms: int, retries: int | None, frag_pct: float | None) -> list[Light]:
    """The lights from facts already derived (see :func:`gpudash.analysis.facts.run_facts`)."""
    out = []
    if loss_logged:
        out.append(Light("loss spikes", "green" if spikes == 0 else "amber" if spikes <= SPIKES_BAD else "red",
                         f"{spikes} spike(s) in {steps} steps"))
    else:
        out.append(Light("loss spikes", "grey", "loss not logged"))
    if nonfinite_recorded:
        share = nonfinite / max(steps, 1)
        out.append(Light("non-finite / skipped", "green" if nonfinite == 0 else
                         "amber" if share < NONFINITE_BAD_SHARE else "red", f"{nonfinite} step(s)"))
    else:
        out.append(Light("non-finite / skipped", "grey", "not recorded"))
    out.append(Light("OOMs", "green" if ooms == 0 else "red", f"{ooms} OOM(s)"))
    if retries is None:
        out.append(Light("allocator retries", "grey", "no allocator data"))
    else:
        out.append(Light("allocator retries", "green" if retries == 0 else "amber" if retries < RETRIES_BAD
                         else "red", f"{retries} cudaMalloc retries"))
    if frag_pct is None:
        out.append(Light("fragmentation", "grey", "no allocator data"))
    else:
        out.append(Light("fragmentation", "green" if frag_pct < FRAG_WARN_PCT else
                         "amber" if frag_pct < FRAG_BAD_PCT else "red",
                         f"up to {frag_pct:.0f} % of reserved memory was split free blocks"))
    return out
