"""What both framework callbacks share: a Monitor step opened and closed from
callback events instead of ``with`` blocks, one phase open at a time."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from gpudash.monitor import Monitor

__all__ = ["StepDriver", "batch_size_and_tokens", "jsonable"]


def jsonable(d: dict[str, Any]) -> dict[str, Any]:
    """Plain values only, so a framework's config always fits in run meta."""
    return {k: v if isinstance(v, (bool, int, float, str, type(None))) else str(v) for k, v in d.items()}


def batch_size_and_tokens(batch: Any) -> tuple[int | None, int | None]:
    """(samples, tokens) of a batch without touching its data (shapes only: no GPU sync).

    Tokens are counted for ``input_ids`` (dict batches) or a 2-D integer tensor,
    padding included, as ``Trainer``'s ``num_input_tokens_seen`` does by default."""
    ids = None
    if isinstance(batch, dict):
        ids = batch.get("input_ids")
        first = ids if ids is not None else next((v for v in batch.values() if hasattr(v, "shape")), None)
    elif isinstance(batch, (list, tuple)):
        first = next((v for v in batch if hasattr(v, "shape")), None)
    else:
        first = batch
    shape = getattr(first, "shape", None)
    if not shape:
        return None, None
    samples = int(shape[0])
    if ids is None and first is not None and len(shape) == 2 and not getattr(first, "is_floating_point", lambda: True)():
        ids = first
    tokens = int(ids.numel()) if ids is not None and hasattr(ids, "numel") else None
    return samples, tokens


class StepDriver:
    """Opens a :class:`Monitor` (or wraps the one given) and drives its steps and
    phases from framework events. Every method is cheap and never raises into
    the training loop's caller for a missing step: events that arrive outside
    a step (evaluation, sanity checks) are ignored."""

    def __init__(self, run_dir: str | os.PathLike[str] | Monitor | None, monitor_kwargs: dict[str, Any]) -> None:
        self.monitor: Monitor | None = run_dir if isinstance(run_dir, Monitor) else None
        self.run_dir = None if isinstance(run_dir, Monitor) or run_dir is None else Path(run_dir)
        self.monitor_kwargs = monitor_kwargs
        self.owned = False
        self._step: Any = None
        self._phase: Any = None
        self._losses: list[Any] = []
        self.samples = 0
        self.tokens = 0
        self.ahead = False

    def open(self, default_dir: Path, rank: int, world_size: int, config: dict[str, Any]) -> Monitor:
        """The Monitor to record into: the user's, or a new one (a new one again after a close)."""
        if self.monitor is None or (self.owned and self.monitor.closed):
            kwargs = dict(self.monitor_kwargs)
            if world_size > 1:
                # the framework's view wins; a single-process framework under a launcher
                # (torchrun with a setup it did not join) keeps the launcher's RANK
                kwargs.setdefault("rank", rank)
                kwargs.setdefault("world_size", world_size)
            kwargs.setdefault("config", config)
            self.monitor = Monitor(self.run_dir or default_dir, **kwargs)
            self.owned = True
        return self.monitor

    @property
    def in_step(self) -> bool:
        return self._step is not None

    def open_ahead(self) -> None:
        """Open the next step now, in a ``data`` phase: frameworks fetch the next batch
        before they announce the step, and a data-bound run should show it."""
        if self._step is None:
            self.begin_step()
            self.phase("data")
            self.ahead = self._step is not None

    def drop_ahead(self) -> None:
        """No step follows after all (end of epoch or training, evaluation next)."""
        if self.ahead:
            self.abandon()

    def begin_step(self) -> None:
        if self.ahead:
            self.ahead = False
            self.phase(None)  # the data phase ends: the step itself begins
            return
        if self._step is not None:
            self.end_step()
        if self.monitor is None or self.monitor.closed:
            return
        self._losses = []
        self.samples = self.tokens = 0
        self._step = self.monitor.step()
        self._step.__enter__()

    def phase(self, name: str | None) -> None:
        """Close the open phase and open ``name`` (None: just close)."""
        if self._phase is not None:
            self._phase.__exit__(None, None, None)
            self._phase = None
        if name is not None and self._step is not None and self.monitor is not None:
            self._phase = self.monitor.phase(name)
            self._phase.__enter__()

    @property
    def phase_name(self) -> str | None:
        return None if self._phase is None else str(self._phase.name)

    def add_batch(self, batch: Any) -> None:
        samples, tokens = batch_size_and_tokens(batch)
        self.samples += samples or 0
        self.tokens += tokens or 0

    def add_loss(self, loss: Any) -> None:
        detach = getattr(loss, "detach", None)
        if detach is not None and getattr(loss, "numel", lambda: 0)() == 1:
            self._losses.append(detach())

    @property
    def has_loss(self) -> bool:
        return bool(self._losses)

    def log_loss(self, reduce: str = "mean", scale: float = 1.0) -> None:
        """Log this step's loss from its micro-batches: their ``mean`` or their ``sum``
        (for losses already divided by the whole step's token count). Stays a tensor:
        no GPU sync here, the writer thread reads it."""
        losses, self._losses = self._losses, []
        if not losses:
            return
        loss = losses[0] if len(losses) == 1 else sum(losses[1:], losses[0])
        if reduce == "mean" and len(losses) > 1:
            loss = loss / len(losses)
        self.log(loss=loss * scale if scale != 1.0 else loss)

    def log(self, **scalars: Any) -> None:
        if self.monitor is not None and not self.monitor.closed:
            self.monitor.log(**{k: v for k, v in scalars.items() if v is not None})

    def evaluation(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Record one evaluation's results as an ``evaluation`` event (scalars only; one-element
        tensors are read, which is fine here: evaluation already waited for the device).

        The event's step is the Monitor's step index, i.e. the number of optimizer steps done:
        the framework's global step, where W&B and TensorBoard plot it. An event, not a column of
        a step's row: evaluation runs between steps, and the one after the last step has no
        row to land in. ``step`` overrides that number (steps counted some other way)."""
        m = self.monitor
        if m is None or m.closed:
            return
        values: dict[str, float] = {}
        for k, v in metrics.items():
            if isinstance(v, bool):
                continue
            if isinstance(v, (int, float)):
                values[str(k)] = float(v)
            elif getattr(v, "numel", lambda: 0)() == 1:
                values[str(k)] = float(v.detach().float().item())
        if values:
            shown = ", ".join(f"{k} {v:.4g}" for k, v in values.items())
            at = m.step_index if step is None else step
            m.recorder.put("events", {"time": time.time(), "step": at, "kind": "evaluation",
                                      "message": f"evaluation after {at} steps: {shown}", "data": {"metrics": values}})

    def end_step(self) -> None:
        self.ahead = False
        step, self._step = self._step, None
        if step is None:
            return
        self.phase(None)
        self.log_loss()
        step.samples = self.samples or None
        step.tokens = self.tokens or None
        step.__exit__(None, None, None)

    def abandon(self) -> None:
        """Drop a step a crash left open (e.g. an exception in a previous ``fit``):
        the Monitor counts it as failed and records no row for it."""
        step, self._step = self._step, None
        self._phase = None
        self._losses = []
        self.ahead = False
        if step is not None:
            step.__exit__(RuntimeError, RuntimeError("step abandoned"), None)

    def close(self, status: str = "finished", reason: str = "closed") -> None:
        if self.ahead or status != "finished":
            self.abandon()
        self.end_step()
        if self.owned and self.monitor is not None:
            self.monitor.close(status, reason)
