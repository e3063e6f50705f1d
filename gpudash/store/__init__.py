"""The run directory: writer (training side), reader and ``load_run`` (dashboard side).

Imports only the standard library, numpy and pandas, so a run copied from a
cluster opens on a laptop without torch.
"""

from gpudash.store.reader import RunReader
from gpudash.store.run import Run, load_run
from gpudash.store.writer import Recorder

__all__ = ["Recorder", "Run", "RunReader", "load_run"]
