"""Runs a training script unchanged (``runpy``) and writes what it passed to ``backward()`` and the rate each
optimizer step used, at full precision, to a JSON file: the numbers a script prints rounded, or not at all.

    python tests/zoo/probe.py OUT.json train.py --key=value ...

Independent of gpudash: it wraps ``torch.Tensor.backward`` (gpudash's agent wraps ``torch.autograd.backward``
underneath it) and registers its own optimizer step hook. Under ``no_grad`` the ``.loss`` of each outermost
module call (a Hugging Face model's evaluation batch) is kept in ``eval`` of the step it ran before."""

from __future__ import annotations

import json
import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

out_path, script, *args = sys.argv[1:]
steps: list[dict[str, object]] = [{"losses": []}]
_backward = torch.Tensor.backward


def backward(self: torch.Tensor, *a: object, **kw: object) -> object:
    steps[-1]["losses"].append(float(self.detach()))  # type: ignore[union-attr]
    return _backward(self, *a, **kw)


def stepped(opt: torch.optim.Optimizer, *a: object) -> None:
    steps[-1]["lr"] = float(opt.param_groups[0]["lr"])
    steps.append({"losses": []})


depth = [0]


def pre(module: torch.nn.Module, args: object) -> None:
    depth[0] += 1


def post(module: torch.nn.Module, args: object, output: object) -> None:
    depth[0] -= 1
    loss = getattr(output, "loss", None)
    if depth[0] == 0 and not torch.is_grad_enabled() and isinstance(loss, torch.Tensor) and loss.ndim == 0:
        steps[-1].setdefault("eval", []).append(float(loss))  # type: ignore[union-attr]


torch.Tensor.backward = backward  # type: ignore[method-assign]
register_optimizer_step_post_hook(stepped)
torch.nn.modules.module.register_module_forward_pre_hook(pre)
torch.nn.modules.module.register_module_forward_hook(post, always_call=True)
sys.argv = [script, *args]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
try:
    runpy.run_path(script, run_name="__main__")
finally:
    with open(out_path, "w") as f:
        json.dump([s for s in steps if s["losses"] or "lr" in s or s.get("eval")], f)
