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

from gpudash.memmodel.names import CKPTS, CkptMode, ParamError, parse_ckpt

__all__ = ["MODES", "CheckpointPlan", "apply_checkpointing", "parse_mode"]

MODES = CKPTS


@dataclass(frozen=True, slots=True)
class CheckpointPlan:
    """Which block parts are checkpointed, per layer: ``(block, attn, mlp)``."""

    mode: CkptMode
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
    """``none``, ``block``, ``attn``, ``mlp`` or ``every-N`` (N >= 1) -> a plan; ValueError otherwise (the memory
    model's :func:`~gpudash.memmodel.names.parse_ckpt`, the one reading of a mode)."""
    try:
        return CheckpointPlan(*parse_ckpt(text))
    except ParamError as exc:
        raise ValueError(exc.render({"ckpt": "checkpointing mode"})) from None


def apply_checkpointing(model: Any, plan: CheckpointPlan) -> int:
    """Set the checkpoint flags on each block of a :class:`GPT`; returns how many regions recompute."""
    regions = 0
    for i, block in enumerate(model.h):
        block.ckpt_block, block.ckpt_attn, block.ckpt_mlp = plan.layer(i)
        regions += int(block.ckpt_block) + int(block.ckpt_attn) + int(block.ckpt_mlp)
    return regions
