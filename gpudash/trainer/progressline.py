"""The trainer's progress line on stderr: the bar, loss, micro-batch, tok/s and ETA as every surface says them."""

from __future__ import annotations

import sys
import time
from collections import deque

from gpudash.analysis.progress import RECENT_STEPS, eta_text, progress
from gpudash.analysis.rates import RECENT_STEPS as RATE_STEPS
from gpudash.analysis.rates import fmt_rate, per_second
from gpudash.units import fmt_duration

__all__ = ["ProgressLine"]


class ProgressLine:
    """One self-overwriting stderr line, at most ~10 redraws a second. The ETA is the one the dashboard
    shows (:func:`gpudash.analysis.progress.progress` of the steps' end times, as the run records them)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.last = 0.0
        self.start = time.monotonic()
        self.ends: deque[tuple[int, float]] = deque(maxlen=RECENT_STEPS + 1)
        #: (end time, tokens) of the last steps: tok/s as every surface defines it (gpudash.analysis.rates)
        self.tokens: deque[tuple[float, float]] = deque(maxlen=RATE_STEPS + 1)

    def line(self, done: int, loss: float, micro: int, tok_s: float | None, now: float) -> str:
        """``[####....] step 3/10  loss 5.139  micro 2  296 tok/s  12.0 s elapsed, ETA 28 s``"""
        width = 24
        fill = int(width * done / self.total)
        elapsed = now - self.start
        p = progress(done, self.total, [s for s, _ in self.ends], [t for _, t in self.ends])
        eta = eta_text(p) if done < self.total else ""
        timing = f"{fmt_duration(elapsed)} elapsed" + (f", {eta}" if eta else "")
        return (f"[{'#' * fill}{'.' * (width - fill)}] step {done}/{self.total}  loss {loss:.3f}  "
                f"micro {micro}  {fmt_rate(tok_s)} tok/s  {timing} ")

    def update(self, done: int, loss: float, micro: int, tokens: float, end: float | None = None) -> None:
        """``tokens``: step ``done - 1``'s; ``end``: the wall time (``time.time()``) it ended, as the Monitor
        records it. The line's tok/s is :func:`gpudash.analysis.rates.per_second` of the last steps."""
        end = time.time() if end is None else end
        self.ends.append((done - 1, end))
        self.tokens.append((end, tokens))
        now = time.monotonic()
        if now - self.last < 0.1 and done < self.total:
            return
        self.last = now
        tok_s = per_second([n for _, n in self.tokens], [t for t, _ in self.tokens])
        sys.stderr.write("\r" + self.line(done, loss, micro, tok_s, now))
        sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")
        sys.stderr.flush()
