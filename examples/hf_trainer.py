"""A Hugging Face ``Trainer`` run recorded by gpudash: two added lines.

    python examples/hf_trainer.py runs/hf-llama --steps 50
    torchrun --nproc-per-node 2 examples/hf_trainer.py runs/hf-ddp   # every rank records
    gpudash serve runs

A small Llama is built from its config (nothing is downloaded) and trained on
the bytes of gpudash's own source. The two gpudash lines are marked.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import gpudash
from gpudash.integrations.hf import GpudashCallback  # gpudash line 1 of 2


class ByteChunks(torch.utils.data.Dataset):  # type: ignore[misc]
    """Fixed-length windows of bytes: input_ids and labels (the model shifts them)."""

    def __init__(self, data: bytes, ctx: int) -> None:
        ids = torch.tensor(list(data), dtype=torch.long)
        self.chunks = ids[: len(ids) // ctx * ctx].view(-1, ctx)

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.chunks[i], "labels": self.chunks[i]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", nargs="?", default="runs/hf-llama")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ctx", type=int, default=128)
    args = p.parse_args(argv)

    source = b"".join(f.read_bytes() for f in sorted(Path(gpudash.__file__).parent.rglob("*.py")))
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=args.ctx)
    model = LlamaForCausalLM(config)
    targs = TrainingArguments(
        output_dir=str(Path(args.run_dir).parent / "hf-output"), max_steps=args.steps,
        per_device_train_batch_size=args.batch_size, learning_rate=1e-3, warmup_steps=min(10, args.steps // 5),
        logging_steps=5, save_strategy="no", report_to=[], dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(),  # under torchrun on CPU: DDP over gloo
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    trainer = Trainer(model=model, args=targs, train_dataset=ByteChunks(source, args.ctx),
                      callbacks=[GpudashCallback(args.run_dir)])  # gpudash line 2 of 2
    trainer.train()
    print(f"recorded into {args.run_dir}: gpudash info {args.run_dir}")


if __name__ == "__main__":
    main()
