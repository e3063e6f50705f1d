"""A small GPT (nanoGPT-shaped): pre-norm blocks, SDPA attention, tied embeddings.

Presets go from ``tiny`` (trains on a laptop CPU in seconds) to GPT-2 124M/350M
and a LLaMA-7B-shaped config (SwiGLU MLP, untied head, 32 layers of 4096) used
by the estimator and on GPUs. Each block can checkpoint itself, its attention
or its MLP (see :mod:`gpudash.trainer.checkpointing`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["GPT", "PRESETS", "GPTConfig", "preset"]


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


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        # padding sits at the end of each row, so the causal mask alone keeps it out of real tokens
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.gated = cfg.mlp == "swiglu"
        self.c_fc = nn.Linear(cfg.n_embd, cfg.hidden, bias=False)
        self.c_gate = nn.Linear(cfg.n_embd, cfg.hidden, bias=False) if self.gated else None
        self.c_proj = nn.Linear(cfg.hidden, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.c_gate is not None:
            return self.c_proj(F.silu(self.c_gate(x)) * self.c_fc(x))
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """Pre-norm transformer block. ``ckpt_block`` / ``ckpt_attn`` / ``ckpt_mlp``
    make it recompute that part in backward instead of keeping its activations."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=False)
        self.mlp = MLP(cfg)
        self.ckpt_block = False
        self.ckpt_attn = False
        self.ckpt_mlp = False

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(self.ln_1(x))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_2(x))

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        grad = torch.is_grad_enabled()
        a = checkpoint(self._attn, x, use_reentrant=False) if grad and self.ckpt_attn else self._attn(x)
        x = x + a
        m = checkpoint(self._mlp, x, use_reentrant=False) if grad and self.ckpt_mlp else self._mlp(x)
        return x + m

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ckpt_block and torch.is_grad_enabled():
            out: torch.Tensor = checkpoint(self._body, x, use_reentrant=False)
            return out
        return self._body(x)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=False)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # GPT-2: scale residual projections by depth
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) without targets; with targets (-1 = padding), the
        *sum* of token losses in fp32, so callers can normalise over a whole step."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, C)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(B * T, -1), targets.reshape(B * T),
                               ignore_index=-1, reduction="sum")
