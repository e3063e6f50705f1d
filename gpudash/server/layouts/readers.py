"""Open readers by run id for the dashboard's callbacks (a module of its own: the callback modules of
each view import it without importing :mod:`gpudash.server.layouts.callbacks`)."""

from __future__ import annotations

import threading
from pathlib import Path

from dash.exceptions import PreventUpdate
from gpudash.errors import RunError
from gpudash.server.runcache import RunCache, shared_cache
from gpudash.store.reader import RunReader
from gpudash.store.runid import InvalidRunId, resolve_run_dir

__all__ = ["ReaderCache"]


class ReaderCache:
    """Open readers by run id: run ids resolved inside the runs folder, readers held by the one
    run cache (:func:`gpudash.server.runcache.shared_cache`), one lock each."""

    def __init__(self, runs_dir: Path, cache: RunCache | None = None) -> None:
        self.runs_dir = runs_dir
        self.cache = cache or shared_cache()

    def get(self, run_id: str) -> tuple[RunReader, threading.Lock]:
        return self.cache.reader(resolve_run_dir(self.runs_dir, run_id))

    def get_or_skip(self, run_id: str) -> tuple[RunReader, threading.Lock]:
        """:meth:`get` for a callback: a run that is gone (or never was) leaves the page as it is."""
        try:
            return self.get(run_id)
        except (InvalidRunId, RunError):
            raise PreventUpdate from None
