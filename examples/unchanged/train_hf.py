"""A Hugging Face Trainer script that knows nothing about gpudash.

    gpudash run -- python examples/unchanged/train_hf.py --steps 50

A tiny Llama built from its config (nothing is downloaded), random tokens.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int, ctx: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, ctx), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build_model() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--output-dir", default="out/hf-unchanged")
    args = p.parse_args()
    targs = TrainingArguments(output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=4,
                              learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True,
                              disable_tqdm=True, logging_steps=1)
    trainer = Trainer(model=build_model(), args=targs, train_dataset=RandomTokens(64, 16, 128))
    trainer.train()
    print(f"trained {trainer.state.global_step} steps")


if __name__ == "__main__":
    main()
