"""Random-init scaled-down Hugging Face models of each family, and what autograd saves for them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

TINY: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 176,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 128},
    "mistral": {"model_type": "mistral", "vocab_size": 300, "hidden_size": 96, "intermediate_size": 160,
                "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2,
                "max_position_embeddings": 128},
    "qwen2": {"model_type": "qwen2", "vocab_size": 352, "hidden_size": 64, "intermediate_size": 192,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
              "max_position_embeddings": 128, "tie_word_embeddings": True},
    "gemma": {"model_type": "gemma", "vocab_size": 320, "hidden_size": 48, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 32,
              "max_position_embeddings": 128, "hidden_activation": "gelu_pytorch_tanh"},
    "phi": {"model_type": "phi", "vocab_size": 320, "hidden_size": 64, "intermediate_size": 256,
            "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 128,
            "partial_rotary_factor": 0.4, "resid_pdrop": 0.1},
    "gpt2": {"model_type": "gpt2", "vocab_size": 320, "n_embd": 64, "n_layer": 2, "n_head": 4,
             "n_positions": 128, "bos_token_id": 0, "eos_token_id": 0},
}


def build(cfg: dict[str, Any], attn: str = "sdpa", lora: tuple[str, ...] | None = None, r: int = 8,
          lora_dropout: float = 0.0) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    conf = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForCausalLM.from_config(conf, attn_implementation=attn)
    if lora is not None:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(r=r, target_modules=list(lora) or None,
                                                           lora_dropout=lora_dropout))
    model.train()
    return model


@contextlib.contextmanager
def saved_storages(model: torch.nn.Module) -> Iterator[dict[int, int]]:
    """Inside: every distinct non-parameter storage autograd saves, by address -> bytes (what the Monitor counts)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        st = x.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        yield seen


def measure(model: torch.nn.Module, b: int, t: int, vocab: int, autocast: bool = False) -> int:
    """Bytes of every distinct non-parameter storage autograd saves in one forward."""
    torch.manual_seed(1)
    ids = torch.randint(0, vocab, (b, t))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)
    with saved_storages(model) as seen, ctx:
        out = model(input_ids=ids, labels=ids)
    del out
    return sum(seen.values())
