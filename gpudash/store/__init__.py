"""The run directory: writer (training side), reader and ``load_run`` (dashboard side).

Imports only the standard library, numpy and pandas (and, for runs published to
shared storage, pyarrow and fsspec, when first used), so a run copied from a
cluster opens on a laptop without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudash.store.reader import RunReader
    from gpudash.store.run import Run, load_run
    from gpudash.store.writer import Recorder

__all__ = ["Recorder", "Run", "RunReader", "load_run"]


def __getattr__(name: str) -> Any:
    # imported when first used: a command that only writes (gpudash import-snapshot) does not pay for pandas
    if name == "Recorder":
        from gpudash.store.writer import Recorder

        return Recorder
    if name == "RunReader":
        from gpudash.store.reader import RunReader

        return RunReader
    if name in ("Run", "load_run"):
        from gpudash.store import run

        return getattr(run, name)
    raise AttributeError(f"module 'gpudash.store' has no attribute {name!r}")
