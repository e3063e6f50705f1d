"""Adaptive micro-batch size with OOM recovery, and the CPU stand-ins for an OOM.

The controller starts at the largest micro-batch the estimator predicts under
:data:`GROW_BELOW` of capacity, grows it x1.2 every ``grow_every`` good steps
while the measured peak stays under that share and the grown batch is
predicted to stay within the share of the card every plan may use
(:data:`gpudash.memmodel.plan.CARD_SHARE`, what ``gpudash estimate`` calls fitting), and shrinks it x0.8 after an OOM. The effective
batch (samples per optimizer step) never changes: a smaller micro-batch
means more gradient-accumulation micro-steps.

On a CPU nothing runs out of memory on its own, so two documented testing aids
raise a real ``torch.OutOfMemoryError`` inside the forward pass instead:
``--memory-budget-gb`` (:class:`BudgetMeter`: parameters, gradients and
optimizer state as enumerated tensors plus the activations autograd saves,
counted as they are saved) and ``--inject-oom-at-batch N`` (:class:`OOMInjector`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from gpudash.memmodel.plan import CARD_SHARE
from gpudash.units import distinct_bytes

__all__ = ["GROW_BELOW", "AdaptiveBatch", "BudgetMeter", "OOMInjector", "tensor_bytes"]

GROW = 1.2
SHRINK = 0.8
GROW_BELOW = 0.70
"""The controller's own number, below the card share: it starts where the prediction is under this
share of capacity and grows while the measured peak is, so that measurement, not the estimate alone,
takes the micro-batch up to what fits."""


class AdaptiveBatch:
    def __init__(self, effective: int, start: int, *, adaptive: bool, max_micro: int | None = None,
                 target: tuple[float, float] = (GROW_BELOW, CARD_SHARE), grow_every: int = 5) -> None:
        if effective < 1 or start < 1:
            raise ValueError("batch sizes must be >= 1")
        self.effective = effective
        self.micro = min(start, effective)
        self.adaptive = adaptive
        self.max_micro = min(max_micro or effective, effective)
        self.target = target
        self.grow_every = grow_every
        self._good = 0

    def plan(self) -> int:
        """Micro-steps per optimizer step at the current micro-batch."""
        return math.ceil(self.effective / self.micro)

    def shrink(self) -> int | None:
        """After an OOM: the new micro-batch, or None when it is already 1."""
        self._good = 0
        if self.micro <= 1:
            return None
        self.micro = max(1, min(self.micro - 1, math.floor(self.micro * SHRINK)))
        return self.micro

    def maybe_grow(self, peak: float | None, capacity: float | None,
                   predict: Callable[[int], float] | None = None) -> int | None:
        """After a good step: the new micro-batch if it grew, else None."""
        self._good += 1
        if not self.adaptive or peak is None or not capacity or self.micro >= self.max_micro:
            return None
        if self._good < self.grow_every or peak > self.target[0] * capacity:
            return None
        new = min(self.max_micro, max(self.micro + 1, math.floor(self.micro * GROW)))
        # scale the measured peak by the predicted ratio: measured beats predicted
        if predict is not None:
            ratio = predict(new) / max(predict(self.micro), 1.0)
            if peak * ratio > self.target[1] * capacity:
                return None
        self._good = 0
        self.micro = new
        return new


def tensor_bytes(tensors: Any) -> int:
    """Bytes of distinct storages among ``tensors`` (views counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and torch.is_tensor(t):
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _raise_oom(message: str) -> None:
    raise torch.OutOfMemoryError(message)


class BudgetMeter:
    """Counts what autograd saves during a forward and raises OutOfMemoryError when
    parameters + gradients + optimizer state + saved activations exceed the budget.
    Chains to any saved-tensor hooks already installed (the Monitor's), so both see
    every tensor."""

    def __init__(self, budget_bytes: float, static_bytes: Callable[[], int]) -> None:
        self.budget = budget_bytes
        self.static_bytes = static_bytes
        self.peak = 0
        self._saved = 0
        self._seen: set[int] = set()
        self._params: set[int] = set()
        self._static = 0
        self._outer: Any = None
        self._active = False
        self.refused: int | None = None
        """Bytes counted when the budget refused the last allocation (None: it did not)."""

    def set_params(self, params: Any) -> None:
        self._params = {p.untyped_storage().data_ptr() for p in params}

    def begin(self) -> None:
        """Start counting one micro-batch (call right before the forward)."""
        top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        self._outer = top(False) if top is not None else None
        self._saved = 0
        self._seen.clear()
        self._static = self.static_bytes()
        self.peak = max(self.peak, self._static)
        torch._C._autograd._push_saved_tensors_default_hooks(self._pack, self._unpack)
        self._active = True

    def end(self) -> None:
        if self._active:
            torch._C._autograd._pop_saved_tensors_default_hooks()
            self._active = False

    def _pack(self, t: torch.Tensor) -> Any:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in self._params and ptr not in self._seen:
            self._seen.add(ptr)
            self._saved += st.nbytes()
            used = self._static + self._saved
            self.peak = max(self.peak, used)
            if used > self.budget:
                self.refused = used
                need, budget = distinct_bytes(used, self.budget, min_digits=2)
                _raise_oom(f"memory budget exceeded: {need} measured > budget {budget} "
                           f"({used} > {int(self.budget)} bytes; gpudash --memory-budget-gb)")
        return self._outer[0](t) if self._outer is not None else t

    def _unpack(self, packed: Any) -> Any:
        return self._outer[1](packed) if self._outer is not None else packed

    def reset_peak(self) -> int:
        p, self.peak = self.peak, 0
        self.refused = None
        return p


class OOMInjector:
    """Testing aid: a forward pre-hook that raises a real ``torch.OutOfMemoryError``
    whenever the controller's micro-batch is >= ``at``."""

    def __init__(self, at: int, batch: AdaptiveBatch) -> None:
        self.at = at
        self.batch = batch
        self.raised = 0

    def attach(self, model: torch.nn.Module) -> Any:
        return model.register_forward_pre_hook(self._hook)

    def _hook(self, module: Any, args: Any) -> None:
        if self.batch.micro >= self.at:
            self.raised += 1
            _raise_oom(f"injected OOM: micro-batch {self.batch.micro} >= {self.at} (gpudash --inject-oom-at-batch)")
