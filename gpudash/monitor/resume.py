"""A Monitor that opens a run some earlier process already recorded: a new attempt, and its ``resume`` event.

The writer finds the earlier attempt (:mod:`gpudash.store.attempts`); here the Monitor decides where its
steps continue and says so once, as the attempt's first record: ``resume`` (attempt, the step it resumed
at, the gap since the previous attempt ended, how that one ended, and what told the step). The step is,
in order: what the caller said (``monitor.step(step=k)``, :meth:`ResumeNote.at`, called by the HF and
Lightning callbacks with their ``global_step`` and by ``gpudash run`` with the step count of the
optimizer state the script loaded), else with ``resume=True`` the step after the last one recorded
(said so in the event), else 0 (the caller numbers its own steps).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gpudash.units import fmt_gap

if TYPE_CHECKING:
    from gpudash.store.attempts import Previous

__all__ = ["NO_RESUME", "NoResume", "ResumeNote"]

#: How the step was found when nothing told it.
AFTER_LAST = "continued after the last recorded step (nothing told where the script resumed)"
FROM_ZERO = "numbered from 0 (pass resume=True to continue after the last recorded step)"


class ResumeNote:
    """Where a new attempt's steps continue, and the one ``resume`` event that says so."""

    def __init__(self, previous: Previous, attempt: int, started_at: float, resume: bool) -> None:
        self.previous = previous
        self.attempt = attempt
        self.started_at = started_at
        last = previous.last_step
        self.step = last + 1 if resume and last is not None else 0
        self.source = AFTER_LAST if resume and last is not None else FROM_ZERO
        self.told = False
        self.done = False

    def at(self, step: int, source: str) -> None:
        """The script resumed at ``step`` (``source``: what says so); ignored once the event is written."""
        if not self.done:
            self.step, self.source, self.told = int(step), source, True

    def event(self, step: int | None) -> tuple[str, dict[str, Any]]:
        """The ``resume`` event's message and data (``step``: where the first step of this attempt is)."""
        self.done = True
        prev = self.previous
        gap = self.started_at - prev.ended_at if prev.ended_at else None
        at = self.step if step is None else step
        last = f" at step {prev.last_step}" if prev.last_step is not None else ""
        msg = (f"attempt {self.attempt} resumed at step {at} after {fmt_gap(gap)} (attempt {prev.attempt} "
               f"{prev.end}{last}{': ' + prev.reason if prev.reason and prev.end != 'finished' else ''}); "
               f"steps {self.source}")
        data = {"attempt": self.attempt, "step": at, "gap_s": gap, "previous_attempt": prev.attempt,
                "previous_end": prev.end, "previous_reason": prev.reason, "previous_last_step": prev.last_step,
                "step_from": self.source, "started_at": self.started_at, "at": time.time()}
        return msg, data


class NoResume:
    """The first attempt's note: nothing to announce, and a step number told to it is the Monitor's alone."""

    done = True
    step = 0

    def at(self, step: int, source: str) -> None:
        pass


#: The note of a run's first attempt (a do-nothing :class:`ResumeNote`).
NO_RESUME = NoResume()
