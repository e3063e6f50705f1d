"""A data-parallel PyTorch script that knows nothing about gpudash.

    gpudash run -- torchrun --nproc-per-node 2 examples/unchanged/train_ddp.py --steps 50

CPU (gloo) or GPUs (nccl, one per rank); every rank records into the same run.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(build_model().to(device), device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 64, generator=g).to(device)
        loss = nn.functional.cross_entropy(model(x), x[:, :10].argmax(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
