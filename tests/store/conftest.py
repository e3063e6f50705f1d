"""Fixtures shared by the store's tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.s3 import s3  # noqa: F401 - the moto S3 server fixture, for every test here


@pytest.fixture
def tmpfs_8m(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB tmpfs (a disk that really fills), mounted for the test; skipped where mounting is refused."""
    path = tmp_path / "mnt"
    path.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(path)],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot run mount ({exc}); a real full disk needs root and a tmpfs")
    if r.returncode:
        pytest.skip(f"mount -t tmpfs not permitted here ({r.stderr.strip()}); a real full disk needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=20)
