"""The one place that decides what gpudash keeps on local disk for runs stored elsewhere, and how much it reads.

- where: :func:`staging_dir` makes a private folder under ``$GPUDASH_LOCAL_DIR`` (else the temporary folder) for
  a run recorded into an object store (its live database and outbox) and a runs list's metadata; the opened
  runs' fetched segments go under :func:`cache_base`;
- how much: the largest object read whole (:data:`MAX_OBJECT_BYTES`), the largest ``run.json`` and rank
  ``meta.json`` read (:data:`RUN_META_BYTES`, :data:`META_BYTES`), and the bytes the opened runs' fetched
  segments may hold on disk (:func:`cache_limit`: ``gpudash serve --cache-mb``, else ``$GPUDASH_CACHE_MB``,
  else :data:`CACHE_MB`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from gpudash.store.sharedfs import LOCAL_DIR_ENV

__all__ = ["CACHE_MB", "CACHE_MB_ENV", "LOCAL_DIR_ENV", "MAX_OBJECT_BYTES", "META_BYTES", "RUN_META_BYTES",
           "cache_base", "cache_limit", "parse_cache_mb", "set_cache_limit", "staging_base", "staging_dir"]

#: Largest object read whole (a compacted table of a long run is a few hundred MB at most).
MAX_OBJECT_BYTES = 4 << 30
#: The largest ``run.json`` read from a store (gpudash writes a few kB).
RUN_META_BYTES = 4 << 20
#: The largest rank ``meta.json`` read (gpudash writes a few kB).
META_BYTES = 4 << 20
#: Default bound of the opened runs' fetched segments on local disk, MB.
CACHE_MB = 2048
CACHE_MB_ENV = "GPUDASH_CACHE_MB"
_LIMIT: list[int | None] = [None]  # set by ``gpudash serve --cache-mb``


def staging_base() -> Path:
    """The folder local copies go under (created when missing)."""
    base = Path(os.environ.get(LOCAL_DIR_ENV) or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    return base


def cache_base() -> Path:
    """The folder the opened runs' fetched segments go under: ``.gpudash-cache`` in :func:`staging_base` (a
    hidden name: never listed as a run when the runs folder is the staging folder itself)."""
    base = staging_base() / ".gpudash-cache"
    base.mkdir(mode=0o700, exist_ok=True)
    return base


def staging_dir(prefix: str) -> Path:
    """A new private folder (mode 0700) under :func:`staging_base`, named ``gpudash-PREFIX-...``."""
    return Path(tempfile.mkdtemp(prefix=f"gpudash-{prefix}-", dir=staging_base()))


MAX_CACHE_MB = 1 << 40
"""The largest cache size the flag takes (an exbibyte: beyond any disk; a number past it is a typo)."""


def parse_cache_mb(text: str, where: str = "--cache-mb") -> int:
    """Bytes of a cache size given in MB (a positive number); ``ValueError`` with one line naming the fix."""
    try:
        mb = float(text)
    except ValueError:
        raise ValueError(f"{where} {text!r}: not a number of MB (e.g. {where} 512)") from None
    if not mb > 0 or mb == float("inf"):
        raise ValueError(f"{where} {text!r}: must be a positive number of MB (e.g. {where} 512)")
    if mb > MAX_CACHE_MB:
        raise ValueError(f"{where} {text!r}: more than any disk holds (e.g. {where} 512)")
    return max(1, int(mb * (1 << 20)))


def set_cache_limit(nbytes: int | None) -> None:
    """Bound the fetched segments of opened runs to ``nbytes`` on disk (None: back to the default)."""
    _LIMIT[0] = nbytes


def cache_limit() -> int:
    """Bytes the opened runs' fetched segments may hold on local disk."""
    if _LIMIT[0] is not None:
        return _LIMIT[0]
    env = os.environ.get(CACHE_MB_ENV)
    if env:
        try:
            return parse_cache_mb(env, CACHE_MB_ENV)
        except ValueError:
            pass  # said by ``gpudash serve`` at start; the default holds
    return CACHE_MB << 20
