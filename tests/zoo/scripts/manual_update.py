"""A training loop without torch.optim, as PyTorch's own examples write it (word_language_model's
``p.data.add_(p.grad, alpha=-lr)``; the "Learning PyTorch with Examples" tutorial's
``param -= lr * param.grad`` under ``no_grad``), then an evaluation. Prints its numbers in full.

    python manual_update.py --steps 6 --style data|no_grad [--accum 2]
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--style", choices=("data", "no_grad"), default="data")
p.add_argument("--accum", type=int, default=1)
args = p.parse_args()

torch.manual_seed(0)
vocab, ctx, batch, lr = 50, 8, 16, 0.5
model = nn.Sequential(nn.Embedding(vocab, 16), nn.Flatten(), nn.Linear(16 * ctx, 64), nn.Tanh(), nn.Linear(64, vocab))
criterion = nn.CrossEntropyLoss()
g = torch.Generator().manual_seed(1)


def get_batch():
    x = torch.randint(0, vocab, (batch, ctx), generator=g)
    return x, x.sum(1) % vocab


for step in range(args.steps):
    if args.style == "data":
        model.zero_grad()
    total = 0.0
    for _ in range(args.accum):
        x, y = get_batch()
        loss = criterion(model(x), y) / args.accum
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    if args.style == "data":
        for p_ in model.parameters():
            p_.data.add_(p_.grad, alpha=-lr)
    else:
        with torch.no_grad():
            for p_ in model.parameters():
                p_ -= lr * p_.grad
        model.zero_grad()
    print(f"step {step} loss {total!r} samples {batch * args.accum}", flush=True)

model.eval()
with torch.no_grad():
    x, y = get_batch()
    print(f"eval loss {criterion(model(x), y).item()!r}")
