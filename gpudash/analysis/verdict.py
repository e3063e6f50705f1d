"""The unit of every answer the analysis gives: a :class:`Verdict`.

Each analysis module turns a loaded run into verdicts; ``summarize`` collects
them, the report and the dashboard's summary panel render them. Numbers the
recommendations and the cost model need travel in ``numbers``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from gpudash.units import fmt_duration

__all__ = ["SEVERITY_ORDER", "Severity", "Verdict", "fmt_pct", "fmt_s", "num"]

Severity = Literal["ok", "warn", "bad"]
SEVERITY_ORDER: dict[str, int] = {"bad": 0, "warn": 1, "ok": 2}


@dataclass
class Verdict:
    """One finding about a run, with the numbers behind it."""

    kind: str
    """Machine-readable kind: ``oom``, ``input-bound``, ``loss-spike``, ``cost``..."""
    title: str
    """One line a person reads first."""
    severity: Severity
    evidence: list[str] = field(default_factory=list)
    """Sentences with this run's numbers that justify the verdict."""
    recommendation: str | None = None
    saving: str | None = None
    """What following the recommendation is predicted to save, when that can be said."""
    steps: tuple[int, int] | None = None
    """First and last step the verdict is about (inclusive)."""
    rank: int | None = None
    numbers: dict[str, float] = field(default_factory=dict)
    """Raw numbers (bytes, seconds, fractions) for the recommendations and the cost model."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "title": self.title, "severity": self.severity, "evidence": list(self.evidence),
            "recommendation": self.recommendation, "saving": self.saving,
            "steps": list(self.steps) if self.steps is not None else None, "rank": self.rank,
            "numbers": dict(self.numbers),
        }

    @property
    def step_range(self) -> str:
        if self.steps is None:
            return ""
        a, b = self.steps
        return f"step {a}" if a == b else f"steps {a}–{b}"


def num(value: Any) -> float | None:
    """A finite float, or None for missing/NaN/non-numeric values."""
    if value is None or isinstance(value, bool):
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def fmt_s(seconds: float | None) -> str:
    return fmt_duration(seconds, missing="?")


def fmt_pct(fraction: float | None) -> str:
    return "?" if fraction is None else f"{100 * fraction:.0f} %"
