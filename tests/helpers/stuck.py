"""A writer that cannot write for now (a stalled disk), for tests of what a full queue does: while it is stuck the
queue only fills (lending it the GIL does not help it: ``gpudash.store.lending.Lender``)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def stuck_writer(recorder: Any) -> Iterator[None]:
    """Hold ``recorder``'s writer before its next flush until the block ends."""
    stuck = threading.Event()
    flush_once = recorder._flush_once

    def held(**kw: Any) -> None:
        stuck.wait()
        flush_once(**kw)

    recorder._flush_once = held
    try:
        yield
    finally:
        stuck.set()
