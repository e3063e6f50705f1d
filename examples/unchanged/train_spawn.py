"""Data-parallel training started with ``torch.multiprocessing.spawn`` (no launcher,
no RANK in the environment), knowing nothing about gpudash.

    gpudash run -- python examples/unchanged/train_spawn.py --steps 20
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(rank: int, world: int, steps: int) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = DDP(nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--world", type=int, default=2)
    args = p.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.multiprocessing.spawn(worker, args=(args.world, args.steps), nprocs=args.world)


if __name__ == "__main__":
    main()
