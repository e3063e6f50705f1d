"""Imports a starting server does not need yet: ``gpudash serve`` answers its first page before pandas is
loaded, then loads it while the browser fetches its scripts.

    defer("pandas")     # `import pandas as pd` now binds a stand-in; the first `pd.X` imports pandas
    without("IPython")  # `import IPython` fails (dash's Jupyter support, which a CLI server never uses)
    finish("pandas")    # import it now (from a background thread), so that no request waits for it

Only for a process that gpudash starts itself (the ``serve`` command): a library must not change what
``import`` means in its user's process.
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from typing import Any

__all__ = ["Deferred", "defer", "finish", "without"]

_LOCK = threading.RLock()


class Deferred(types.ModuleType):
    """Stands in ``sys.modules`` for a module not imported yet. The first attribute read that the stand-in
    does not have imports the real module, copies its namespace into the stand-in (every module that
    already did ``import name`` holds the stand-in, and reads the real objects from then on) and puts the
    real module back in ``sys.modules``."""

    def __getattr__(self, attr: str) -> Any:
        return getattr(_load(self), attr)


def _load(stand_in: Deferred) -> types.ModuleType:
    name = stand_in.__name__
    with _LOCK:
        real = sys.modules.get(name)
        if real is stand_in or real is None:
            sys.modules.pop(name, None)
            real = importlib.import_module(name)
            vars(stand_in).update({k: v for k, v in vars(real).items() if k != "__getattr__"})
            stand_in.__class__ = _Loaded  # type: ignore[assignment]  # misses: names the real module makes lazily
    return real


class _Loaded(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        return getattr(sys.modules[self.__name__], attr)


def defer(name: str) -> None:
    """``import name`` binds a :class:`Deferred` until something reads from it; no-op once imported."""
    with _LOCK:
        if name not in sys.modules:
            sys.modules[name] = Deferred(name)


def finish(name: str) -> None:
    """Import a deferred module now (a no-op when it is already imported)."""
    module = sys.modules.get(name)
    if isinstance(module, Deferred):
        _load(module)
    else:
        importlib.import_module(name)


def without(name: str) -> None:
    """``import name`` raises ImportError in this process (as if not installed); no-op once imported."""
    sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None in sys.modules: ImportError
