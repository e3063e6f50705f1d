"""Where published segments go: a shared folder or an object store (S3, GCS, MinIO), through fsspec.

A run location is either a path (a folder, possibly on NFS, Lustre or FUSE) or a URL
(``s3://bucket/runs/exp1``, ``gs://...``, ``memory://...``). :func:`open_store` gives a
:class:`Store` over it: a handful of whole-object operations (put, get, list, remove), which is all
append-only publication needs and all an object store offers. A put is atomic for readers
everywhere: an object store makes an object visible whole; on a filesystem the bytes go to a hidden
name, are flushed, then renamed.

Credentials and endpoints come from the usual places, read by each driver: S3 (s3fs) ``AWS_ACCESS_KEY_ID``,
``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3`` (MinIO and other S3-compatible servers, addressed path-style),
``~/.aws``; GCS (gcsfs) ``GOOGLE_APPLICATION_CREDENTIALS``, ``STORAGE_EMULATOR_HOST``; Azure (adlfs, ``az://``)
``AZURE_STORAGE_CONNECTION_STRING`` or ``AZURE_STORAGE_ACCOUNT_NAME`` with a key, SAS token or service
principal; fsspec's config; gpudash adds only short connect/read timeouts and few retries, so a
store that does not answer costs a reader seconds, not minutes (the training side uploads from
its own thread and never waits on the network at all).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from gpudash.errors import RunError
from gpudash.store.atomic import write_atomic
from gpudash.store.localdisk import MAX_OBJECT_BYTES, RUN_META_BYTES, staging_dir

__all__ = ["ENDPOINT_ENV", "MAX_OBJECT_BYTES", "RUN_META_BYTES", "Store", "is_url", "local_staging", "missing_driver",
           "open_store", "run_name"]

_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
#: Object-store client settings: seconds to connect and to read, attempts per request.
CONNECT_S = 5
READ_S = 30
ATTEMPTS = 2
#: scheme -> (the fsspec driver it needs, gpudash's extra that installs it)
_DRIVERS = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
            "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"), "abfss": ("adlfs", "azure")}
#: scheme -> where its driver reads credentials (said when opening the store fails for want of them)
_CREDENTIALS = {
    **dict.fromkeys(("s3", "s3a"), "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or ~/.aws (endpoint: AWS_ENDPOINT_URL)"),
    **dict.fromkeys(("gs", "gcs"), "GOOGLE_APPLICATION_CREDENTIALS or gcloud's default login (emulator: "
                                   "STORAGE_EMULATOR_HOST)"),
    **dict.fromkeys(("az", "abfs", "abfss"), "AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
                                             "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or a service principal "
                                             "(AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_TENANT_ID)"),
}
#: An S3-compatible endpoint (MinIO, Ceph, moto): ``gpudash serve --endpoint-url`` sets it, botocore reads it.
ENDPOINT_ENV = "AWS_ENDPOINT_URL_S3"


def is_url(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` names an object store (``scheme://...``) rather than a folder."""
    return isinstance(location, str) and bool(_URL.match(location)) and not location.startswith("file://")


def run_name(location: str | os.PathLike[str]) -> str:
    """The last part of a run's path or URL (``s3://b/runs/exp1`` -> ``exp1``)."""
    return str(location).rstrip("/").rsplit("/", 1)[-1] or "run"


def local_staging(location: str) -> Path:
    """A node-local folder for a run recorded into an object store (``$GPUDASH_LOCAL_DIR``, else the
    temporary folder): the live database and the segments waiting for upload live there."""
    return staging_dir(run_name(location))


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
        write_atomic(path, data, fsync=True)  # other hosts read it: on the disk before its name is

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
        endpoint = os.environ.get(ENDPOINT_ENV) or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:  # botocore reads it too; said here for clients that predate it
            kwargs["client_kwargs"] = {"endpoint_url": endpoint}
            # MinIO and most S3-compatible servers answer path-style requests (bucket in the path, not the host)
            kwargs["config_kwargs"]["s3"] = {"addressing_style": "path"}
    try:
        fs, root = fsspec.core.url_to_fs(url, **kwargs)
    except ImportError:
        raise RunError(missing_driver(url)) from None
    except (ValueError, TypeError) as exc:
        where = _CREDENTIALS.get(scheme)
        if where is None:
            raise RunError(f"{url}: not a storage location fsspec knows ({exc})") from None
        raise RunError(f"{url}: cannot open the store ({str(exc)[:200]}); its credentials come from {where}") from None
    return fs, str(root).rstrip("/")


def missing_driver(url: str) -> str:
    """The one line saying which package a URL's scheme needs and how to install it."""
    scheme = url.split("://", 1)[0].lower()
    package, extra = _DRIVERS.get(scheme, (None, None))
    if package is None:
        return f"{url}: no fsspec driver for {scheme}:// is installed; install the one for {scheme}://"
    return f"{url}: {scheme}:// needs the package {package}, which is not installed; pip install 'gpudash[{extra}]'"


def open_store(location: str | os.PathLike[str]) -> Store:
    """A :class:`Store` over a run folder or object-store URL (:class:`RunError` when no driver fits)."""
    return Store(location)
