"""Numbers as people read them: bytes in binary units (as torch's OOM message), durations.

Standard library only: shared by the terminal (``gpudash info``), the dashboard and the report.
"""

from __future__ import annotations

import math

__all__ = ["fmt_duration", "human_bytes"]


def human_bytes(n: float | None) -> str:
    """``1536`` -> ``1.5 KiB``; missing or non-finite -> ``-``."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_duration(seconds: float | None, missing: str = "-") -> str:
    """``0.0123`` -> ``12.3 ms``; up to hours."""
    if seconds is None or not math.isfinite(float(seconds)):
        return missing
    s = float(seconds)
    if abs(s) < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if abs(s) < 1:
        return f"{s * 1e3:.1f} ms"
    if abs(s) < 120:
        return f"{s:.2f} s"
    if abs(s) < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
