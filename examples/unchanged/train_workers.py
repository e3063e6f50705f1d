"""A plain PyTorch script whose DataLoader workers each end up holding a copy of an in-memory dataset.

    gpudash run -- python examples/unchanged/train_workers.py --workers 4 --dataset-mb 200
    gpudash info runs/<the run>            # "host memory  peak ... main ..., worker 0 ..., worker 1 ..."

The dataset is a tokenized corpus held as a Python list of byte strings (as scripts often hold one). The
workers are forked (Linux's default), so at first they share the main process's pages; but reading an item
touches its reference count, which writes the page it lives on, and copy-on-write then gives each worker its
own copy of every page it read. Here each item reads the whole corpus once, so each worker soon holds all of it:
``--workers`` copies on top of the main process's one. Knows nothing about gpudash.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Corpus(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, nbytes: int, length: int) -> None:
        self.docs = [bytes([i % 251]) * 4096 for i in range(nbytes // 4096)]
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        total = sum(len(d) for d in self.docs)  # every document read: its page becomes this worker's own
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, generator=g)
        return x, torch.tensor(total % 10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--dataset-mb", type=int, default=200)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()

    torch.manual_seed(0)
    data = Corpus(args.dataset_mb * 10**6, length=16 * args.steps)
    loader = DataLoader(data, batch_size=16, num_workers=args.workers, persistent_workers=args.workers > 0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    for step, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
