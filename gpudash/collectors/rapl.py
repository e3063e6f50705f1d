"""CPU energy from RAPL (``/sys/class/powercap/intel-rapl:N/energy_uj``), for the ``host`` rows.

Each package domain (``intel-rapl:N``, not its ``intel-rapl:N:M`` parts, which the package already counts;
AMD's ``amd-rapl`` likewise) has a counter in µJ that wraps at ``max_energy_range_uj``. :class:`Rapl` sums
the packages' increments since it started, unwrapped, into ``cpu_energy_j``. Since Linux 5.10 the counters
are readable by root only (a side channel, CVE-2020-8694): where none is readable :func:`open_rapl` says why,
once, and nothing is sampled. ``GPUDASH_POWERCAP_ROOT`` (or :data:`POWERCAP_ROOT`) points elsewhere for tests.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["ENV_ROOT", "POWERCAP_ROOT", "Rapl", "open_rapl"]

POWERCAP_ROOT = "/sys/class/powercap"
ENV_ROOT = "GPUDASH_POWERCAP_ROOT"
_PACKAGE = re.compile(r"^(intel|amd)-rapl:\d+$")


def _read_int(path: Path) -> int:
    with open(path, "rb") as f:
        return int(f.read(32).strip())


class Rapl:
    """The packages' energy since start, in joules (:meth:`read`), counter wraparound included."""

    def __init__(self, domains: list[tuple[Path, int, int]]) -> None:
        self._domains = domains  # (energy_uj path, max range µJ, last reading µJ)
        self.total_uj = 0

    @property
    def packages(self) -> int:
        return len(self._domains)

    def read(self) -> float:
        """Joules since start. A domain that stops being readable keeps its energy so far."""
        for i, (path, top, last) in enumerate(self._domains):
            try:
                now = _read_int(path)
            except (OSError, ValueError):
                continue
            step = now - last if now >= last else now + top - last  # wrapped once since the last read
            self.total_uj += step
            self._domains[i] = (path, top, now)
        return self.total_uj / 1e6


def open_rapl(root: str | None = None) -> tuple[Rapl | None, str | None]:
    """``(Rapl, None)`` where a package counter is readable, else ``(None, why)``."""
    base = Path(root or os.environ.get(ENV_ROOT) or POWERCAP_ROOT)
    try:
        names = sorted(p.name for p in base.iterdir() if _PACKAGE.match(p.name))
    except OSError:
        return None, f"no RAPL counters ({base} not readable)"
    if not names:
        return None, f"no RAPL package counters under {base} (not an Intel/AMD CPU with powercap)"
    domains, why = [], ""
    for name in names:
        d = base / name
        try:
            domains.append((d / "energy_uj", _read_int(d / "max_energy_range_uj"), _read_int(d / "energy_uj")))
        except (OSError, ValueError) as exc:
            why = f"{d / 'energy_uj'}: {getattr(exc, 'strerror', None) or exc} (readable by root only since Linux 5.10)"
    if not domains:
        return None, why
    return Rapl(domains), None
