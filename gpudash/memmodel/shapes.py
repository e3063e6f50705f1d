"""Model shapes: the GPT config dataclass and its presets (no torch needed here,
so the estimator and ``gpudash estimate`` run anywhere)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from gpudash.options import parse_fields

__all__ = ["PRESETS", "GPTConfig", "parse_fields", "parse_overrides", "preset"]


@dataclass(kw_only=True, slots=True)
class GPTConfig:
    """Shape of the model; the defaults are the ``tiny`` preset."""

    vocab_size: int = 256
    """Tokens; 256 is enough for the byte-level tokenizer."""
    block_size: int = 64
    """Longest sequence the position embedding covers."""
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    mlp: str = "gelu"
    """``gelu`` (GPT-2: 4h hidden) or ``swiglu`` (LLaMA: gated, ``mlp_hidden`` wide)."""
    mlp_hidden: int = 0
    """MLP width; 0 means 4 x n_embd."""
    tie_embeddings: bool = True
    """Share the token embedding with the output head (GPT-2); LLaMA unties them."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.mlp not in ("gelu", "swiglu"):
            raise ValueError(f"mlp must be 'gelu' or 'swiglu', not {self.mlp!r}")
        if self.mlp_hidden < 0:
            raise ValueError("mlp_hidden must be >= 0")

    @property
    def hidden(self) -> int:
        return self.mlp_hidden or 4 * self.n_embd

    def n_params(self) -> int:
        """Parameter count, computed from the shape (matches ``GPT.num_params``)."""
        h, m, v = self.n_embd, self.hidden, self.vocab_size
        mlp = (3 if self.mlp == "swiglu" else 2) * h * m
        block = 2 * h + 3 * h * h + h * h + mlp  # two LayerNorm weights, qkv, proj, mlp
        head = 0 if self.tie_embeddings else v * h
        return v * h + self.block_size * h + self.n_layer * block + h + head

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(),
    "small": GPTConfig(block_size=256, n_layer=6, n_head=6, n_embd=384),
    "gpt2-124m": GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768),
    "gpt2-350m": GPTConfig(vocab_size=50304, block_size=1024, n_layer=24, n_head=16, n_embd=1024),
    "llama-7b": GPTConfig(vocab_size=32000, block_size=4096, n_layer=32, n_head=32, n_embd=4096,
                          mlp="swiglu", mlp_hidden=11008, tie_embeddings=False),
}


def preset(name: str, **overrides: Any) -> GPTConfig:
    """A copy of a preset, with fields replaced (``preset("tiny", n_layer=2)``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["n_layer=48", "mlp=swiglu"]`` -> GPTConfig field overrides; ValueError names the fields."""
    return parse_fields(items, GPTConfig, "--model")
