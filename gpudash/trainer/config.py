"""TrainConfig: everything one training run needs, validated where it is made.

Each field's docstring is its ``gpudash train --help`` line (``gpudash.commands._flags`` makes the flags from
the fields); ``metadata=cli(...)`` says what the name, type and default do not. ``TrainConfig.from_dict``
reads a recorded config back (``meta["config"]``), older ones with a ``monitor_options`` dict included.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpudash.memmodel.names import GPT_WEIGHTS, OFFLOADS, PRECISIONS
from gpudash.memmodel.shapes import PRESETS, parse_overrides
from gpudash.options import MonitorOptions, cli, load
from gpudash.trainer.checkpointing import parse_mode

__all__ = ["TrainConfig"]

#: device weight dtypes the trainer runs (the estimator's fine-tune side knows more: int8, nf4)
WEIGHTS = GPT_WEIGHTS


def _timestamped_run_dir() -> Path:
    return Path("runs") / time.strftime("train-%Y%m%d-%H%M%S")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """A training run. Defaults train the ``tiny`` preset on a CPU in a few seconds."""

    preset: str = field(default="tiny", metadata=cli(choices=tuple(PRESETS)))
    """Model shape."""
    model_overrides: dict[str, Any] = field(default_factory=dict, metadata=cli(
        flag="--model", metavar="FIELD=VALUE", repeat=parse_overrides))
    """GPTConfig fields replaced on top of the preset, e.g. --model n_layer=2 (repeatable)."""
    steps: int = 50
    """Optimizer steps."""
    run_dir: str | Path = field(default="runs/train", metadata=cli(
        default=_timestamped_run_dir, shown="runs/train-<date>-<time>", metavar="DIR"))
    """The run directory to record into."""
    name: str | None = None
    """Run name shown in the dashboard (default: the run directory's name)."""
    device: str = "auto"
    """auto (CUDA when present), cpu or cuda (cuda:N)."""
    ckpt: str = "none"
    """Gradient checkpointing: none, block, every-N, attn or mlp."""
    precision: str = field(default="fp32", metadata=cli(choices=PRECISIONS))
    """fp32, bf16 (autocast) or fp16 (autocast + loss scaling)."""
    offload: str = field(default="none", metadata=cli(choices=OFFLOADS))
    """State in host memory, optimizer step on the CPU."""
    weights: str = field(default="fp32", metadata=cli(choices=WEIGHTS))
    """Device weight dtype; bf16 needs --offload (fp32 master weights stay on the host)."""
    batch: int | str = field(default="auto", metadata=cli(metavar="N|auto"))
    """Micro-batch: N, or auto (the estimator's safe size, then adaptive)."""
    effective_batch: int = 0
    """Samples per optimizer step; 0: the micro-batch when fixed, 16 with auto."""
    max_micro_batch: int = 0
    """Largest micro-batch the adaptive controller may grow to (0: the effective batch)."""
    seq_len: int = 0
    """Longest sample in tokens; 0: the preset's block size."""
    min_len: int = 0
    """Shortest sample; 0: half of seq_len."""
    samples: int = 2000
    """Size of the generated corpus (samples)."""
    lr: float = 1e-3
    """Peak learning rate."""
    warmup_steps: int = 5
    """Steps of linear learning-rate warmup (then cosine decay to a tenth of lr)."""
    weight_decay: float = 0.1
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Clip the gradient norm to this (0: off)."""
    seed: int = 0
    """Seed of the model's initialization and the generated data."""
    fallback_after: int = 3
    """Switch 16-bit runs to fp32 after this many non-finite steps in a row."""
    min_loss_scale: float = 1.0
    """...or when the fp16 loss scale falls below this."""
    memory_cap_gb: float = 0.0
    """CUDA: behave like a card of this size (torch.cuda.set_per_process_memory_fraction; 0: off)."""
    memory_budget_gb: float = 0.0
    """CPU testing aid: raise OutOfMemoryError when measured bytes exceed this (0: off)."""
    inject_oom_at_batch: int = field(default=0, metadata=cli(metavar="N"))
    """Testing aid: raise OutOfMemoryError in forward while the micro-batch is >= N (0: off)."""
    inject_nan_at_steps: tuple[int, ...] = field(default=(), metadata=cli(aliases=("--inject-nan-at-step",),
                                                                         metavar="N[,M...]"))
    """Testing aid: make the loss non-finite at these steps."""
    inject_spike_at_steps: tuple[int, ...] = field(default=(), metadata=cli(aliases=("--inject-spike-at-step",),
                                                                           metavar="N[,M...]"))
    """Testing aid: multiply the loss (and so its gradients) by spike_factor at these steps."""
    spike_factor: float = 8.0
    """What inject_spike_at_steps multiplies the loss by."""
    slow_data_ms: float = field(default=0.0, metadata=cli(metavar="MS"))
    """Testing aid: sleep this long in the data phase of every step (an input-bound run)."""
    threads: int = 0
    """CPU intra-op threads; 0: one thread for models under 20 M parameters (small matmuls do not
    gain from more, and on a shared box OpenMP spin-waits make them 10x slower), torch's default above."""
    progress: bool = field(default=False, metadata=cli(default=True))
    """Draw a progress line on stderr."""
    monitor: MonitorOptions = field(default_factory=MonitorOptions)
    """The run's Monitor and collectors (MonitorOptions)."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown --preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        block = PRESETS[self.preset].block_size
        if self.model_overrides.get("block_size", block) < self.seq_len:
            raise ValueError(f"--seq-len {self.seq_len} is longer than the {self.preset} block size "
                             f"{self.model_overrides.get('block_size', block)}")
        if self.steps < 1:
            raise ValueError("--steps must be >= 1")
        if self.fallback_after < 1:
            raise ValueError("--fallback-after must be >= 1 (non-finite steps in a row)")
        parse_mode(self.ckpt)
        for name, allowed in (("precision", PRECISIONS), ("offload", OFFLOADS), ("weights", WEIGHTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown --{name} {getattr(self, name)!r}; use {', '.join(allowed)}")
        if self.weights == "bf16" and self.offload == "none":
            raise ValueError("--weights bf16 needs --offload optimizer (fp32 master weights live on the host)")
        if self.weights == "bf16" and self.precision != "bf16":
            raise ValueError("--weights bf16 needs --precision bf16")
        if self.precision == "fp16" and self.offload != "none":
            raise ValueError("--precision fp16 with --offload is not supported (the loss scaler steps a device "
                             "optimizer); use --precision bf16")
        if isinstance(self.batch, str):
            if self.batch != "auto":
                if not self.batch.isdigit():
                    raise ValueError(f"--batch must be 'auto' or a positive integer, not {self.batch!r}")
                self.batch = int(self.batch)
        if isinstance(self.batch, int) and self.batch < 1:
            raise ValueError("--batch must be >= 1")
        for name in ("threads", "effective_batch", "max_micro_batch", "seq_len", "min_len", "inject_oom_at_batch",
                     "warmup_steps", "samples"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if self.seq_len and self.min_len > self.seq_len:
            raise ValueError("--min-len must be <= --seq-len")
        if self.lr <= 0:
            raise ValueError("--lr must be > 0")
        for name in ("memory_cap_gb", "memory_budget_gb", "slow_data_ms", "grad_clip", "min_loss_scale", "weight_decay"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"unknown --device {self.device!r}; use auto, cpu or cuda")
        self.inject_nan_at_steps = tuple(int(s) for s in self.inject_nan_at_steps)
        self.inject_spike_at_steps = tuple(int(s) for s in self.inject_spike_at_steps)
        if not isinstance(self.monitor, MonitorOptions):
            raise ValueError(f"monitor={type(self.monitor).__name__}: pass MonitorOptions(...) "
                             "(TrainConfig.from_dict reads a dict of its fields)")

    @property
    def micro_fixed(self) -> int | None:
        return self.batch if isinstance(self.batch, int) else None

    @property
    def effective(self) -> int:
        return self.effective_batch or (self.micro_fixed or 16)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "config") -> tuple[TrainConfig, list[str]]:
        """A config recorded by :meth:`to_dict` (a run's ``meta["config"]``, a JSON file), older ones whose
        Monitor options are a ``monitor_options`` dict included; (config, notes): a key no field has is left
        out with a note. A bad value raises ValueError naming it."""
        return load(cls, data, where=where, rename={"monitor_options": "monitor"})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        d["inject_nan_at_steps"] = list(self.inject_nan_at_steps)
        d["inject_spike_at_steps"] = list(self.inject_spike_at_steps)
        return d
