"""The memory-optimized GPT trainer: every memory technique is a switch.

``train(TrainConfig(...)) -> run_dir`` runs in-process under a Monitor. The memory model it sizes
batches with (estimator, presets, step time) is :mod:`gpudash.memmodel`, which needs no torch.

    model.py          the GPT: pre-norm blocks, SDPA attention, tied embeddings
    data.py           byte tokenizer, stdlib-text + generated samples, length buckets
    checkpointing.py  none / block / every-N / attn / mlp recompute plans
    precision.py      fp32 / bf16 / fp16 + GradScaler, fallback to fp32
    offload.py        AdamW on the CPU over pinned host state, side-stream copies
    batching.py       adaptive micro-batch, OOM budget meter and injector (CPU aids)
    config.py         TrainConfig (validated)
    preflight.py      the checklist recorded before step 1
    loop.py           the training loop under the Monitor; OOM recovery; DDP
    progressline.py   the terminal's progress line
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
