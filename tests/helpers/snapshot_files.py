"""Snapshot pickles to import in a known order: an imported snapshot's time is its file's modification time, and
a fresh clone gives the fixtures whatever times the checkout happened to write them at (a few ms apart, either
way round), so a test that imports two must set them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def in_order(files: list[Path], into: Path) -> list[Path]:
    """Copies of ``files`` in ``into``, each modified one second after the one before it."""
    into.mkdir(parents=True, exist_ok=True)
    out = []
    t = 1_700_000_000.0
    for i, f in enumerate(files):
        dst = into / f"{i}-{f.name}"
        shutil.copyfile(f, dst)
        os.utime(dst, (t + i, t + i))
        out.append(dst)
    return out
