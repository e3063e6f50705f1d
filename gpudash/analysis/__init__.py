"""Post-mortem analysis: pure functions of a loaded :class:`gpudash.Run`
(no torch, no dash). ``run_facts(run)`` derives the facts every surface shows;
``summarize(run)`` returns every :class:`Verdict`.

The names below load their modules on first use: the training process imports
``gpudash.analysis.leak`` (the leak watch) and must not pay for the rest."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudash.analysis.facts import Facts, run_facts
    from gpudash.analysis.summary import summarize
    from gpudash.analysis.verdict import Verdict

__all__ = ["Facts", "Verdict", "run_facts", "summarize"]


def __getattr__(name: str) -> Any:
    if name in ("Facts", "run_facts"):
        from gpudash.analysis import facts

        return getattr(facts, name)
    if name == "summarize":
        from gpudash.analysis.summary import summarize

        return summarize
    if name == "Verdict":
        from gpudash.analysis.verdict import Verdict

        return Verdict
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
