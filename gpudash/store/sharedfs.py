"""Shared-filesystem safe mode: a run directory on NFS, Lustre, GPFS, CephFS, SMB or a FUSE mount.

SQLite's write-ahead log keeps its index in shared memory (``-shm``), which
only works between processes of one host; a reader on another node that opens
a live WAL database over NFS can read stale or torn pages. So when a run
directory is on a network or FUSE filesystem each rank keeps its live
database on node-local storage (``$GPUDASH_LOCAL_DIR``, else ``$TMPDIR``) and
publishes what it records into the run directory as append-only segments
(:mod:`gpudash.store.publish`). Runs published by older versions as whole
copies (``rankN.db`` in rollback-journal mode, replaced by rename) still read:
:mod:`gpudash.store.rankfile` opens them immutable and reopens a replaced one.

:func:`shared_mode` decides: ``GPUDASH_SHARED_FS=1``/``0`` forces the mode;
otherwise the filesystem type of the run directory's mount is read from
``/proc/self/mountinfo`` (``statfs`` magic numbers do not tell FUSE
filesystems apart, and FUSE is how most object-store and cluster mounts look).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["LOCAL_DIR_ENV", "SHARED_ENV", "SHARED_FS_TYPES", "mount_of", "shared_mode"]

#: ``1`` forces shared-filesystem mode, ``0`` turns it off (e.g. a FUSE mount only this host uses).
SHARED_ENV = "GPUDASH_SHARED_FS"
#: Where the live databases go in shared mode (default: the temporary folder, ``$TMPDIR``).
LOCAL_DIR_ENV = "GPUDASH_LOCAL_DIR"
#: Filesystem types (as ``/proc/self/mountinfo`` names them) that other hosts may share.
SHARED_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "ceph", "cifs", "smb3", "smbfs", "9p", "afs", "beegfs", "glusterfs",
    "gfs2", "ocfs2", "pvfs2", "orangefs", "panfs", "wekafs", "fuse", "virtiofs",
})
_LOCAL_FUSE = frozenset({"fuseblk", "fusectl"})  # a local disk through FUSE (ntfs-3g), the FUSE control fs
_MOUNTINFO = "/proc/self/mountinfo"


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (``\\040``)."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _mounts(text: str) -> list[tuple[str, str, str]]:
    """(mount point, filesystem type, source) of each line of a mountinfo text."""
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        parts, rest = left.split(), right.split()
        if not sep or len(parts) < 5 or not rest:
            continue
        out.append((_unescape(parts[4]), rest[0], _unescape(rest[1]) if len(rest) > 1 else ""))
    return out


def mount_of(path: str | os.PathLike[str], mountinfo: str | None = None) -> tuple[str, str, str] | None:
    """(mount point, filesystem type, source) of the mount that holds ``path`` (the nearest existing
    folder above it when it does not exist yet); None when ``/proc/self/mountinfo`` cannot be read."""
    if mountinfo is None:
        try:
            with open(_MOUNTINFO, encoding="utf-8", errors="surrogateescape") as f:
                mountinfo = f.read()
        except OSError:
            return None
    p, tail = Path(os.path.abspath(path)), []
    while not p.exists() and p != p.parent:  # a run folder not made yet: its nearest existing parent
        tail.append(p.name)
        p = p.parent
    real = os.path.join(os.path.realpath(p), *reversed(tail))
    best: tuple[str, str, str] | None = None
    for mount in _mounts(mountinfo):  # the last of equal mount points is the one on top
        point = mount[0]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = mount
    return best


def shared_mode(run_dir: str | os.PathLike[str], mountinfo: str | None = None) -> str | None:
    """Why ``run_dir`` needs shared-filesystem mode (one line), or None when it does not."""
    forced = os.environ.get(SHARED_ENV, "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return f"{SHARED_ENV}={os.environ[SHARED_ENV].strip()}"
    if forced in ("0", "false", "no", "off"):
        return None
    mount = mount_of(run_dir, mountinfo)
    if mount is None:
        return None
    point, fstype, source = mount
    if fstype in SHARED_FS_TYPES or (fstype.startswith("fuse.") and fstype not in _LOCAL_FUSE):
        return f"{point} is a {fstype} mount ({source or 'no source'})"
    return None
