"""``gpudash run`` on a script that resumed from its checkpoint: its steps continue where the script did.

When the Monitor opens (the script's first forward, backward or optimizer step) the script has loaded
whatever it resumes from. The optimizers it made say how far it got: Adam, AdamW, RMSprop, Adagrad (and
most others but plain SGD) keep a ``step`` count per parameter, which ``load_state_dict`` restores; the
next step is that number. Only read here, once, never changed (nothing of ours rides on the optimizer).
Where no optimizer says, the Monitor continues after the last recorded step and says so in its ``resume``
event (:mod:`gpudash.monitor.resume`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["optimizer_steps", "resume_from_optimizers"]


def optimizer_steps(optimizer: Any) -> int | None:
    """The ``step`` count an optimizer's state holds (that of its first parameter with one), or None."""
    try:
        states = list(getattr(optimizer, "state", {}).values())
    except Exception:  # noqa: BLE001 - someone else's object: anything may fail
        return None
    for st in states:
        value = st.get("step") if isinstance(st, dict) else None
        if value is None:
            continue
        try:
            n = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            continue
        if n == n and 0 <= n < 2**62:
            return int(n)
    return None


def resume_from_optimizers(monitor: Any, optimizers: Iterable[Any]) -> None:
    """Number the next step after the optimizer steps the script's loaded optimizer state counts."""
    found = [(n, type(o).__name__) for o in list(optimizers) if (n := optimizer_steps(o))]
    if not found:
        return
    n, name = max(found)
    try:
        monitor.resume_at(n, f"from the optimizer state the script loaded ({name} step {n})")
    except Exception:  # noqa: BLE001 - never break the script's start
        pass
