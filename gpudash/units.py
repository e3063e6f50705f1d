"""Numbers as people read them: bytes in binary units (as torch's OOM message), durations, plain numbers.

Standard library only, and the one place units are converted and labelled: the terminal (``gpudash info``,
``gpudash estimate``), the dashboard, the report, alerts and the trainer all print bytes with
:func:`human_bytes`, so one number reads the same on every surface; a chart's bytes axis picks its unit
with :func:`byte_unit`; a size torch printed is read back with :func:`parse_size`; a number the user gave
in a flag's unit is echoed with :func:`given` (tests/test_units_bytes.py fails on a unit label formatted
anywhere else).
"""

from __future__ import annotations

import math
import re
from typing import Literal

__all__ = ["BYTE_UNITS", "GiB", "KiB", "MiB", "UNIT_BYTES", "byte_unit", "distinct_bytes", "fmt_duration", "fmt_num",
           "given", "human_bytes", "parse_size"]

KiB = 2**10
MiB = 2**20
GiB = 2**30

#: The binary byte units, smallest first (as torch's OOM message): plotly's own ``s`` tick format would
#: say "MB" for MiB values.
BYTE_UNITS: tuple[tuple[str, int], ...] = (("B", 1), ("KiB", KiB), ("MiB", MiB), ("GiB", GiB), ("TiB", 2**40))

#: Bytes per unit as torch prints them: binary, whatever the label (c10's ``format_size`` prints KiB, MiB,
#: GiB; the MPS allocator labels the same powers of 1024 KB, MB, GB, so a "GB" there is 2**30, never 10**9).
UNIT_BYTES: dict[str, int] = {"b": 1, "byte": 1, "bytes": 1, **{u.lower(): n for u, n in BYTE_UNITS[1:]},
                              **{u.lower().replace("i", ""): n for u, n in BYTE_UNITS[1:]}}


def human_bytes(n: float | None, digits: int = 1, missing: str = "-") -> str:
    """``1536`` -> ``1.5 KiB`` (``digits`` decimals); missing or non-finite -> ``missing``."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return missing
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{digits}f} {unit}"
        n /= 1024
    return f"{n:.{digits}f} TiB"


def distinct_bytes(*values: float | None, min_digits: int = 1, max_digits: int = 4) -> list[str]:
    """``values`` in binary units with the fewest decimals (at least ``min_digits``) that
    print different values differently: ``3660000, 3662640`` -> ``3.490 MiB, 3.493 MiB``,
    never ``3.5 MiB of 3.5 MiB``. Values equal to the byte print alike."""
    out: list[str] = []
    for digits in range(min_digits, max(min_digits, max_digits) + 1):
        out = [human_bytes(v, digits) for v in values]
        clash = any(out[i] == out[j] and values[i] != values[j]
                    for i in range(len(values)) for j in range(i + 1, len(values)))
        if not clash:
            return out
    return [human_bytes(v, max_digits) if v is None or out.count(human_bytes(v, max_digits)) == 1
            else f"{float(v):,.0f} B" for v in values]


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


def fmt_num(v: float | None, digits: int = 3) -> str:
    """A rate or count: ``12,345`` from 1000 up, else ``digits`` significant digits; missing -> ``-``."""
    if v is None or not math.isfinite(v):
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def byte_unit(top: float | None) -> tuple[str, float]:
    """The binary unit a bytes axis whose largest absolute value is ``top`` is drawn in: ``(name, bytes per
    unit)``; MiB when there is no value yet."""
    if top is None or not math.isfinite(top):
        return "MiB", float(MiB)
    for name, size in reversed(BYTE_UNITS):
        if abs(top) >= size:
            return name, float(size)
    return "B", 1.0


def parse_size(text: str) -> int:
    """``"20.00 MiB"`` -> 20971520: a size as torch prints it (binary, whatever the label); ValueError for
    anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*", text)
    if not m or m.group(2).lower() not in UNIT_BYTES:
        raise ValueError(f"not a size: {text!r}")
    return int(round(float(m.group(1)) * UNIT_BYTES[m.group(2).lower()]))


def given(value: float, unit: Literal["GB", "GiB", "MB", "GB/s"]) -> str:
    """A number the user gave in a flag's own unit, echoed as given: ``given(8, "GB")`` -> ``8 GB``
    (``--card-gb 8``), ``given(16, "GB/s")`` -> ``16 GB/s``."""
    return f"{value:g} {unit}"


def fmt_gap(seconds: float | None, missing: str = "?") -> str:
    """A wall-clock gap in whole units, as people say it: ``192`` -> ``3 min 12 s``, ``7500`` -> ``2 h 5 min``."""
    if seconds is None or not math.isfinite(float(seconds)):
        return missing
    s = max(0, round(float(seconds)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min" if s % 3600 // 60 else f"{s // 3600} h"
    return f"{s // 86400} d {s % 86400 // 3600} h"
