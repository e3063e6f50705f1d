"""Pre-flight checklist: what the trainer checks before step 1, recorded in the run."""

from __future__ import annotations

from typing import Any

import torch

from gpudash.memmodel.plan import Estimate
from gpudash.trainer.config import TrainConfig
from gpudash.units import distinct_bytes

__all__ = ["preflight"]


def preflight(cfg: TrainConfig, est: Estimate, device: torch.device, capacity: float | None,
              capacity_source: str, micro: int) -> dict[str, Any]:
    """Memory budget vs capacity, precision strategy, fallback plan, configuration warnings."""
    warnings: list[str] = []
    if device.type == "cuda":
        bf16_ok = torch.cuda.is_bf16_supported()
        if cfg.precision == "fp32" and bf16_ok:
            warnings.append("autocast is off on a GPU that supports bf16: --precision bf16 halves most "
                            "activations and runs on tensor cores")
        if cfg.precision == "bf16" and not bf16_ok:
            warnings.append("this GPU has no bf16 support: use --precision fp16")
        if cfg.memory_budget_gb:
            warnings.append("--memory-budget-gb is the CPU stand-in; on a GPU use --memory-cap-gb")
    else:
        if cfg.offload != "none":
            warnings.append("offload on a CPU run moves nothing (host and device are the same memory); "
                            "it only measures the extra copies")
        if cfg.memory_cap_gb:
            warnings.append("--memory-cap-gb applies to CUDA only; on a CPU use --memory-budget-gb")
        if cfg.precision == "fp16":
            warnings.append("fp16 on a CPU is slow and gains nothing; it is here to exercise loss scaling")
    # the prediction of what the capacity limits: under the CPU budget meter, the forward's peak
    # (it counts saved tensors, not backward's transients); else the allocator's peak
    meter = device.type == "cpu" and bool(cfg.memory_budget_gb)
    predicted = est.forward_peak_bytes if meter else est.peak_bytes
    if capacity is not None and predicted > capacity:
        pred, cap = distinct_bytes(predicted, capacity, min_digits=2)
        warnings.append(f"predicted peak {pred} exceeds capacity {cap}: expect OOMs and a smaller micro-batch")
    if cfg.inject_oom_at_batch:
        warnings.append(f"testing aid on: injected OOM while micro-batch >= {cfg.inject_oom_at_batch}")
    if cfg.inject_nan_at_steps:
        warnings.append(f"testing aid on: non-finite loss at steps {list(cfg.inject_nan_at_steps)}")
    if cfg.inject_spike_at_steps:
        warnings.append(f"testing aid on: loss x{cfg.spike_factor:g} at steps {list(cfg.inject_spike_at_steps)}")
    if cfg.slow_data_ms:
        warnings.append(f"testing aid on: data phase sleeps {cfg.slow_data_ms:g} ms per step")
    strategy = {"fp32": "fp32 weights and math",
                "bf16": "bf16 autocast, fp32 weights and optimizer",
                "fp16": "fp16 autocast with dynamic loss scaling (GradScaler)"}[cfg.precision]
    fallback = ("none needed (fp32)" if cfg.precision == "fp32" else
                f"switch to fp32 and halve the learning rate after {cfg.fallback_after} non-finite steps in a row"
                + (f" or when the loss scale falls below {cfg.min_loss_scale:g}" if cfg.precision == "fp16" else ""))
    return {
        "device": str(device),
        "capacity_bytes": capacity,
        "capacity_source": capacity_source,
        "predicted_peak_bytes": predicted,
        "fits": capacity is None or predicted <= capacity,
        "start_micro_batch": micro,
        "effective_batch": cfg.effective,
        "batch_mode": "auto" if cfg.micro_fixed is None else "fixed",
        "checkpointing": cfg.ckpt,
        "precision_strategy": strategy,
        "fallback_plan": fallback,
        "offload": cfg.offload,
        "oom_plan": "shrink micro-batch x0.8, free the failed step, retry the same data; "
                    "keep the effective batch by accumulation",
        "warnings": warnings,
    }
