"""A plain PyTorch loop with a quiet leak: after each training step it computes a validation loss on a held-out
batch without ``torch.no_grad()`` and keeps the tensor in a list to average later. Each kept validation loss
holds its graph and every activation its forward saved for a backward that never comes. ``--keep item`` is the
fixed loop (``val_loss.item()``). It prints the bytes one kept validation loss holds (its graph's saved tensors,
parameters left out), found by walking the graph, and the step its first one was kept at, so a test can hold a
monitor's rate and its time to notice to them."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def saved_bytes(loss: torch.Tensor, params: set[int]) -> int:
    """Bytes of the distinct storages the graph of ``loss`` saved for backward, parameters left out."""
    seen: dict[int, int] = {}
    todo, visited = [loss.grad_fn], set()
    while todo:
        fn = todo.pop()
        if fn is None or id(fn) in visited:
            continue
        visited.add(id(fn))
        for name in dir(fn):
            if name.startswith("_saved_"):
                t = getattr(fn, name, None)
                if isinstance(t, torch.Tensor) and t.numel():
                    st = t.untyped_storage()
                    if st.data_ptr() not in params:
                        seen[st.data_ptr()] = st.nbytes()
        todo += [nxt for nxt, _ in fn.next_functions]
    return sum(seen.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--keep", choices=("tensor", "item"), default="tensor")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--val-batch", type=int, default=200)
    ap.add_argument("--width", type=int, default=1024)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    val_x = torch.randn(args.val_batch, 64)
    val_y = torch.randint(0, 10, (args.val_batch,))
    val_losses = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 64)
        y = torch.randint(0, 10, (args.batch,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        val_loss = F.cross_entropy(model(val_x), val_y)  # no torch.no_grad(): the graph stays with the tensor
        if step == 0:
            print(f"kept bytes per step {saved_bytes(val_loss, param_ptrs)} from step {step}", flush=True)
        val_losses.append(val_loss if args.keep == "tensor" else val_loss.item())
        if step % 100 == 99:
            print(f"step {step + 1} loss {loss.item():.4f}", flush=True)
    mean = sum(v.item() if isinstance(v, torch.Tensor) else v for v in val_losses) / len(val_losses)
    print(f"mean validation loss {mean:.4f}", flush=True)


if __name__ == "__main__":
    main()
