"""Where published segments go: a shared folder or an object store (S3, GCS, MinIO), through fsspec.

A run location is either a path (a folder, possibly on NFS, Lustre or FUSE) or a URL
(``s3://bucket/runs/exp1``, ``gs://...``, ``memory://...``). :func:`open_store` gives a
:class:`Store` over it: a handful of whole-object operations (put, get, list, remove), which is all
append-only publication needs and all an object store offers. A put is atomic for readers
everywhere: an object store makes an object visible whole; on a filesystem the bytes go to a hidden
name, are flushed, then renamed.

Credentials and endpoints come from the usual places (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``,
``~/.aws``, fsspec's config); gpudash adds only short connect/read timeouts and few retries, so a
store that does not answer costs a reader seconds, not minutes (the training side uploads from
its own thread and never waits on the network at all).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from gpudash.errors import RunError

__all__ = ["MAX_OBJECT_BYTES", "RUN_META_BYTES", "Store", "is_url", "local_staging", "open_store", "run_name"]

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
#: Largest object read whole (a compacted table of a long run is a few hundred MB at most).
MAX_OBJECT_BYTES = 4 << 30
#: The largest ``run.json`` read (gpudash writes a few kB).
RUN_META_BYTES = 4 << 20
#: Object-store client settings: seconds to connect and to read, attempts per request.
CONNECT_S = 5
READ_S = 30
ATTEMPTS = 2
_EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names an object store (``scheme://...``) rather than a folder."""
    return isinstance(location, str) and bool(_URL.match(location)) and not location.startswith("file://")


def run_name(location: str | os.PathLike[str]) -> str:
    """The last part of a run's path or URL (``s3://b/runs/exp1`` -> ``exp1``)."""
    return str(location).rstrip("/").rsplit("/", 1)[-1] or "run"


def local_staging(location: str) -> Path:
    """A node-local folder for a run recorded into an object store (``$GPUDASH_LOCAL_DIR``, else the
    temporary folder): the live database and the segments waiting for upload live there."""
    from gpudash.store.sharedfs import LOCAL_DIR_ENV

    base = os.environ.get(LOCAL_DIR_ENV) or tempfile.gettempdir()
    Path(base).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"gpudash-{run_name(location)}-", dir=base))


class Store:
    """Whole-object operations on the folder or prefix of one location; names are ``/``-separated
    paths relative to it."""

    def __init__(self, location: str | os.PathLike[str]) -> None:
        self.location = str(location).rstrip("/") if is_url(location) else os.fspath(location)
        self.remote = is_url(location)
        #: links met by the last :meth:`find` of a folder (never followed; the reader names them)
        self.links: list[str] = []
        if self.remote:
            self.fs, self.root = _remote_fs(self.location)
        else:
            import fsspec.implementations.local

            self.fs = fsspec.implementations.local.LocalFileSystem()
            self.root = os.path.abspath(self.location)

    def _full(self, name: str) -> str:
        return f"{self.root}/{name}" if name else self.root

    def put(self, name: str, data: bytes) -> None:
        """Write one object whole: readers see the old one or the new one, never a part."""
        full = self._full(name)
        if self.remote:
            self.fs.pipe_file(full, data)
            return
        path = Path(full)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            # a name planted beforehand (a link to another file) is removed, never written through
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get(self, name: str, limit: int = MAX_OBJECT_BYTES, size: int | None = None) -> bytes:
        """One object's bytes (``FileNotFoundError`` when absent; ``OSError`` when over ``limit``); ``size``: the
        object's size as a listing just gave it (no request to ask it again; the bytes read are still bounded)."""
        full = self._full(name)
        if not self.remote:  # no link followed below the folder; a FIFO or device would block or never end
            from gpudash.store.bounded import read_below

            return read_below(self.root, name, limit)
        if size is not None and size <= limit:
            head = self.fs.cat_file(full, start=0, end=limit + 1)
            if len(head) > limit:  # replaced by a larger object since the listing
                from gpudash.store.bounded import UnsafeFile

                raise UnsafeFile(f"{name} is over the {limit:,} bytes read at most; not read")
            return bytes(head)
        size = self.fs.size(full)
        if size is not None and size > limit:
            from gpudash.store.bounded import UnsafeFile

            raise UnsafeFile(f"{name} is {size:,} bytes, over the {limit:,} read at most; not read")
        data: bytes = self.fs.cat_file(full)
        return data

    def find(self, prefix: str) -> list[str]:
        """Names (relative to the store) of every file under folder ``prefix``: one listing request
        on an object store, however many ranks and tables."""
        full = self._full(prefix)
        if not self.remote:  # no link is listed or entered: they are kept in ``links`` for the reader to name
            from gpudash.store.bounded import walk_below

            files, links = walk_below(self.root, prefix)
            self.links = sorted(links)
            return sorted(n for n in files if not n.rsplit("/", 1)[-1].startswith("."))
        self.fs.invalidate_cache(full)
        try:
            found = self.fs.find(full)
        except FileNotFoundError:
            return []
        root = self.root.rstrip("/") + "/"
        return sorted(str(f)[len(root):] for f in found if str(f).startswith(root)
                      and not str(f).rsplit("/", 1)[-1].startswith("."))

    def folders(self, prefix: str) -> list[str]:
        """Names of the folders directly in ``prefix`` (``[]`` when it does not exist)."""
        full = self._full(prefix)
        if self.remote:
            self.fs.invalidate_cache(full)
        try:
            entries = self.fs.ls(full, detail=True)
        except FileNotFoundError:
            return []
        return sorted(str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")

    def remove(self, name: str) -> None:
        try:
            self.fs.rm_file(self._full(name))
        except FileNotFoundError:
            pass

    def exists(self, name: str) -> bool:
        full = self._full(name)
        if self.remote:
            self.fs.invalidate_cache(full.rsplit("/", 1)[0])
        return bool(self.fs.exists(full))

    def child(self, name: str) -> Store:
        """The store of a sub-folder (a run inside a folder of runs)."""
        return Store(f"{self.location}/{name}" if self.remote else os.path.join(self.location, name))


def _remote_fs(url: str) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec is a dependency
        raise RunError(f"{url}: object storage needs fsspec (pip install fsspec)") from None
    scheme = url.split("://", 1)[0].lower()
    kwargs: dict[str, Any] = {}
    if scheme in ("s3", "s3a"):
        kwargs["config_kwargs"] = {"connect_timeout": CONNECT_S, "read_timeout": READ_S,
                                   "retries": {"max_attempts": ATTEMPTS}}
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:  # botocore reads it too; said here for clients that predate it
            kwargs["client_kwargs"] = {"endpoint_url": endpoint}
    try:
        fs, root = fsspec.core.url_to_fs(url, **kwargs)
    except ImportError as exc:
        extra = _EXTRAS.get(scheme)
        fix = f"pip install 'gpudash[{extra}]'" if extra else f"install the fsspec driver for {scheme}://"
        raise RunError(f"{url}: no driver for {scheme}:// ({exc}); {fix}") from None
    except (ValueError, TypeError) as exc:
        raise RunError(f"{url}: not a storage location fsspec knows ({exc})") from None
    return fs, str(root).rstrip("/")


def open_store(location: str | os.PathLike[str]) -> Store:
    """A :class:`Store` over a run folder or object-store URL (:class:`RunError` when no driver fits)."""
    return Store(location)
