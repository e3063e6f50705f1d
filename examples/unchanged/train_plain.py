"""A plain PyTorch training script that knows nothing about gpudash.

    gpudash run -- python examples/unchanged/train_plain.py --steps 200
    gpudash run --serve -- python examples/unchanged/train_plain.py

An MLP classifier, AdamW, a cross-entropy loss module, optional gradient
accumulation, an evaluation pass at the end. ``--exit-code`` and ``--fail-at``
make it end the way scripts do when something goes wrong.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch import nn


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--exit-code", type=int, default=0, help="exit with this code after training")
    p.add_argument("--fail-at", type=int, default=-1, help="raise an error at this step")
    args = p.parse_args()

    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    criterion = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        if step == args.fail_at:
            raise RuntimeError(f"deliberate failure at step {step}")
        total = 0.0
        for _ in range(args.accum):
            x = torch.randn(args.batch_size, 32, generator=g)
            y = torch.randint(0, 10, (args.batch_size,), generator=g)
            loss = criterion(model(x), y) / args.accum  # the mean over the step's micro-batches
            loss.backward()
            total += loss.item()
        opt.step()
        sched.step()
        opt.zero_grad()
        print(f"step {step} loss {total:.6f}", flush=True)
    model.eval()
    with torch.no_grad():
        x = torch.randn(64, 32, generator=g)
        acc = (model(x).argmax(1) == 0).float().mean().item()
    print(f"eval {acc:.4f}")
    print("stderr line from the script", file=sys.stderr)
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
