"""A plain PyTorch loop with the most common leak: it keeps every step's loss tensor in a list to plot later.
Called ``backward(retain_graph=True)`` (as scripts do after "Trying to backward through the graph a second
time"), each kept loss holds its whole graph and the activations saved for backward. ``--keep item`` is the
fixed loop (``loss.item()``). It prints the bytes one kept loss holds (its graph's saved tensors, parameters
left out), found by walking the graph, so a test can hold gpudash's rate to it."""

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
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--keep", choices=("tensor", "item"), default="tensor")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10)).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    losses = []
    for step in range(args.steps):
        x = torch.randn(args.batch, 64, device=args.device)
        y = torch.randint(0, 10, (args.batch,), device=args.device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward(retain_graph=True)
        if step == 0:  # before the update changes the saved weights' versions
            print(f"kept bytes per step {saved_bytes(loss, param_ptrs)}", flush=True)
        opt.step()
        losses.append(loss if args.keep == "tensor" else loss.item())
    print(f"kept {len(losses)} losses", flush=True)


if __name__ == "__main__":
    main()
