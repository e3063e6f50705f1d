"""A PyTorch Lightning run recorded by gpudash: two added lines.

    python examples/lightning_example.py runs/lightning --steps 100
    gpudash serve runs

A tiny character model (embedding, GRU, linear head) on the bytes of
gpudash's own source. The two gpudash lines are marked.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch

import gpudash
from gpudash.integrations.lightning import GpudashCallback  # gpudash line 1 of 2


class CharModel(L.LightningModule):  # type: ignore[misc]
    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(256, dim)
        self.rnn = torch.nn.GRU(dim, dim, batch_first=True)
        self.head = torch.nn.Linear(dim, 256)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (ids,) = batch
        x, y = ids[:, :-1], ids[:, 1:]
        out, _ = self.rnn(self.emb(x))  # (B, T, dim)
        return torch.nn.functional.cross_entropy(self.head(out).flatten(0, 1), y.flatten())

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", nargs="?", default="runs/lightning")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--ctx", type=int, default=64)
    args = p.parse_args(argv)

    source = b"".join(f.read_bytes() for f in sorted(Path(gpudash.__file__).parent.rglob("*.py")))
    ids = torch.tensor(list(source), dtype=torch.long)
    ids = ids[: len(ids) // args.ctx * args.ctx].view(-1, args.ctx)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=args.batch_size,
                                         shuffle=True)
    trainer = L.Trainer(max_steps=args.steps, logger=False, enable_checkpointing=False,
                        default_root_dir=str(Path(args.run_dir).parent),
                        callbacks=[GpudashCallback(args.run_dir)])  # gpudash line 2 of 2
    trainer.fit(CharModel(), loader)
    print(f"recorded into {args.run_dir}: gpudash info {args.run_dir}")


if __name__ == "__main__":
    main()
