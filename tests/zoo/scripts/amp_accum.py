"""Mixed precision the torch.amp way: autocast, a GradScaler, gradient accumulation with the loss divided
by the accumulation count, unscale + clip before the step, a cosine schedule (the recipe of PyTorch's
AMP guide). Prints each step's loss (the sum of the micro-batch losses it backpropagated), lr and scale.

    python amp_accum.py --steps 6 --accum 3
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--accum", type=int, default=3)
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(24, 96), nn.GELU(), nn.Linear(96, 96), nn.GELU(), nn.Linear(96, 10))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
criterion = nn.CrossEntropyLoss()
g = torch.Generator().manual_seed(2)

for step in range(args.steps):
    total = 0.0
    for _ in range(args.accum):
        x = torch.randn(12, 24, generator=g)
        y = torch.randint(0, 10, (12,), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = criterion(model(x), y) / args.accum
        scaler.scale(loss).backward()
        total += loss.item()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    lr = opt.param_groups[0]["lr"]
    scaler.step(opt)
    scaler.update()
    sched.step()
    opt.zero_grad(set_to_none=True)
    print(f"step {step} loss {total!r} lr {lr!r} scale {scaler.get_scale()!r}", flush=True)
