"""The run directory: writer (training side), reader and ``load_run`` (dashboard side).

Imports only the standard library, numpy and pandas, so a run copied from a
cluster opens on a laptop without torch.
"""

from gpudash.store.reader import RunError, RunReader
from gpudash.store.run import Run, load_run
from gpudash.store.writer import Recorder

__all__ = ["Recorder", "Run", "RunError", "RunReader", "load_run"]
