"""A small language model trained on length-bucketed batches, shortest bucket first (sorting by length to
cut padding, as many data loaders do): the sequence, and with it the memory a step needs, grows as the run
goes, and nothing is kept between steps. Prints the tokens of each bucket it starts.

    python bucketed_lm.py --steps 300
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=300)
p.add_argument("--batch", type=int, default=16)
args = p.parse_args()

torch.manual_seed(0)
vocab, width = 256, 128
model = nn.Sequential(nn.Embedding(vocab, width), nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, vocab))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
buckets = [32 * (i + 1) for i in range(12)]  # 32 .. 384 tokens, one bucket after the other
per_bucket = max(1, args.steps // len(buckets))
losses = []
for step in range(args.steps):
    seq = buckets[min(step // per_bucket, len(buckets) - 1)]
    if step % per_bucket == 0:
        print(f"step {step} bucket {seq} tokens {args.batch * seq}", flush=True)
    x = torch.randint(0, vocab, (args.batch, seq + 1))
    logits = model(x[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    losses.append(loss.item())
print(f"final loss {losses[-1]:.4f}", flush=True)
