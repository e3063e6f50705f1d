"""Record a PyTorch Lightning run with gpudash::

    from gpudash.integrations.lightning import GpudashCallback
    trainer = L.Trainer(..., callbacks=[GpudashCallback("runs/x")])

Each optimizer step is one Monitor step (with ``accumulate_grad_batches`` it
spans its micro-batches), numbered as Lightning numbers it: the row of the step
that makes ``trainer.global_step`` *n* is step *n* (from 1), when the callback
opened the Monitor (a Monitor you pass keeps its own count). Phases: ``data`` (fetching the next batch, and
whatever else Lightning runs between two batches, such as a ``ModelCheckpoint``
save; validation is left out of every step), ``forward`` (``training_step``,
from batch start to the loss), ``backward``, ``optimizer`` (gradient clipping
and ``optimizer.step()``). Per step: samples and tokens (batch shapes), loss (mean
of ``training_step``'s losses), lr, and the gradient norm before clipping
(one fused norm over the gradients per step; ``grad_norm=False`` skips it).
Each validation during ``fit`` (the one after the last step too) is an
``evaluation`` event carrying what ``validation_step`` logged (``val_loss``, ...)
at the global step it ran after.
Memory by category comes from ``Monitor.watch``. Every rank records its own
file in the same run folder.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from gpudash.integrations._step import StepDriver, jsonable
from gpudash.monitor import Monitor

__all__ = ["GpudashCallback", "total_grad_norm"]


def total_grad_norm(parameters: Any) -> torch.Tensor | None:
    """The 2-norm of all gradients as a 0-d tensor (no GPU sync), None without gradients."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return None
    with torch.no_grad():
        norms = torch._foreach_norm(grads)
        return torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))


def _loss_of(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs if isinstance(outputs, torch.Tensor) else None


def _total_steps(trainer: Any) -> int | None:
    """Optimizer steps this fit has left: ``estimated_stepping_batches`` (max_steps, or epochs times batches
    over accumulation) less those a resumed fit already took; None when Lightning cannot tell (an endless fit,
    a dataloader without a length)."""
    try:
        est = float(trainer.estimated_stepping_batches)
    except Exception:  # noqa: BLE001 - Lightning raises when it cannot size the fit
        return None
    if not math.isfinite(est):
        return None
    left = int(est) - int(trainer.global_step or 0)
    return left if left > 0 else None


class GpudashCallback(Callback):  # type: ignore[misc]
    """A Lightning ``Callback`` that records the run into ``run_dir``.

    ``run_dir`` is a folder (default: ``<default_root_dir>/gpudash``) or a
    :class:`gpudash.Monitor` you opened yourself (then you close it).
    ``watch=False`` skips memory by category; ``grad_norm=False`` skips the
    gradient norm. Other keywords go to :class:`gpudash.Monitor`."""

    def __init__(self, run_dir: str | os.PathLike[str] | Monitor | None = None, *, watch: bool = True,
                 grad_norm: bool = True, **monitor_kwargs: Any) -> None:
        self._driver = StepDriver(run_dir, monitor_kwargs)
        self._watch = watch
        self._grad_norm = grad_norm
        self._global_step = 0
        self._in_epoch = False
        self._metrics_before: dict[str, Any] = {}

    @property
    def monitor(self) -> Monitor | None:
        """The Monitor recording this run (None before training starts)."""
        return self._driver.monitor

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        config: dict[str, Any] = {
            "framework": "lightning",
            "world_size": trainer.world_size,
            "model": type(pl_module).__name__,
            "parameters": sum(p.numel() for p in pl_module.parameters()),
            "strategy": type(trainer.strategy).__name__,
            **jsonable({"precision": trainer.precision, "accumulate_grad_batches": trainer.accumulate_grad_batches,
                        "max_steps": trainer.max_steps, "max_epochs": trainer.max_epochs,
                        "gradient_clip_val": trainer.gradient_clip_val}),
        }
        self._driver.abandon()  # a previous fit that raised left a step open
        m = self._driver.open(Path(trainer.default_root_dir) / "gpudash", trainer.global_rank, trainer.world_size,
                              config)
        if not self._driver.owned:
            m.set_meta(lightning_config=config)
        total = _total_steps(trainer)
        if total is not None and (self._driver.owned or m.total_steps is None):
            m.set_total_steps(total)
        if self._driver.owned and m.step_index == 0:
            m.set_meta(first_step=int(trainer.global_step) + 1)  # Lightning's numbering (1, or resumed)
        if self._driver.owned:
            m.resume_at(int(trainer.global_step) + 1, f"Lightning's trainer.global_step ({int(trainer.global_step)})")
        if self._watch:
            m.watch(pl_module, trainer.optimizers[0] if trainer.optimizers else None)
        self._global_step = trainer.global_step

    def _number(self, trainer: Any) -> None:
        """The next step is the one that makes ``global_step`` one more (our own Monitor only)."""
        d = self._driver
        if d.owned and d.monitor is not None and not d.in_step:
            d.monitor.step_index = int(trainer.global_step) + 1

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._in_epoch = True
        self._number(trainer)
        self._driver.open_ahead()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._in_epoch = False
        self._driver.drop_ahead()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._driver.drop_ahead()
        self._metrics_before = {} if trainer.sanity_checking else dict(trainer.callback_metrics)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        # what this validation logged: the metrics it added or replaced (training's stay as they were)
        before = self._metrics_before
        self._driver.evaluation({k: v for k, v in trainer.callback_metrics.items() if before.get(k) is not v},
                                step=int(trainer.global_step) if self._driver.owned else None)
        if self._in_epoch:
            self._number(trainer)
            self._driver.open_ahead()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        d = self._driver
        if d.ahead or not d.in_step:
            self._number(trainer)
            d.begin_step()
        d.add_batch(batch)
        d.phase("forward")

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._driver.phase("backward")

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        self._driver.phase(None)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        d = self._driver
        if not d.in_step:
            return
        d.phase(None)
        if self._grad_norm:
            d.log(grad_norm=total_grad_norm(pl_module.parameters()))  # before clipping, AMP-unscaled
        if optimizer.param_groups:
            d.log(lr=optimizer.param_groups[0].get("lr"))
        d.phase("optimizer")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        d = self._driver
        d.phase(None)
        loss = _loss_of(outputs)
        if loss is not None:
            d.add_loss(loss)
        if trainer.global_step != self._global_step:  # the optimizer stepped: this step is complete
            self._global_step = trainer.global_step
            # automatic optimization hands over each loss divided by accumulate_grad_batches
            scale = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
            d.log_loss("mean", float(scale))
            d.end_step()
            self._number(trainer)
            d.open_ahead()
        else:
            d.phase("data")  # accumulating: the next micro-batch is fetched inside this step

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._in_epoch = False
        self._driver.close("finished", "trainer finished")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._driver.close("crashed", f"exception: {type(exception).__name__}: {exception}")
