"""A small GPT (nanoGPT-shaped): pre-norm blocks, SDPA attention, tied embeddings.

Presets go from ``tiny`` (trains on a laptop CPU in seconds) to GPT-2 124M/350M
and a LLaMA-7B-shaped config (SwiGLU MLP, untied head, 32 layers of 4096) used
by the estimator and on GPUs. Each block can checkpoint itself, its attention
or its MLP (see :mod:`gpudash.trainer.checkpointing`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpudash.memmodel.shapes import PRESETS, GPTConfig, preset

__all__ = ["GPT", "PRESETS", "GPTConfig", "preset"]


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
