"""What a memory technique costs in time: a deliberately simple model of one optimizer step.

    compute    training FLOPs per token (6 N + 12 L h T, nanoGPT's estimate_mfu) x tokens per step,
               at ``tflops`` achieved under 16-bit autocast; fp32 runs at half that rate
               (TF32 tensor cores do half the bf16 rate on A100/H100)
    recompute  checkpointing runs the checkpointed regions' forward again in backward
               (``Estimate.recompute_flops_per_token``), at the same rate
    transfer   CPU offload moves every gradient to the host and every updated weight back,
               once per optimizer step: 2 x the device weight bytes over PCIe at ``pcie_gbps``,
               not overlapped with compute (the trainer overlaps part of it: an upper bound)

    dequantize 4/8-bit weights (QLoRA) are dequantized to 16 bits in every forward, backward and
               recompute: ``Estimate.dequant_bytes`` per micro-batch at ``hbm_gbps``
    LoRA       a frozen matrix's backward makes its input gradient only (2 N, not 4 N per token)

Not modelled: the CPU optimizer step itself, smaller micro-batches running less
efficiently, data loading, communication between GPUs. Pure arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpudash.memmodel.plan import ParamError
from gpudash.units import given

__all__ = ["StepTime", "StepTimeModel"]


@dataclass(frozen=True, slots=True)
class StepTime:
    compute_s: float
    recompute_s: float
    transfer_s: float
    transfer_bytes: int

    @property
    def total_s(self) -> float:
        return self.compute_s + self.recompute_s + self.transfer_s


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """The assumptions, stated once (``gpudash estimate`` prints them beside its answer)."""

    tflops: float = 100.0
    """Achieved training throughput under 16-bit autocast, TFLOP/s (fp32: half)."""
    pcie_gbps: float = 16.0
    """Host <-> device bandwidth, GB/s (PCIe 4.0 x16 with pinned memory measures ~20-25)."""
    hbm_gbps: float = 1500.0
    """Device memory bandwidth a dequantization kernel achieves, GB/s."""

    def __post_init__(self) -> None:
        if not self.tflops > 0:
            raise ParamError("{tflops} must be > 0", "tflops")
        if not self.pcie_gbps > 0:
            raise ParamError("{pcie_gbps} must be > 0", "pcie_gbps")

    def step(self, est: Any, tokens_per_step: int) -> StepTime:
        """Seconds of one optimizer step of ``tokens_per_step`` tokens for an :class:`Estimate`'s mix."""
        rate = self.tflops * 1e12 * (0.5 if est.precision == "fp32" else 1.0)
        moved = 2 * est.params_bytes if est.offload != "none" else 0
        micro = -(-tokens_per_step // max(1, est.micro_batch * est.seq_len))
        dequant = micro * getattr(est, "dequant_bytes", 0) / (self.hbm_gbps * 1e9)
        return StepTime(compute_s=tokens_per_step * est.flops_per_token / rate + dequant,
                        recompute_s=tokens_per_step * est.recompute_flops_per_token / rate,
                        transfer_s=moved / (self.pcie_gbps * 1e9), transfer_bytes=moved)

    def describe(self) -> str:
        return (f"compute at {self.tflops:g} TFLOP/s achieved in 16-bit, fp32 at half (--tflops); checkpointing "
                f"runs the checkpointed regions' forward again; offload moves the gradients out and the weights "
                f"back over PCIe at {given(self.pcie_gbps, 'GB/s')} every step, not overlapped (--pcie-gbps); "
                f"the CPU optimizer step and small micro-batches' lower efficiency are not counted")
