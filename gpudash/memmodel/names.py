"""The memory model's technique names, each a ``Literal`` alias with its tuple of values, and the one check
that a name given at run time is one of them (a :class:`ParamError` naming the parameter otherwise).

The tuples are the aliases' values (``typing.get_args``), so a name added to an alias is accepted, listed in
the error and offered by ``gpudash estimate``'s flags at once.
"""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

from gpudash.memmodel.plan import ParamError

__all__ = ["ATTNS", "FINETUNES", "GPT_WEIGHTS", "HF_OFFLOADS", "OFFLOADS", "OPTIMIZERS", "PRECISIONS", "WEIGHTS",
           "Attn", "Finetune", "GptWeights", "HfOffload", "Offload", "Optimizer", "Precision", "Weights", "check"]

Precision = Literal["fp32", "bf16", "fp16"]
"""Compute precision: fp32, or 16-bit autocast (bf16, fp16)."""
Offload = Literal["none", "optimizer", "optimizer+grads"]
"""What lives in host memory: nothing, the optimizer state (and fp32 master weights), also the gradients."""
HfOffload = Literal["none", "optimizer"]
"""The offloads modelled for a Hugging Face model."""
Finetune = Literal["full", "lora", "qlora"]
Weights = Literal["fp32", "bf16", "fp16", "int8", "nf4"]
"""Weight dtype of a Hugging Face model (int8 / nf4: bitsandbytes, frozen under QLoRA)."""
GptWeights = Literal["fp32", "bf16"]
"""Weight dtype of gpudash's GPT."""
Optimizer = Literal["adamw", "adamw8bit", "paged_adamw8bit", "sgd", "adafactor"]
Attn = Literal["eager", "sdpa", "flash"]

PRECISIONS: tuple[Precision, ...] = get_args(Precision)
OFFLOADS: tuple[Offload, ...] = get_args(Offload)
HF_OFFLOADS: tuple[HfOffload, ...] = get_args(HfOffload)
FINETUNES: tuple[Finetune, ...] = get_args(Finetune)
WEIGHTS: tuple[Weights, ...] = get_args(Weights)
GPT_WEIGHTS: tuple[GptWeights, ...] = get_args(GptWeights)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
ATTNS: tuple[Attn, ...] = get_args(Attn)

_N = TypeVar("_N", bound=str)


def check(value: str, allowed: tuple[_N, ...], param: str, why: str = "") -> _N:
    """``value`` as one of ``allowed``; a :class:`ParamError` naming ``param`` and the choices otherwise
    (``why`` replaces the list of choices, for a family that models fewer of them)."""
    for a in allowed:
        if value == a:
            return a
    hint = why or "use " + (", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 else allowed[0])
    raise ParamError(f"unknown {{{param}}} {value!r}; {hint}", param)
