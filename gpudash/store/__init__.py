"""The run directory: writer (training side), reader and ``load_run`` (dashboard side).

Imports only the standard library, numpy and pandas, so a run copied from a
cluster opens on a laptop without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudash.store.reader import RunReader
    from gpudash.store.run import Run, load_run
    from gpudash.store.writer import Recorder

__all__ = ["Recorder", "Run", "RunReader", "load_run"]
_WHERE = {"Recorder": "writer", "Run": "run", "RunReader": "reader", "load_run": "run"}


def __getattr__(name: str) -> Any:
    # imported when first used: a command that only writes (gpudash import-snapshot) does not pay for pandas
    if name in _WHERE:
        return getattr(importlib.import_module(f"gpudash.store.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'gpudash.store' has no attribute {name!r}")
