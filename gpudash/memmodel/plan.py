"""What every prediction of the memory model shares: the share of a card a plan may use, the one
estimate type and fit row for gpudash's GPT and Hugging Face models, and its parameter errors.

One constant, so that ``gpudash estimate``'s "what fits", the trainer's starting micro-batch and
the OOM advice (:mod:`gpudash.analysis.recommend`) agree on what fits a card.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["CARD_SHARE", "Estimate", "FitOption", "ParamError", "usable_bytes"]

CARD_SHARE = 0.92
"""Share of a card's memory a plan's predicted peak may take. The rest is what the allocator cannot
hand out or the model does not count: the CUDA context and kernels loaded outside the allocator
(300-800 MiB, depending on the card and CUDA version), the caching allocator's rounding and
fragmentation of freed blocks, and the small error of the prediction itself (the estimator is
within a few percent of the measured peak in tests/memmodel)."""


def usable_bytes(card_bytes: float) -> float:
    """Bytes of a ``card_bytes`` card a plan may fill."""
    return card_bytes * CARD_SHARE


class ParamError(ValueError):
    """A bad argument to the memory model. The message names the parameters (``micro_batch``,
    ``finetune``); a command line renders the same message with its flags (``--batch``, ``--finetune``)
    through :meth:`render`, so the library never speaks in one program's flags."""

    def __init__(self, template: str, *names: str) -> None:
        """``template`` holds ``{name}`` where each of ``names`` is meant (any other text, braces
        included, is left as it is: values from the user need no escaping)."""
        self.template = template
        self.names = names
        super().__init__(self.render({}))

    def render(self, flags: Mapping[str, str]) -> str:
        """The message with each parameter called what ``flags`` calls it (its own name otherwise)."""
        text = self.template
        for n in self.names:
            text = text.replace("{" + n + "}", flags.get(n, n))
        return text


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
    precision: str
    offload: str
    weights: str
    n_params: int
    trainable_params: int
    finetune: str = "full"
    optimizer: str = "adamw"
    attn: str = "sdpa"
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

    finetune: str
    weights: str
    optimizer: str
    ckpt: str
    precision: str
    offload: str
    micro_batch: int
    """Largest micro-batch that fits (0: not even one)."""
    peak_bytes: int
    """Predicted peak at that micro-batch (at micro-batch 1 when nothing fits)."""
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
