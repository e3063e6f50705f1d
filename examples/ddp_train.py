"""Data-parallel training under gpudash with torchrun: every rank records into one run.

    torchrun --nproc-per-node 2 examples/ddp_train.py runs/ddp
    gpudash serve runs          # ranks side by side, with the straggler indicator

Runs on CPU (gloo) or GPUs (nccl, one per rank). ``--straggle-rank 1`` makes
rank 1 slow at loading data, to see what a straggler looks like.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from gpudash import Monitor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--straggle-rank", type=int, default=-1, help="this rank sleeps in its data phase")
    p.add_argument("--straggle-s", type=float, default=0.02)
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).to(device)
    ddp = DDP(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    g = torch.Generator(device="cpu").manual_seed(1000 + rank)  # each rank its own shard

    with Monitor(args.run_dir, config=vars(args)) as mon:  # rank and world size come from torchrun's env
        mon.watch(model, opt)
        for _ in range(args.steps):
            with mon.step(samples=args.batch_size):
                with mon.phase("data"):
                    x = torch.randn(args.batch_size, 64, generator=g).to(device, non_blocking=True)
                    y = x[:, :10].argmax(1)
                    if rank == args.straggle_rank:
                        time.sleep(args.straggle_s)
                with mon.phase("forward"):
                    loss = torch.nn.functional.cross_entropy(ddp(x), y)
                with mon.phase("backward"):
                    loss.backward()  # DDP all-reduces gradients here: fast ranks wait for slow ones
                with mon.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                mon.log(loss=loss)
    if rank == 0:
        print(f"recorded {args.steps} steps x {world} ranks into {args.run_dir}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
