"""Post-mortem analysis: pure functions of a loaded :class:`gpudash.Run`
(no torch, no dash). ``run_facts(run)`` derives the facts every surface shows;
``summarize(run)`` returns every :class:`Verdict`."""

from __future__ import annotations

from gpudash.analysis.facts import Facts, run_facts
from gpudash.analysis.summary import summarize
from gpudash.analysis.verdict import Verdict

__all__ = ["Facts", "Verdict", "run_facts", "summarize"]
