"""A loop that does to its model, every step, what training scripts do between steps: pickles it whole
(``torch.save(model)``, then loads it back), deep-copies it (an EMA teacher, updated and run under
``no_grad``, as in self-distillation), and once scripts it (``torch.jit.script``) and exports it
(``torch.export``), checking the copies compute what the model does. Prints each step's loss and, for each
copy, how many forward hooks or call wrappers it carries (none: the script put none on the model).

    python save_and_copy.py --steps 8
"""

import argparse
import copy
import io

import torch
import torch.nn.functional as F
from torch import nn


def hooks_on(model):
    """Forward hooks and call wrappers found on ``model``'s modules."""
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + ("_compiled_call_impl" in m.__dict__)
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--export-at", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32), nn.Tanh()),
                          nn.Linear(32, 4))
    teacher = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=g)
        y = torch.randn(8, 4, generator=g)
        out = model(x)
        with torch.no_grad():
            target = teacher(x)
        loss = F.mse_loss(out, y) + 0.1 * F.mse_loss(out, target)
        buf = io.BytesIO()
        torch.save(model, buf)  # mid-step: the forward ran, its graph is alive
        ema = copy.deepcopy(model)
        loss.backward()
        opt.step()
        opt.zero_grad()
        buf.seek(0)
        loaded = torch.load(buf, weights_only=False)
        with torch.no_grad():
            for pt, pm in zip(teacher.parameters(), model.parameters(), strict=True):
                pt.mul_(0.9).add_(pm, alpha=0.1)
            same = torch.equal(ema(x), ema(x))
        print(f"step {step} loss {loss.item()!r} hooks saved {hooks_on(loaded)} copied {hooks_on(ema)} {same}",
              flush=True)
        if step == args.export_at:
            probe = torch.randn(2, 16, generator=g)
            scripted = torch.jit.script(model)
            exported = torch.export.export(model, (probe,))
            with torch.no_grad():
                ok = torch.equal(scripted(probe), model(probe)) and torch.equal(exported.module()(probe), model(probe))
            print(f"scripted and exported at step {step}: {ok} hooks {hooks_on(scripted)}", flush=True)


if __name__ == "__main__":
    main()
