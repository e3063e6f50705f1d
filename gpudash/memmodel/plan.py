"""What every prediction of the memory model shares: the share of a card a plan may use, the one
estimate type and fit row for gpudash's GPT and Hugging Face models, and its parameter errors.

One constant, so that ``gpudash estimate``'s "what fits", the trainer's starting micro-batch and
the OOM advice (:mod:`gpudash.analysis.recommend`) agree on what fits a card.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpudash.memmodel.names import Attn, Finetune, Offload, Optimizer, ParamError, Precision, Weights

__all__ = ["CARD_SHARE", "Estimate", "FitOption", "ParamError", "fits", "largest_fit", "plan_accum", "usable_bytes"]

CARD_SHARE = 0.92
"""Share of a card's memory a plan's predicted peak may take. The rest is what the allocator cannot
hand out or the model does not count: the CUDA context and kernels loaded outside the allocator
(300-800 MiB, depending on the card and CUDA version), the caching allocator's rounding and
fragmentation of freed blocks, and the small error of the prediction itself (the estimator is
within a few percent of the measured peak in tests/memmodel)."""


def usable_bytes(card_bytes: float, share: float = CARD_SHARE) -> float:
    """Bytes of a ``card_bytes`` card a plan may fill."""
    return card_bytes * share


def fits(est: Estimate, card_bytes: float, share: float = CARD_SHARE) -> bool:
    """The one rule of what fits a card, for either model family and every surface (``gpudash estimate``'s
    table and verdict line, the trainer's starting micro-batch): the predicted peak of the plan as it runs
    (at its gradient accumulation) within ``share`` of the card."""
    return est.peak_bytes <= usable_bytes(card_bytes, share)


def plan_accum(micro_batch: int, seq_len: int, tokens_per_step: int) -> int:
    """Micro-batches an optimizer step of ``tokens_per_step`` tokens takes at ``micro_batch`` x ``seq_len``;
    1 when one micro-batch holds the whole step (and for 0 tokens: each micro-batch is a step)."""
    return max(1, -(-tokens_per_step // (micro_batch * seq_len)))


def largest_fit(predict: Callable[[int, int], Estimate], *, card_bytes: float, seq_len: int, tokens_per_step: int,
                limit: int, share: float = CARD_SHARE) -> Estimate | None:
    """The estimate of the largest micro-batch (<= ``limit``) that :func:`fits` the card, judged at the
    accumulation the plan needs (:func:`plan_accum`; 0 tokens: each micro-batch is a step); None when not
    even micro-batch 1 fits. ``predict(micro_batch, accum)`` is the family's estimate.

    Under accumulation (accum > 1) the gradients of the earlier micro-batches are held while the next one
    runs, so at a fixed accumulation the peak grows with the micro-batch, and it drops by those gradients
    at the micro-batch that holds the whole step (accum 1): the micro-batches below that one and those
    from it on are bisected apart."""

    def judged(b: int) -> Estimate:
        return predict(b, plan_accum(b, seq_len, tokens_per_step))

    def bisect(lo: int, hi: int, best: Estimate | None) -> Estimate | None:
        while lo <= hi:
            mid = (lo + hi) // 2
            est = judged(mid)
            if fits(est, card_bytes, share):
                best, lo = est, mid + 1
            else:
                hi = mid - 1
        return best

    limit = max(1, limit)
    whole = plan_accum(1, seq_len, tokens_per_step)  # the micro-batch that holds the step: accum 1 from it on
    if whole <= limit:
        at_whole = judged(whole)
        if fits(at_whole, card_bytes, share):
            return bisect(whole + 1, limit, at_whole)
    return bisect(1, min(limit, whole - 1), None)


@dataclass(frozen=True, slots=True)
class Estimate:
    """One rank's predicted memory and time for a model (gpudash's GPT or a Hugging Face architecture),
    a micro-batch and a technique mix: the one answer :func:`gpudash.memmodel.fit.estimate` gives."""

    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    peak_bytes: int
    forward_peak_bytes: int
    """Peak at the end of the largest forward: params, optimizer state, the gradients held
    then and the saved activations (no backward transients): what a saved-tensor meter sees."""
    host_bytes: int
    """Pinned host memory under offload (fp32 master weights, optimizer state, gradients)."""
    recompute_bytes: int
    """Activations of the largest checkpointed region, alive while it recomputes."""
    flops_per_token: int
    """Training FLOPs per token without recompute: 2 N forward, 2 N input gradients, 2 N weight
    gradients of trainable matrices only (6 N for a full fine-tune, nanoGPT's estimate_mfu), plus attention."""
    recompute_flops_per_token: int
    """Forward FLOPs per token that checkpointing runs a second time in backward."""
    weight_copies_bytes: int
    """Part of ``activations_bytes``: the 16-bit copies of the weights autocast saves for backward."""
    logits_grad_bytes: int
    """The gradients of the log-softmax and of the logits, alive together at the start of backward."""
    peak_moment: str
    """When the peak happens: ``activations`` (early in backward: saved activations and logits'
    gradients alive, most gradients not made yet) or ``gradients`` (end of backward)."""
    micro_batch: int
    seq_len: int
    ckpt: str
    precision: Precision
    offload: Offload
    weights: Weights
    n_params: int
    trainable_params: int
    finetune: Finetune = "full"
    optimizer: Optimizer = "adamw"
    attn: Attn = "sdpa"
    lora_r: int = 0
    lora_targets: tuple[str, ...] = ()
    dequant_bytes: int = 0
    """Bytes one micro-batch reads and writes dequantizing 4/8-bit weights (forward, backward, recompute)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lora_targets"] = list(self.lora_targets)
        return d


@dataclass(frozen=True, slots=True)
class FitOption:
    """One technique mix at the largest micro-batch that fits a card (:func:`gpudash.memmodel.fit.what_fits`)."""

    finetune: Finetune
    weights: Weights
    optimizer: Optimizer
    ckpt: str
    precision: Precision
    offload: Offload
    micro_batch: int
    """Largest micro-batch that fits (0: not even one)."""
    peak_bytes: int
    """Predicted peak at that micro-batch and ``accum``, the one :func:`fits` judged (at micro-batch 1 when
    nothing fits)."""
    host_bytes: int
    """Host RAM the mix needs (pinned: offloaded master weights, optimizer state, gradients)."""
    step_s: float
    """Predicted seconds per optimizer step (:class:`gpudash.memmodel.steptime.StepTimeModel`)."""
    step_cost: float
    """``step_s`` relative to the family's reference (:func:`gpudash.memmodel.fit.reference`): 0.33 is
    33 % slower."""
    trainable_params: int
    cost: str
    """What the mix costs in time, in words."""
    accum: int = 1
    """Micro-batches a step takes at that micro-batch: what ``peak_bytes`` was judged at (the gradients of
    the earlier ones are held while the next runs)."""
