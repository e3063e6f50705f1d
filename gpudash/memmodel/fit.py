"""One way into the memory model, whatever the model: gpudash's GPT (a :class:`GPTConfig` or
:class:`ModelShape`) or a Hugging Face architecture (:class:`HFArch`).

    estimate(model, micro_batch=4, seq_len=512, precision="bf16", finetune="lora")  -> Estimate
    what_fits(model, card_bytes=24 * 2**30, seq_len=512)                             -> [FitOption]
    explain(model, estimate)                                                         -> [sentence]

Each family keeps its own arithmetic (:mod:`gpudash.memmodel.estimator`, :mod:`gpudash.memmodel.finetune`);
this module only chooses, and refuses what a family does not model (LoRA of gpudash's GPT) by naming the
parameter.
"""

from __future__ import annotations

from typing import Any

from gpudash.memmodel import estimator, finetune
from gpudash.memmodel.hf_arch import HFArch
from gpudash.memmodel.plan import Estimate, FitOption, ParamError
from gpudash.memmodel.steptime import StepTimeModel

__all__ = ["GPT_MIX", "HF_MIX", "estimate", "explain", "reference", "what_fits"]

#: The technique switches each family takes (HF: :func:`gpudash.memmodel.finetune.estimate_hf`).
GPT_MIX = ("ckpt", "precision", "offload", "weights")
HF_MIX = ("finetune", "lora_r", "lora_targets", "lora_dropout", "weights", "optimizer", "attn", "ckpt", "precision",
          "offload", "double_quant")
#: What gpudash's GPT always is, for the switches only a Hugging Face model has.
_GPT_FIXED = {"finetune": "full", "optimizer": "adamw", "attn": "sdpa"}


def _gpt_mix(mix: dict[str, Any]) -> dict[str, Any]:
    """The GPT's switches out of ``mix``; a switch it does not have, set to anything but what it does, is
    refused (adapter settings are ignored: they only matter under a LoRA it refuses)."""
    for name, value in mix.items():
        if name in _GPT_FIXED and value not in (None, "", _GPT_FIXED[name]):
            raise ParamError(f"{{{name}}} {value!r} is modelled for Hugging Face architectures only (an HFArch, from "
                             "a config.json); gpudash's GPT is a full fine-tune with AdamW and SDPA attention", name)
        if name not in HF_MIX:
            raise ParamError(f"unknown switch {{{name}}}", name)
    return {k: v for k, v in mix.items() if k in GPT_MIX and v not in (None, "")}


def estimate(model: Any, *, micro_batch: int, seq_len: int, accum: int = 1, **mix: Any) -> Estimate:
    """Predicted memory and time of one rank for ``model`` at ``micro_batch`` x ``seq_len`` tokens,
    ``accum`` micro-batches a step, with the technique ``mix`` (see :data:`GPT_MIX`, :data:`HF_MIX`)."""
    if isinstance(model, HFArch):
        return finetune.estimate_hf(model, micro_batch=micro_batch, seq_len=seq_len, accum=accum,
                                    **{k: v for k, v in mix.items() if v is not None})
    return estimator.estimate(model, micro_batch=micro_batch, seq_len=seq_len, accum=accum, **_gpt_mix(mix))


def what_fits(model: Any, *, card_bytes: float, seq_len: int, tokens_per_step: int = 0,
              time_model: StepTimeModel | None = None, **adapter: Any) -> list[FitOption]:
    """Technique mixes fastest first by the predicted time of a step of ``tokens_per_step`` tokens, each at
    the largest micro-batch whose predicted peak fits the card's share (:data:`CARD_SHARE`). gpudash's GPT:
    every checkpointing, precision, offload and weight-dtype mix of a full fine-tune; a Hugging Face model:
    full, LoRA and QLoRA in bf16 compute (``adapter``: ``attn``, ``lora_r``, ``lora_targets``,
    ``lora_dropout``, ``double_quant`` for their rows)."""
    if isinstance(model, HFArch):
        return finetune.hf_fits(model, card_bytes=card_bytes, seq_len=seq_len, tokens_per_step=tokens_per_step,
                                time_model=time_model, **{k: v for k, v in adapter.items() if v is not None})
    _gpt_mix(adapter)
    return estimator.gpt_fits(model, card_bytes=card_bytes, seq_len=seq_len, tokens_per_step=tokens_per_step,
                              time_model=time_model)


def explain(model: Any, est: Estimate) -> list[str]:
    """Why an estimate's numbers look as they do, as sentences (``gpudash estimate`` prints them)."""
    return finetune.hf_notes(model, est) if isinstance(model, HFArch) else estimator.gpt_notes(model, est)


def reference(model: Any) -> str:
    """What a :class:`FitOption`'s ``step_cost`` is relative to, in words."""
    if isinstance(model, HFArch):
        return "a full bf16 fine-tune without checkpointing"
    return "the same precision without checkpointing or offload"
