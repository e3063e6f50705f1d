"""Hugging Face ``config.json`` -> the architecture facts the estimator needs. Pure Python, no torch.

Families: Llama, Mistral, Qwen2 (RMSNorm, rotary, grouped-query attention,
SwiGLU), Gemma (RMSNorm with ``1 + weight``, GeGLU, embeddings scaled by
sqrt(hidden), explicit ``head_dim``, tied head), Phi (LayerNorm, attention and
MLP in parallel on one norm, partial rotary, GELU-new MLP ``fc1``/``fc2``) and
GPT-2 (learned positions, fused ``c_attn``, GELU-new, dropout, tied head).

``LORA_DEFAULT_TARGETS`` is PEFT's ``TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING``
(peft/utils/constants.py, peft 0.21) for these model types.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpudash.memmodel.plan import ParamError

__all__ = ["CONFIG_DIR", "FAMILIES", "LORA_DEFAULT_TARGETS", "HFArch", "Linear", "hf_preset", "load_config"]

CONFIG_DIR = Path(__file__).with_name("configs")
"""Shipped config.json files (values copied from the public model configs)."""

LORA_DEFAULT_TARGETS: dict[str, tuple[str, ...]] = {
    "llama": ("q_proj", "v_proj"), "mistral": ("q_proj", "v_proj"), "qwen2": ("q_proj", "v_proj"),
    "gemma": ("q_proj", "v_proj"), "phi": ("q_proj", "v_proj", "fc1", "fc2"),
    "gpt2": ("c_attn",),
}
FAMILIES = ("llama", "mistral", "qwen2", "gemma", "phi", "gpt2")


@dataclass(frozen=True, slots=True)
class Linear:
    """One matmul weight of a decoder layer, by the module name PEFT targets."""

    name: str
    d_in: int
    d_out: int
    bias: bool


@dataclass(frozen=True, slots=True)
class HFArch:
    family: str
    """``model_type`` of the config (llama, mistral, qwen2, gemma, phi, gpt2)."""
    vocab_size: int
    hidden: int
    n_layer: int
    n_head: int
    n_kv_head: int
    head_dim: int
    intermediate: int
    mlp: str
    """swiglu (silu gate), geglu (tanh-GELU gate) or gelu_new (two-matrix MLP)."""
    norm: str
    """rms or layer."""
    tied: bool
    qkv_bias: bool = False
    mlp_bias: bool = False
    o_bias: bool = False
    positions: int = 0
    """Learned position embeddings (GPT-2), 0 for rotary."""
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0
    embd_dropout: float = 0.0
    name: str = ""
    partial_rotary: float = 1.0
    """Share of each head's dimensions that rotary rotates (phi: 0.4)."""

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary)

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden", "n_layer", "n_head", "n_kv_head", "head_dim", "intermediate"):
            if getattr(self, f) < 1:
                raise ValueError(f"config field {f} must be >= 1, got {getattr(self, f)}")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"num_attention_heads {self.n_head} is not a multiple of num_key_value_heads "
                             f"{self.n_kv_head}")

    # ---- structure -----------------------------------------------------------------------
    def linears(self) -> list[Linear]:
        """The matmul weights of one decoder layer, in the order they run."""
        h, q, kv, m = self.hidden, self.n_head * self.head_dim, self.n_kv_head * self.head_dim, self.intermediate
        if self.family == "gpt2":
            return [Linear("c_attn", h, 3 * h, True), Linear("attn.c_proj", h, h, True),
                    Linear("c_fc", h, m, True), Linear("mlp.c_proj", m, h, True)]
        attn = [Linear("q_proj", h, q, self.qkv_bias), Linear("k_proj", h, kv, self.qkv_bias),
                Linear("v_proj", h, kv, self.qkv_bias),
                Linear("dense" if self.family == "phi" else "o_proj", q, h, self.o_bias)]
        if self.mlp == "gelu_new":
            return attn + [Linear("fc1", h, m, True), Linear("fc2", m, h, True)]
        return attn + [Linear("gate_proj", h, m, self.mlp_bias), Linear("up_proj", h, m, self.mlp_bias),
                       Linear("down_proj", m, h, self.mlp_bias)]

    def norm_params(self) -> int:
        """Elements of one norm's parameters (LayerNorm has a bias)."""
        return self.hidden * (2 if self.norm == "layer" else 1)

    def norms_per_layer(self) -> int:
        return 1 if self.family == "phi" else 2

    def param_tensors(self) -> list[tuple[str, int, int]]:
        """Every parameter tensor as (kind, rows, cols); kind is ``linear:<name>``, ``embed``,
        ``pos``, ``head``, ``norm`` or ``bias``. 1-D tensors have cols 0."""
        out: list[tuple[str, int, int]] = [("embed", self.vocab_size, self.hidden)]
        if self.positions:
            out.append(("pos", self.positions, self.hidden))
        for _ in range(self.n_layer):
            for lin in self.linears():
                out.append((f"linear:{lin.name}", lin.d_out, lin.d_in))
                if lin.bias:
                    out.append(("bias", lin.d_out, 0))
            for _ in range(self.norms_per_layer()):
                out += [("norm", self.hidden, 0)] * (2 if self.norm == "layer" else 1)
        out += [("norm", self.hidden, 0)] * (2 if self.norm == "layer" else 1)
        if not self.tied:
            out.append(("head", self.vocab_size, self.hidden))
            if self.family == "phi":
                out.append(("bias", self.vocab_size, 0))
        return out

    def n_params(self) -> int:
        return sum(r * (c or 1) for _, r, c in self.param_tensors())

    def resolve_targets(self, targets: tuple[str, ...] | None) -> tuple[str, ...]:
        """PEFT's module names for LoRA (its defaults when None); unknown names are an error."""
        names = tuple(lin.name for lin in self.linears())
        if not targets:
            return LORA_DEFAULT_TARGETS[self.family]
        if targets == ("all-linear",):
            return names
        short = {n.split(".")[-1] for n in names}  # PEFT matches a name's last part: c_proj is both
        bad = [t for t in targets if t not in names and t not in short]
        if bad:
            raise ParamError(f"{{lora_targets}} {','.join(bad)}: no such module in a {self.family} layer; "
                             f"choose from {','.join(names)} (or all-linear)", "lora_targets")
        return tuple(dict.fromkeys(targets))

    def scaled(self, **fields: Any) -> HFArch:
        return replace(self, **fields)

    # ---- reading config.json -------------------------------------------------------------
    @classmethod
    def from_dict(cls, cfg: dict[str, Any], name: str = "") -> HFArch:
        fam = str(cfg.get("model_type") or "")
        if fam not in FAMILIES:
            raise ValueError(f"model_type {fam!r} is not supported; gpudash estimate knows "
                             f"{', '.join(FAMILIES)}")

        def need(*keys: str) -> int:
            for k in keys:
                if isinstance(cfg.get(k), int):
                    return int(cfg[k])
            raise ValueError(f"config.json has no integer {' or '.join(keys)}")

        if fam == "gpt2":
            h = need("n_embd", "hidden_size")
            nh = need("n_head", "num_attention_heads")
            m = cfg.get("n_inner") or 4 * h
            return cls("gpt2", need("vocab_size"), h, need("n_layer", "num_hidden_layers"), nh, nh, h // nh, int(m),
                       "gelu_new", "layer", bool(cfg.get("tie_word_embeddings", True)), True, True, True,
                       need("n_positions", "max_position_embeddings"), float(cfg.get("attn_pdrop", 0.1)),
                       float(cfg.get("resid_pdrop", 0.1)), float(cfg.get("embd_pdrop", 0.1)), name)
        h = need("hidden_size")
        nh = need("num_attention_heads")
        nkv = int(cfg.get("num_key_value_heads") or nh)
        hd = int(cfg.get("head_dim") or h // nh)
        m = need("intermediate_size")
        if fam == "phi":
            return cls("phi", need("vocab_size"), h, need("num_hidden_layers"), nh, nkv, hd, m, "gelu_new", "layer",
                       bool(cfg.get("tie_word_embeddings", False)), True, True, True, 0,
                       float(cfg.get("attention_dropout", 0.0)), float(cfg.get("resid_pdrop", 0.0)),
                       float(cfg.get("embd_pdrop", 0.0)), name, float(cfg.get("partial_rotary_factor", 0.5)))
        act = str(cfg.get("hidden_act") or cfg.get("hidden_activation") or "silu")
        gemma = fam == "gemma"
        return cls(fam, need("vocab_size"), h, need("num_hidden_layers"), nh, nkv, hd, m,
                   "geglu" if "gelu" in act else "swiglu", "rms", bool(cfg.get("tie_word_embeddings", gemma)),
                   bool(cfg.get("attention_bias", fam == "qwen2")), bool(cfg.get("mlp_bias", False)),
                   bool(cfg.get("attention_bias", False)) and fam != "qwen2", 0,
                   float(cfg.get("attention_dropout", 0.0)), 0.0, 0.0, name)


def load_config(path: str | Path) -> HFArch:
    """Read a local config.json (a file, or a model folder holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise ParamError(f"{{path}} {path}: no such file; pass a Hugging Face config.json", "path") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ParamError(f"{{path}} {path}: not a readable JSON file ({exc})", "path") from None
    if not isinstance(cfg, dict):
        raise ParamError(f"{{path}} {path}: expected a JSON object, as config.json is", "path")
    return HFArch.from_dict(cfg, name=p.parent.name if p.name == "config.json" else p.stem)


def hf_preset(name: str) -> HFArch | None:
    """A shipped config by name (``llama-2-7b``), or None."""
    p = CONFIG_DIR / f"{name}.json"
    return load_config(p) if p.is_file() else None
