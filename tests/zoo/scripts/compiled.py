"""A ``torch.compile``d model trained with Adam (the PyTorch 2 tutorial's loop). Prints each step's loss.

    python compiled.py --steps 5 [--backend inductor]
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
p.add_argument("--backend", default="inductor")
args = p.parse_args()

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
compiled = torch.compile(model, backend=args.backend)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(3)
for step in range(args.steps):
    x = torch.randn(8, 16, generator=g)
    y = torch.randn(8, 4, generator=g)
    loss = nn.functional.mse_loss(compiled(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step} loss {loss.item()!r}", flush=True)
