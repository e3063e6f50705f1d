"""Training loops whose autograd graphs outlive a plain ``backward()``, as scripts write them:

- ``retain``: ``loss.backward(retain_graph=True)`` every step (the graph is dropped with the next step's loss);
- ``penalty``: a WGAN-GP gradient penalty, ``torch.autograd.grad(critic(x).sum(), x, create_graph=True)``;
- ``double``: a gradient-norm regularizer over the parameters (double backward, ``create_graph=True``);
- ``checkpoint`` / ``checkpoint-reentrant``: ``torch.utils.checkpoint`` around the middle block;
- ``bf16``: CPU autocast to bfloat16;
- ``compile``: ``torch.compile`` (``--backend``, default ``aot_eager``).

Prints every step's loss (``repr``) and, at the end, how malloc's in-use bytes (glibc ``mallinfo2``, as
gpudash's host sampler reads them) grew per step over the late half of the run: the least-squares slope of one
reading a step. Bare, these loops keep nothing from one step to the next.

    python graph_loops.py --mode retain --steps 6000
"""

import argparse
import ctypes

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def malloc_used():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return lambda: 0
    fn.restype = _MallInfo2

    def used():
        m = fn()
        return int(m.uordblks + m.hblkhd)
    return used


def slope(ys):
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, sum(ys) / n
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))


class Net(nn.Module):
    def __init__(self, mode, width):
        super().__init__()
        self.mode = mode
        self.inp = nn.Linear(32, width)
        self.mid = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.out = nn.Linear(width, 1)

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        if self.mode == "checkpoint":
            h = checkpoint(self.mid, h, use_reentrant=False)
        elif self.mode == "checkpoint-reentrant":
            h = checkpoint(self.mid, h, use_reentrant=True)
        else:
            h = self.mid(h)
        return self.out(h)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="retain", choices=("retain", "penalty", "double", "checkpoint",
                                                         "checkpoint-reentrant", "bf16", "compile"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--backend", default="aot_eager")
    ap.add_argument("--device", default="cpu", help="cpu or cuda: on cuda the allocator's bytes are read too")
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device(args.device)
    model = Net(args.mode, args.width).to(dev)
    run = torch.compile(model, backend=args.backend) if args.mode == "compile" else model
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    used = malloc_used()
    late, late_cuda = [], []
    for step in range(args.steps):
        x = torch.randn(args.batch, 32, generator=g).to(dev)
        y = torch.randn(args.batch, 1, generator=g).to(dev)
        opt.zero_grad()
        if args.mode == "retain":
            loss = F.mse_loss(run(x), y)
            loss.backward(retain_graph=True)
        elif args.mode == "penalty":
            x.requires_grad_(True)
            out = run(x)
            grad_x, = torch.autograd.grad(out.sum(), x, create_graph=True)
            loss = F.mse_loss(out, y) + 0.1 * ((grad_x.norm(2, dim=1) - 1) ** 2).mean()
            loss.backward()
        elif args.mode == "double":
            fit = F.mse_loss(run(x), y)
            grads = torch.autograd.grad(fit, list(model.parameters()), create_graph=True)
            loss = fit + 1e-3 * sum(gr.pow(2).sum() for gr in grads)
            loss.backward()
        elif args.mode == "bf16":
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = F.mse_loss(run(x).float(), y)
            loss.backward()
        else:
            loss = F.mse_loss(run(x), y)
            loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item()!r}")
        if step >= args.steps // 2:
            late.append(used())
            if dev.type == "cuda":
                late_cuda.append(torch.cuda.memory_allocated(dev))
    print(f"malloc growth late half B/step {slope(late):.1f}", flush=True)
    if dev.type == "cuda":
        print(f"cuda growth late half B/step {slope(late_cuda):.1f}", flush=True)


if __name__ == "__main__":
    main()
