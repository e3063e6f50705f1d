"""Shared-filesystem safe mode: a run directory on NFS, Lustre, GPFS, CephFS, SMB or a FUSE mount.

SQLite's write-ahead log keeps its index in shared memory (``-shm``), which
only works between processes of one host; a reader on another node that opens
a live WAL database over NFS can read stale or torn pages. So when a run
directory is on a network or FUSE filesystem each rank keeps its live
database on node-local storage (``$GPUDASH_LOCAL_DIR``, else ``$TMPDIR``) and
:class:`Publisher` puts a checkpointed copy of it into the run directory every
``interval`` seconds, or less often once a copy of a big run takes longer than
a tenth of that (and when the run ends): copied aside, flushed to disk,
then renamed over ``rankN.db``, so a reader anywhere sees either the previous
complete copy or the new one, never a torn file. The copies are in rollback
journal mode with no ``-wal`` beside them, so readers open them read-only and
immutable (:mod:`gpudash.store.rankfile`) and reopen them when a newer copy
replaced the file. Live latency on a shared filesystem is then a few seconds.

:func:`shared_mode` decides: ``GPUDASH_SHARED_FS=1``/``0`` forces the mode;
otherwise the filesystem type of the run directory's mount is read from
``/proc/self/mountinfo`` (``statfs`` magic numbers do not tell FUSE
filesystems apart, and FUSE is how most object-store and cluster mounts look).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

__all__ = ["LOCAL_DIR_ENV", "PUBLISH_INTERVAL_S", "PUBLISH_SHARE", "SHARED_ENV", "SHARED_FS_TYPES", "Publisher", "mount_of",
           "shared_mode"]

#: ``1`` forces shared-filesystem mode, ``0`` turns it off (e.g. a FUSE mount only this host uses).
SHARED_ENV = "GPUDASH_SHARED_FS"
#: Where the live databases go in shared mode (default: the temporary folder, ``$TMPDIR``).
LOCAL_DIR_ENV = "GPUDASH_LOCAL_DIR"
#: Seconds between published copies (at least: see :data:`PUBLISH_SHARE`).
PUBLISH_INTERVAL_S = 3.0
#: Each copy is of the whole database: a big run's copies are spaced so that copying takes at most this share
#: of the time (a copy that took 2 s waits 20 s for the next), and the disk and network are not kept busy.
PUBLISH_SHARE = 0.1
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


class Publisher:
    """Keeps one rank's live database on node-local storage and publishes copies into the run directory.

    ``dest`` is ``run_dir/rankN.db``; :attr:`live_path` is where the writer keeps the live database.
    :meth:`publish` is called by the writer's thread (the only user of its connection)."""

    def __init__(self, dest: Path, interval: float | None = None) -> None:
        self.dest = dest
        self.interval = PUBLISH_INTERVAL_S if interval is None else interval
        base = os.environ.get(LOCAL_DIR_ENV) or tempfile.gettempdir()
        Path(base).mkdir(parents=True, exist_ok=True)
        self.live_dir = Path(tempfile.mkdtemp(prefix=f"gpudash-{dest.stem}-", dir=base))
        self.live_path = self.live_dir / dest.name
        self.published_at = 0.0
        #: seconds the last copy took (copying the whole database grows with the run)
        self.last_cost_s = 0.0
        #: the spacing the copies say they keep (``publish_interval`` in their meta: a reader calls a run whose
        #: copy is three of these old crashed); never exceeded
        self.advertised = self.interval

    def wanted(self) -> float:
        """The spacing to advertise in the next copy: twice what the last copy's cost asks for, so a run that
        grows a little before the copy after still keeps its word (the writer sets :attr:`advertised`)."""
        if self.interval <= 0:  # every flush (tests)
            return 0.0
        return max(self.interval, 2.0 * self.last_cost_s / PUBLISH_SHARE)

    @property
    def spacing(self) -> float:
        """Seconds from one copy to the next: :attr:`interval`, or longer once copies take more than
        :data:`PUBLISH_SHARE` of that (at most what the last copy said, :attr:`advertised`)."""
        return min(self.advertised, max(self.interval, self.last_cost_s / PUBLISH_SHARE))

    def due(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) - self.published_at >= self.spacing

    def publish(self, conn: sqlite3.Connection) -> None:
        """Copy the database behind ``conn`` (committed pages only) into ``dest`` by write-then-rename.
        The copy is made with SQLite's backup API on local storage, turned into a rollback-journal
        database, then copied to a hidden name beside ``dest``, flushed and renamed over it: SQLite never
        locks anything on the shared filesystem."""
        began = time.monotonic()
        snap = self.live_dir / "publish.db"
        snap.unlink(missing_ok=True)
        out = sqlite3.connect(snap)
        try:
            conn.backup(out)
            out.execute("PRAGMA journal_mode=DELETE")
        finally:
            out.close()
        tmp = self.dest.with_name(f".{self.dest.name}.{os.getpid()}.tmp")  # not matched by rank*.db
        try:
            with open(snap, "rb") as src, open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, self.dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            snap.unlink(missing_ok=True)
        _fsync_dir(self.dest.parent)
        self.published_at = time.time()
        self.last_cost_s = time.monotonic() - began

    def cleanup(self) -> None:
        """Remove the live copy (call after the last :meth:`publish`)."""
        shutil.rmtree(self.live_dir, ignore_errors=True)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some network filesystems refuse fsync on a folder; the rename is still atomic
    finally:
        os.close(fd)
