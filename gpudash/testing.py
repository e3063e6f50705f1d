"""A toy training loop for tests, benchmarks and scripts: a small MLP trained under a Monitor.

    loop = ToyLoop((32, 64, 4), lr=1e-2, batch=16, tokens_per_sample=8)
    with Monitor(run_dir) as mon:
        mon.watch(loop.model, loop.opt)
        for _ in range(20):
            with loop.step(mon) as s:       # data, forward, backward, optimizer phases
                mon.log(loss=s.loss)        # still inside the step
    loop.bare_step()                        # the same work without a Monitor

Subclasses change one part of a step by overriding :meth:`ToyLoop.batch`,
:meth:`~ToyLoop.forward`, :meth:`~ToyLoop.backward` or :meth:`~ToyLoop.optimize`.
torch is imported when a loop is built, never at import time, so importing
this module costs nothing on the dashboard side.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudash.monitor import Monitor

__all__ = ["ToyLoop", "ToyStep", "mlp"]


def mlp(widths: Sequence[int], activation: str | None = "relu", device: Any = None) -> Any:
    """``torch.nn.Sequential`` of Linear layers ``widths[0] -> ... -> widths[-1]`` with
    ``activation`` ("relu", "gelu" or None) between them."""
    import torch

    if len(widths) < 2:
        raise ValueError("mlp needs at least an input and an output width")
    act = {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, None: None}[activation]
    layers: list[Any] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        if i and act is not None:
            layers.append(act())
        layers.append(torch.nn.Linear(a, b))
    model = torch.nn.Sequential(*layers)
    return model.to(device) if device is not None else model


class ToyLoop:
    """A small MLP, its AdamW optimizer and the batches it trains on.

    ``labels``: "argmax" (the class is the argmax of the first ``widths[-1]`` inputs:
    learnable; cross-entropy loss), "random" (random classes; cross-entropy) or None
    (no labels; the loss is the mean square of the output). ``fixed_batch``: one
    batch made here and reused (steps then have no ``data`` phase); otherwise each
    step makes its batch in a ``data`` phase. Batches are made on ``device``, or on
    the host in pinned memory and copied (non-blocking) when ``pin_memory``.
    ``clip_grad_norm``: clip before the optimizer step; the norm is ``ToyStep.grad_norm``.
    """

    def __init__(self, widths: Sequence[int] = (32, 64, 4), *, activation: str | None = "relu",
                 lr: float = 1e-3, batch: int = 16, tokens_per_sample: int | None = None,
                 labels: str | None = "argmax", fixed_batch: bool = False, clip_grad_norm: float | None = None,
                 pin_memory: bool = False, device: str = "cpu", seed: int | None = 0) -> None:
        import torch

        if labels not in ("argmax", "random", None):
            raise ValueError(f"labels={labels!r}: use 'argmax', 'random' or None")
        self.torch = torch
        if seed is not None:
            torch.manual_seed(seed)
        self.widths = tuple(widths)
        self.batch_size = batch
        self.tokens_per_sample = tokens_per_sample
        self.labels = labels
        self.clip_grad_norm = clip_grad_norm
        self.pin_memory = pin_memory
        self.device = device
        self.model = mlp(self.widths, activation, device if device != "cpu" else None)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.fixed: tuple[Any, Any] | None = None
        if fixed_batch:
            self.fixed = self.make_batch()
        self.step_index = 0

    # ---- the parts of a step (override one to change it) ----------------------------------
    def make_batch(self) -> tuple[Any, Any]:
        torch = self.torch
        n, width, classes = self.batch_size, self.widths[0], self.widths[-1]
        if self.pin_memory:
            x = torch.randn(n, width).pin_memory().to(self.device, non_blocking=True)
        elif self.device != "cpu":
            x = torch.randn(n, width, device=self.device)
        else:
            x = torch.randn(n, width)
        if self.labels == "argmax":
            y = x[:, :classes].argmax(1)
        elif self.labels == "random":
            y = torch.randint(0, classes, (n,), device=x.device)
        else:
            y = None
        return x, y

    def batch(self, step: int) -> tuple[Any, Any]:
        """The inputs and labels of step ``step``."""
        return self.fixed if self.fixed is not None else self.make_batch()

    def forward(self, x: Any, y: Any) -> Any:
        out = self.model(x)
        if y is None:
            return out.square().mean()
        return self.torch.nn.functional.cross_entropy(out, y)

    def backward(self, loss: Any, step: int) -> None:
        loss.backward()

    def optimize(self, step: int) -> Any:
        """Clip (if asked), step and zero the gradients; returns the gradient norm or None."""
        norm = None
        if self.clip_grad_norm is not None:
            norm = self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_grad_norm)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return norm

    # ---- whole steps ---------------------------------------------------------------------
    def bare_step(self) -> Any:
        """One step of the same work without a Monitor; returns the loss."""
        step = self.step_index
        x, y = self.batch(step)
        loss = self.forward(x, y)
        self.backward(loss, step)
        self.optimize(step)
        self.step_index = step + 1
        return loss

    def step(self, mon: Monitor) -> ToyStep:
        """``with loop.step(mon) as s:`` runs one step's phases inside ``mon.step``; the body
        (logging, extra phases, events) still belongs to the step."""
        return ToyStep(self, mon)

    def train(self, mon: Monitor, steps: int, **scalars: Any) -> None:
        """``steps`` steps under ``mon``, each logging ``loss`` and ``scalars``."""
        for _ in range(steps):
            with self.step(mon) as s:
                mon.log(loss=s.loss, **scalars)


class ToyStep:
    """One step of a :class:`ToyLoop` under a Monitor; ``loss`` and ``grad_norm`` once entered."""

    __slots__ = ("loop", "mon", "index", "loss", "grad_norm", "_ctx")

    def __init__(self, loop: ToyLoop, mon: Monitor) -> None:
        self.loop = loop
        self.mon = mon
        self.index = loop.step_index
        self.loss: Any = None
        self.grad_norm: Any = None
        self._ctx: Any = None

    def __enter__(self) -> ToyStep:
        loop, mon, step = self.loop, self.mon, self.index
        tokens = loop.batch_size * loop.tokens_per_sample if loop.tokens_per_sample else None
        ctx = self._ctx = mon.step(samples=loop.batch_size, tokens=tokens)
        ctx.__enter__()
        try:
            if loop.fixed is None:
                with mon.phase("data"):
                    x, y = loop.batch(step)
            else:
                x, y = loop.fixed
            with mon.phase("forward"):
                self.loss = loop.forward(x, y)
            with mon.phase("backward"):
                loop.backward(self.loss, step)
            with mon.phase("optimizer"):
                self.grad_norm = loop.optimize(step)
        except BaseException:
            loop.step_index = step + 1
            ctx.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.loop.step_index = self.index + 1
        self._ctx.__exit__(et, ev, tb)
