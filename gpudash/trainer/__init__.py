"""The memory-optimized GPT trainer: every memory technique is a switch.

``train(TrainConfig(...)) -> run_dir`` runs in-process under a Monitor.
Attributes load lazily, so ``gpudash.trainer.estimator`` works without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpudash.trainer.config import TrainConfig
    from gpudash.trainer.loop import train

__all__ = ["TrainConfig", "train"]


def __getattr__(name: str) -> Any:
    if name == "TrainConfig":
        from gpudash.trainer.config import TrainConfig

        return TrainConfig
    if name == "train":
        from gpudash.trainer.loop import train

        return train
    raise AttributeError(f"module 'gpudash.trainer' has no attribute {name!r}")
