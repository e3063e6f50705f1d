"""``gpudash info RUN_DIR``: a run's status and headline numbers in the terminal."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpudash.store import load_run
from gpudash.store.run import Run
from gpudash.units import human_bytes

__all__ = ["add_arguments", "human_bytes", "run", "summarize"]


def summarize(r: Run) -> list[str]:
    lines = [f"run      {r.name}  ({r.path})", f"status   {r.status}"]
    if r.meta.get("end_reason"):
        lines.append(f"ended    {r.meta['end_reason']}")
    lines.append(f"device   {r.meta.get('device_name') or r.meta.get('device', '?')}   ranks: {len(r.ranks)}")
    s = r.steps
    if len(s):
        lines.append(f"steps    {int(s['step'].max()) + 1}   median step {s['duration_s'].median() * 1e3:.1f} ms")
        span = float(s["time"].max() - s["time"].min()) if len(s) > 1 else 0.0
        if "tokens" in s and span > 0:
            lines.append(f"tokens/s {s['tokens'].sum() / span:,.0f}")
    m = r.memory
    if len(m):
        parts = []
        for col in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "allocated_bytes"):
            if col in m and m[col].notna().any():
                parts.append(f"{col.removesuffix('_bytes')} {human_bytes(m[col].max())}")
        lines.append("peak     " + ", ".join(parts))
    if len(r.events):
        counts = r.events["kind"].value_counts()
        lines.append("events   " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
    for p in r.problems:
        lines.append(f"damaged  {p}")
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a run directory")


def run(args: argparse.Namespace) -> int:
    r = load_run(args.run_dir)
    print("\n".join(summarize(r)))
    r.close()
    return 0
