"""Precision: fp32, bf16 autocast, or fp16 autocast with dynamic loss scaling,
and the fallback to fp32 when 16-bit training keeps failing.

Fallback rule: after ``fallback_after`` non-finite steps in a row, or when the
fp16 loss scale drops below ``min_scale``, the run switches to fp32 for good
and halves the learning rate; the caller records the returned reason as an
event. Skipped steps (fp16 overflow) are counted, not hidden.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gpudash.memmodel.names import PRECISIONS

__all__ = ["Precision"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, mode: str, device: torch.device, *, fallback_after: int = 3,
                 min_scale: float = 1.0, init_scale: float = 2.0 ** 16) -> None:
        if mode not in PRECISIONS:
            raise ValueError(f"unknown precision {mode!r}; use fp32, bf16 or fp16")
        if fallback_after < 1:
            raise ValueError("fallback_after must be >= 1")
        self.mode = mode
        self.device_type = device.type
        self.fallback_after = fallback_after
        self.min_scale = min_scale
        self.bad_in_a_row = 0
        self.skipped_steps = 0
        self.fell_back = False
        self.scaler: torch.amp.GradScaler | None = None
        if mode == "fp16":
            self.scaler = torch.amp.GradScaler(self.device_type, init_scale=init_scale)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.mode == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=_DTYPES[self.mode])

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: Any) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    @property
    def loss_scale(self) -> float | None:
        return float(self.scaler.get_scale()) if self.scaler is not None else None

    def step(self, optimizer: Any, finite: bool) -> bool:
        """Apply the update if the gradients are finite; returns whether it was applied.
        With fp16 the scaler also lowers its scale after an overflow."""
        if self.scaler is not None:
            if finite:
                self.scaler.step(optimizer)
            self.scaler.update()
        elif finite:
            optimizer.step()
        if not finite:
            self.skipped_steps += 1
        return finite

    def observe(self, finite: bool) -> str | None:
        """Track non-finite steps; returns the reason when the run must fall back to fp32."""
        if self.mode == "fp32":
            return None
        self.bad_in_a_row = 0 if finite else self.bad_in_a_row + 1
        if self.bad_in_a_row >= self.fallback_after:
            return f"{self.bad_in_a_row} non-finite steps in a row under {self.mode}"
        scale = self.loss_scale
        if scale is not None and scale < self.min_scale:
            return f"fp16 loss scale {scale:g} fell below {self.min_scale:g}"
        return None

    def fall_back(self) -> str:
        """Switch to fp32 for the rest of the run (the loop halves its learning rate)."""
        previous = self.mode
        self.mode = "fp32"
        self.scaler = None
        self.bad_in_a_row = 0
        self.fell_back = True
        return previous
