"""The memory model's technique names, each a ``Literal`` alias with its tuple of values, and the one check
that a name given at run time is one of them (a :class:`ParamError`, the memory model's one error, naming the
parameter otherwise).

The tuples are the aliases' values (``typing.get_args``), so a name added to an alias is accepted, listed in
the error and offered by ``gpudash estimate``'s flags at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeVar, get_args

__all__ = ["ATTNS", "CKPTS", "CkptMode", "ParamError", "parse_ckpt", "FINETUNES", "GPT_WEIGHTS", "HF_OFFLOADS", "OFFLOADS", "OPTIMIZERS", "PRECISIONS", "WEIGHTS",
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
CkptMode = Literal["none", "block", "every", "attn", "mlp"]
"""Activation checkpointing of gpudash's GPT: nothing, every block, every N-th block (``every-N``), each
block's attention or MLP half. A Hugging Face model checkpoints whole layers (none or block)."""

PRECISIONS: tuple[Precision, ...] = get_args(Precision)
OFFLOADS: tuple[Offload, ...] = get_args(Offload)
HF_OFFLOADS: tuple[HfOffload, ...] = get_args(HfOffload)
FINETUNES: tuple[Finetune, ...] = get_args(Finetune)
WEIGHTS: tuple[Weights, ...] = get_args(Weights)
GPT_WEIGHTS: tuple[GptWeights, ...] = get_args(GptWeights)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
ATTNS: tuple[Attn, ...] = get_args(Attn)
CKPTS: tuple[str, ...] = ("none", "block", "every-N", "attn", "mlp")
"""The checkpointing modes as a flag takes them."""

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


_N = TypeVar("_N", bound=str)


def check(value: str, allowed: tuple[_N, ...], param: str, why: str = "") -> _N:
    """``value`` as one of ``allowed``; a :class:`ParamError` naming ``param`` and the choices otherwise
    (``why`` replaces the list of choices, for a family that models fewer of them)."""
    for a in allowed:
        if value == a:
            return a
    hint = why or "use " + (", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 else allowed[0])
    raise ParamError(f"unknown {{{param}}} {value!r}; {hint}", param)


def parse_ckpt(ckpt: str) -> tuple[CkptMode, int]:
    """``none``, ``block``, ``attn``, ``mlp`` or ``every-N`` (N >= 1; every-1 is block) -> (mode, N); a
    :class:`ParamError` naming ``ckpt`` otherwise. The trainer and the estimator read a mode here alike."""
    t = ckpt.strip().lower()
    for mode in ("none", "block", "attn", "mlp"):
        if t == mode:
            return mode, 1
    if t.startswith("every-") and t[6:].isdigit() and int(t[6:]) >= 1:
        n = int(t[6:])
        return ("block", 1) if n == 1 else ("every", n)
    raise ParamError(f"unknown {{ckpt}} {ckpt!r}; use none, block, every-N (e.g. every-2), attn or mlp", "ckpt")
