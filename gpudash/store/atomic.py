"""Writing a file whole: a hidden temporary name beside it, then a rename (``os.replace``).

Every file gpudash writes for a reader to find (a run's ``run.json``, an object put on a shared folder, a runs
list's copied metadata, a cached page bundle, a process's last word) goes through :func:`write_atomic`, so a
reader sees the old file or the new one, never a part, and a name planted beforehand (a link to another file)
is removed, never written through.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: bytes | str | None, *, root: str | os.PathLike[str] | None = None,
                 fsync: bool = False, exclusive: bool = False, size: int = 0) -> bool:
    """Write ``data`` to ``path`` whole; returns False only when ``exclusive`` and ``path`` already exists.

    ``root``: a folder above ``path`` below which no link is followed (the temporary file is opened with
    :func:`gpudash.store.bounded.open_below`). ``fsync``: flushed to the disk before the rename (shared
    folders other hosts read). ``exclusive``: create only when absent, atomically across processes (a hard
    link, for ``run.json`` that every rank offers). ``data`` None: a sparse file of ``size`` bytes."""
    dest = Path(path)
    if exclusive and dest.exists():
        return False
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a name planted beforehand is removed, never written through
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
        if root is not None:
            from gpudash.store.bounded import open_below

            fd = open_below(root, os.path.relpath(tmp, root).replace(os.sep, "/"), flags)
        else:
            fd = os.open(tmp, flags | getattr(os, "O_NOFOLLOW", 0), 0o644)
        with os.fdopen(fd, "wb") as f:
            if data is None:
                f.truncate(size)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if exclusive:
            try:
                os.link(tmp, dest)  # atomic "create if absent"
                return True
            except FileExistsError:
                return False
            except OSError:  # a filesystem without hard links: a rename (the last writer wins)
                pass
        os.replace(tmp, dest)
        return True
    finally:
        tmp.unlink(missing_ok=True)
