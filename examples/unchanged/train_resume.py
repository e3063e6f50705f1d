"""A PyTorch script that checkpoints and resumes, as preemptible jobs do; it knows nothing about gpudash.

    gpudash run --run-dir runs/pre -- python examples/unchanged/train_resume.py --ckpt ckpts --stop-after 129
    gpudash run --run-dir runs/pre -- python examples/unchanged/train_resume.py --ckpt ckpts --resume

An MLP regression, AdamW, a checkpoint (model and optimizer) every ``--every`` steps. ``--stop-after N``
sends the process SIGTERM once step N is done (a preemption: exit code 143); ``--resume`` loads the newest
checkpoint and goes on from its step. Each step prints ``step N loss X`` (X as Python's ``repr``).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=50, help="save a checkpoint every this many steps")
    p.add_argument("--ckpt", type=Path, required=True, help="the checkpoint folder")
    p.add_argument("--resume", action="store_true", help="go on from the newest checkpoint")
    p.add_argument("--stop-after", type=int, default=-1, help="SIGTERM this process after this step")
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = 0
    saved = sorted(args.ckpt.glob("step-*.pt"), key=lambda f: int(f.stem.split("-")[1]))
    if args.resume and saved:
        state = torch.load(saved[-1])
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
    gen = torch.Generator().manual_seed(1)
    data = torch.randn(args.steps, 32, 8, generator=gen)
    target = data.sum(-1, keepdim=True).sin()
    for step in range(start, args.steps):
        loss = nn.functional.mse_loss(model(data[step]), target[step])
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}", flush=True)
        if (step + 1) % args.every == 0:
            args.ckpt.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step + 1},
                       args.ckpt / f"step-{step + 1}.pt")
        if step == args.stop_after:
            os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    main()
