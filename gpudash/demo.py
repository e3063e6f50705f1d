"""``gpudash demo``: a small training loop under the Monitor (no download, CPU or GPU).

Later the demo starts the trainer's tiny preset with the dashboard beside it;
until those land it trains a small MLP on generated data and prints where the
run went and how to look at it.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

__all__ = ["add_arguments", "run", "train_example"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", type=Path, default=Path("runs"), help="where runs are written (default: runs)")
    p.add_argument("--steps", type=int, default=300, help="training steps (default: 300)")


def train_example(run_dir: Path, steps: int) -> Path:
    import torch

    from gpudash.monitor import Monitor

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 512), torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.GELU(),
        torch.nn.Linear(512, 10),
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Monitor(run_dir, name="demo-mlp") as mon:
        mon.watch(model, opt)
        for _ in range(steps):
            with mon.step(samples=64):
                with mon.phase("data"):
                    x = torch.randn(64, 128, device=device)
                    y = (x[:, :10].argmax(dim=1))
                with mon.phase("forward"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                with mon.phase("backward"):
                    loss.backward()
                with mon.phase("optimizer"):
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                mon.log(loss=loss, lr=1e-3)
    return run_dir


def run(args: argparse.Namespace) -> int:
    from gpudash.info import summarize
    from gpudash.store import load_run

    if args.steps < 1:
        from gpudash.errors import UserError

        raise UserError("--steps must be >= 1")
    run_dir = args.runs_dir / time.strftime("demo-%Y%m%d-%H%M%S")
    print(f"gpudash demo: training a small model for {args.steps} steps -> {run_dir}")
    train_example(run_dir, args.steps)
    r = load_run(run_dir)
    print("\n".join(summarize(r)))
    print(f"\nLook at it:  gpudash info {run_dir}\n             python -c \"import gpudash; "
          f"print(gpudash.load_run('{run_dir}').steps)\"")
    return 0
