"""A LightningModule as Lightning's docs write one: training_step and validation_step that self.log their
losses, Adam with a per-step StepLR, accumulation 2, validation every 3 batches. A Callback prints what
Lightning logged (its callback_metrics) at full precision; training_step prints each batch's loss.

    python lightning_module.py ROOT
"""

import sys

import lightning.pytorch as L
import torch
from torch import nn


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        print(f"batch {batch_idx} global_step {self.global_step} loss {loss.item()!r}", flush=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.8),
                                                   "interval": "step"}}


class Print(L.Callback):
    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        print(f"step {trainer.global_step + 1} lr {optimizer.param_groups[0]['lr']!r}", flush=True)

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            print(f"val global_step {trainer.global_step} val_loss {float(trainer.callback_metrics['val_loss'])!r}")


def loader(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(128, 16, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1] * 3), batch_size=8)


torch.manual_seed(0)
trainer = L.Trainer(default_root_dir=sys.argv[1], accelerator="cpu", devices=1, max_steps=6, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    accumulate_grad_batches=2, val_check_interval=6, limit_val_batches=2, num_sanity_val_steps=0,
                    callbacks=[Print()])
trainer.fit(Model(), loader(1), loader(2))
