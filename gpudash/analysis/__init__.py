"""Post-mortem analysis: pure functions of a loaded :class:`gpudash.Run`
(no torch, no dash). ``summarize(run)`` returns every :class:`Verdict`."""

from __future__ import annotations

from gpudash.analysis.summary import summarize
from gpudash.analysis.verdict import Verdict

__all__ = ["Verdict", "summarize"]
