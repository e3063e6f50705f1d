"""What a collector may call: the recording interface the Monitor implements.

Collectors (and the trainer helpers that record on a Monitor's behalf, such
as :func:`gpudash.collectors.oom.record_oom`) are written against
:class:`Recording`, never against :class:`gpudash.monitor.Monitor`, so imports
point one way only: ``monitor`` -> ``collectors`` -> ``collectors.api``.
``tests/test_layers.py`` checks that no gpudash module imports one that
(directly or not) imports it back.

Rules for collectors: the step and phase hooks run on the training thread and
must be cheap (no I/O, no GPU sync); nothing a collector does may raise into
the training loop (a hook that raises is removed and the source recorded as
unavailable).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

__all__ = ["Collector", "PhaseEndHook", "PhaseStartHook", "Recording", "StepDueHook", "StepEndHook",
           "StepStartHook"]

StepStartHook = Callable[[int], None]
"""Called with the step index as a step begins."""
StepEndHook = Callable[[int, dict[str, Any]], "bool | None"]
"""Called with the step index and its row as a step ends (``row["failed"]`` is 1 for a failed step).
End hooks read the row, never change it. One that returns True holds the row and hands it to
:meth:`Recording.put_step` itself later (the CUDA timer, once the step's GPU times are known);
otherwise the Monitor writes it when the hooks are done."""
StepDueHook = Callable[[int, dict[str, Any]], int]
"""An end hook for some steps only (a sampler): called with the step index and its row at the end of the first
successful step at or after the step it last asked for, it returns the next step it wants. Steps before that pay
one comparison, not a call. Reads the row, never changes it."""
PhaseStartHook = Callable[[str], None]
"""Called with the phase name as ``monitor.phase(name)`` opens."""
PhaseEndHook = Callable[[str], None]
"""Called with the phase name as ``monitor.phase(name)`` exits."""


class Recording(Protocol):
    """The part of the Monitor a collector sees."""

    @property
    def run_dir(self) -> Path: ...

    @property
    def world_size(self) -> int: ...

    @property
    def step_index(self) -> int:
        """The step being recorded (the next one, between steps)."""
        ...

    @property
    def current_phase(self) -> str | None:
        """The innermost open ``monitor.phase(...)``, or None."""
        ...

    def put(self, table: str, row: dict[str, Any]) -> None:
        """Queue one record for ``table`` (never blocks). Not for ``steps``: see :meth:`put_step`."""
        ...

    def put_step(self, row: dict[str, Any]) -> None:
        """Write one finished step's row: the only way a row reaches the ``steps`` table."""
        ...

    def memory_row(self, step: int, values: dict[str, Any]) -> None:
        """Add byte counts to the memory record of ``step`` (written as the step ends)."""
        ...

    def set_meta(self, **items: Any) -> None: ...

    def event(self, kind: str, message: str, **data: Any) -> None: ...

    def unavailable(self, source: str, reason: str) -> None:
        """Record once that ``source`` records nothing here, and why."""
        ...

    def collector_failed(self, where: Any, exc: BaseException) -> None:
        """Record that a hook failed and remove it."""
        ...

    def add_step_hooks(self, start: StepStartHook | None = None, end: StepEndHook | None = None,
                       phase_end: PhaseEndHook | None = None, phase_start: PhaseStartHook | None = None,
                       end_due: StepDueHook | None = None) -> None:
        """Register training-thread hooks (see the hook types above)."""
        ...


class Collector(Protocol):
    """A source of records. ``start``/``stop`` run once; ``start`` registers hooks or
    starts a thread, and records ``unavailable`` where its hardware is absent. ``stop`` writes
    whatever the collector still holds. A collector that holds records between steps (the CUDA
    timer's rows) also has ``drain()``: ``Monitor.flush`` calls it before flushing the writer."""

    name: str

    def start(self, monitor: Recording) -> None: ...

    def stop(self) -> None: ...
