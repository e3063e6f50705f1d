"""gpudash: a live GPU memory and throughput dashboard for training runs.

``Monitor`` sits in the training loop; ``load_run`` reads a run directory
into pandas; ``load_snapshot`` reads a torch allocator snapshot pickle.
Importing gpudash imports none of them (not torch, dash or pandas): each name is
imported when first used, so ``gpudash serve`` binds its port before pandas loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpudash._version import __version__
from gpudash.errors import RunError

if TYPE_CHECKING:
    from gpudash.monitor import Monitor
    from gpudash.options import AlertOptions
    from gpudash.store import Run, load_run
    from gpudash.store.snapshot import MemoryMap, load_snapshot

__all__ = ["AlertOptions", "MemoryMap", "Monitor", "Run", "RunError", "__version__", "load_run", "load_snapshot", "show"]


def __getattr__(name: str) -> Any:
    if name == "Monitor":
        from gpudash.monitor import Monitor

        return Monitor
    if name == "AlertOptions":
        from gpudash.options import AlertOptions

        return AlertOptions
    if name in ("Run", "load_run"):
        from gpudash import store

        return getattr(store, name)
    if name in ("load_snapshot", "MemoryMap"):
        from gpudash.store import snapshot

        return getattr(snapshot, name)
    if name == "show":
        from gpudash.server.notebook import show

        return show
    raise AttributeError(f"module 'gpudash' has no attribute {name!r}")
