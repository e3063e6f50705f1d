"""A Lightning script that knows nothing about gpudash.

    gpudash run -- python examples/unchanged/train_lightning.py --steps 50
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning.pytorch as L
import torch
from torch import nn


class Regressor(L.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.net = build_model()

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--root", default="out/lightning-unchanged")
    args = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1] * 3), batch_size=8)
    trainer = L.Trainer(default_root_dir=args.root, accelerator="cpu", devices=1, max_steps=args.steps,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Regressor(), loader)
    print(f"trained {trainer.global_step} steps")


if __name__ == "__main__":
    main()
