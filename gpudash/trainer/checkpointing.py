"""Gradient checkpointing modes: which parts of the model recompute in backward.

``none``     keep every activation (fastest, most memory)
``block``    checkpoint every transformer block: only block inputs are kept
``every-N``  checkpoint every N-th block (``every-2`` = blocks 0, 2, 4, ...)
``attn``     checkpoint only the attention half of each block (selective)
``mlp``      checkpoint only the MLP half of each block (selective)

All use ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``, which
saves a region's inputs and re-runs the region during backward: the math is
unchanged, only memory and time move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MODES", "CheckpointPlan", "apply_checkpointing", "parse_mode"]

MODES = ("none", "block", "every-N", "attn", "mlp")


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    """Which block parts are checkpointed, per layer: ``(block, attn, mlp)``."""

    mode: str
    every: int = 1

    def layer(self, i: int) -> tuple[bool, bool, bool]:
        if self.mode == "block":
            return True, False, False
        if self.mode == "every":
            return i % self.every == 0, False, False
        return False, self.mode == "attn", self.mode == "mlp"

    def label(self) -> str:
        return f"every-{self.every}" if self.mode == "every" else self.mode


def parse_mode(text: str) -> CheckpointPlan:
    """``none``, ``block``, ``attn``, ``mlp`` or ``every-N`` (N >= 1) -> a plan; ValueError otherwise."""
    t = text.strip().lower()
    if t in ("none", "block", "attn", "mlp"):
        return CheckpointPlan(t)
    if t.startswith("every-") and t[6:].isdigit() and int(t[6:]) >= 1:
        n = int(t[6:])
        return CheckpointPlan("block") if n == 1 else CheckpointPlan("every", n)
    raise ValueError(f"unknown checkpointing mode {text!r}; use none, block, every-N (e.g. every-2), attn or mlp")


def apply_checkpointing(model: Any, plan: CheckpointPlan) -> int:
    """Set the checkpoint flags on each block of a :class:`GPT`; returns how many regions recompute."""
    regions = 0
    for i, block in enumerate(model.h):
        block.ckpt_block, block.ckpt_attn, block.ckpt_mlp = plan.layer(i)
        regions += int(block.ckpt_block) + int(block.ckpt_attn) + int(block.ckpt_mlp)
    return regions
