"""TrainConfig: everything one training run needs, validated where it is made."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpudash.trainer.checkpointing import parse_mode
from gpudash.trainer.shapes import PRESETS

__all__ = ["TrainConfig"]


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """A training run. Defaults train the ``tiny`` preset on a CPU in a few seconds."""

    preset: str = "tiny"
    """Model shape: tiny, small, gpt2-124m, gpt2-350m, llama-7b."""
    model_overrides: dict[str, Any] = field(default_factory=dict)
    """GPTConfig fields replaced on top of the preset (e.g. ``{"n_layer": 2}``)."""
    steps: int = 50
    """Optimizer steps."""
    run_dir: str | Path = "runs/train"
    name: str | None = None
    device: str = "auto"
    """auto (CUDA when present), cpu or cuda (cuda:N)."""
    ckpt: str = "none"
    """none, block, every-N, attn or mlp."""
    precision: str = "fp32"
    """fp32, bf16 (autocast) or fp16 (autocast + loss scaling)."""
    offload: str = "none"
    """none, optimizer, optimizer+grads: state in host memory, optimizer step on the CPU."""
    weights: str = "fp32"
    """Device weight dtype; bf16 needs offload (fp32 master weights stay on the host)."""
    batch: int | str = "auto"
    """Micro-batch: an int, or auto (estimator's safe size, then adaptive)."""
    effective_batch: int = 0
    """Samples per optimizer step; 0: the micro-batch when fixed, 16 with auto."""
    max_micro_batch: int = 0
    """Largest micro-batch the adaptive controller may grow to (0: effective batch)."""
    seq_len: int = 0
    """Longest sample in tokens; 0: the preset's block size."""
    min_len: int = 0
    """Shortest sample; 0: half of seq_len."""
    samples: int = 2000
    """Size of the generated corpus (samples)."""
    lr: float = 1e-3
    warmup_steps: int = 5
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    """Clip the gradient norm to this (0: off)."""
    seed: int = 0
    fallback_after: int = 3
    """Switch 16-bit runs to fp32 after this many non-finite steps in a row."""
    min_loss_scale: float = 1.0
    """...or when the fp16 loss scale falls below this."""
    memory_cap_gb: float = 0.0
    """CUDA: cap this process's share of the card (torch.cuda.set_per_process_memory_fraction)."""
    memory_budget_gb: float = 0.0
    """CPU: raise OutOfMemoryError when measured bytes exceed this (testing aid)."""
    inject_oom_at_batch: int = 0
    """Testing aid: raise OutOfMemoryError in forward while the micro-batch is >= N."""
    inject_nan_at_steps: tuple[int, ...] = ()
    """Testing aid: make the loss non-finite at these steps."""
    inject_spike_at_steps: tuple[int, ...] = ()
    """Testing aid: multiply the loss (and so its gradients) by ``spike_factor`` at these steps."""
    spike_factor: float = 8.0
    slow_data_ms: float = 0.0
    """Testing aid: sleep this long in the data phase of every step (an input-bound run)."""
    threads: int = 0
    """CPU intra-op threads; 0: one thread for models under 20 M parameters (small matmuls do not
    gain from more, and on a shared box OpenMP spin-waits make them 10x slower), torch's default above."""
    progress: bool = False
    """Draw a progress line on stderr."""
    monitor_options: dict[str, Any] = field(default_factory=dict)
    """MonitorOptions fields for the run's Monitor."""

    def __post_init__(self) -> None:
        if self.preset not in PRESETS:
            raise ValueError(f"unknown --preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        block = PRESETS[self.preset].block_size
        if self.model_overrides.get("block_size", block) < self.seq_len:
            raise ValueError(f"--seq-len {self.seq_len} is longer than the {self.preset} block size "
                             f"{self.model_overrides.get('block_size', block)}")
        if self.steps < 1:
            raise ValueError("--steps must be >= 1")
        parse_mode(self.ckpt)
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise ValueError(f"unknown --precision {self.precision!r}; use fp32, bf16 or fp16")
        if self.offload not in ("none", "optimizer", "optimizer+grads"):
            raise ValueError(f"unknown --offload {self.offload!r}; use none, optimizer or optimizer+grads")
        if self.weights not in ("fp32", "bf16"):
            raise ValueError(f"unknown --weights {self.weights!r}; use fp32 or bf16")
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
                raise ValueError(f"{name} must be >= 0")
        if self.seq_len and self.min_len > self.seq_len:
            raise ValueError("--min-len must be <= --seq-len")
        if self.lr <= 0:
            raise ValueError("--lr must be > 0")
        for name in ("memory_cap_gb", "memory_budget_gb", "slow_data_ms", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"unknown --device {self.device!r}; use auto, cpu or cuda")
        self.inject_nan_at_steps = tuple(int(s) for s in self.inject_nan_at_steps)
        self.inject_spike_at_steps = tuple(int(s) for s in self.inject_spike_at_steps)
        from gpudash.options import MonitorOptions

        try:
            MonitorOptions(**self.monitor_options)  # unknown or bad Monitor options fail here, not mid-run
        except TypeError as exc:
            raise ValueError(f"bad Monitor option: {exc}") from None

    @property
    def micro_fixed(self) -> int | None:
        return self.batch if isinstance(self.batch, int) else None

    @property
    def effective(self) -> int:
        return self.effective_batch or (self.micro_fixed or 16)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["run_dir"] = str(self.run_dir)
        d["inject_nan_at_steps"] = list(self.inject_nan_at_steps)
        d["inject_spike_at_steps"] = list(self.inject_spike_at_steps)
        return d
