"""``gpudash diff-snapshots A B``: what grew between two allocator snapshots, and by which frames.

A and B are each a snapshot pickle (``torch.cuda.memory._dump_snapshot``), a run directory (its newest
snapshot) or ``RUN_DIR@STEP`` (the run's snapshot at that step, else the last one before it). The diff is
:func:`gpudash.analysis.snapshot_diff.snapshot_diff`; ``--json`` prints it as data.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpudash.errors import UserError
from gpudash.terminal import printable_lines
from gpudash.units import human_bytes

__all__ = ["add_arguments", "load_side", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("before", help="snapshot A: a .pickle, a run directory, or RUN_DIR@STEP")
    p.add_argument("after", help="snapshot B (the same forms)")
    p.add_argument("--top", type=int, default=20, metavar="N", help="stacks listed (default 20)")
    p.add_argument("--json", action="store_true", help="print the diff as JSON")


def load_side(spec: str) -> Any:
    """The memory map ``spec`` names (see the module doc)."""
    from gpudash.store.run import load_run
    from gpudash.store.snapshot import load_snapshot

    path, _, step_text = spec.rpartition("@") if "@" in spec and not Path(spec).exists() else (spec, "", "")
    p = Path(path)
    if p.is_dir():
        maps = load_run(p).snapshots
        if not maps:
            raise UserError(f"{p}: the run holds no snapshot (gpudash import-snapshot FILE {p} adds one)")
        if not step_text:
            return maps[-1]
        try:
            step = int(step_text)
        except ValueError:
            raise UserError(f"{spec}: STEP must be a whole number (RUN_DIR@STEP)") from None
        before = [m for m in maps if m.step is not None and m.step <= step]
        if not before:
            steps = ", ".join(str(m.step) for m in maps[:10])
            raise UserError(f"{spec}: no snapshot at or before step {step} (its snapshots: steps {steps})")
        return before[-1]
    if step_text:
        raise UserError(f"{spec}: @STEP goes with a run directory, not a file")
    return load_snapshot(p)


def _signed(n: int) -> str:
    return ("+" if n > 0 else "-" if n < 0 else "±") + human_bytes(abs(n))


def lines(diff: Any) -> list[str]:
    a, b = diff.before, diff.after

    def name(t: Any) -> str:
        return ((f"step {t.step}" if t.step is not None else "") + (f" ({t.label})" if t.label else "")).strip() or "snapshot"

    out = [f"A: {name(a)}", f"B: {name(b)}",
           f"{'':<14}{'A':>12}{'B':>12}{'change':>12}"]
    for label, x, y in (("allocated", a.allocated_bytes, b.allocated_bytes), ("reserved", a.reserved_bytes,
                                                                                b.reserved_bytes),
                        ("free", a.free_bytes, b.free_bytes), ("largest free", a.largest_free_bytes,
                                                              b.largest_free_bytes)):
        out.append(f"{label:<14}{human_bytes(x):>12}{human_bytes(y):>12}{_signed(y - x):>12}")
    out.append(f"{'allocations':<14}{a.live:>12,}{b.live:>12,}{b.live - a.live:>+12,}")
    out.append(f"grew {human_bytes(diff.grown_bytes)} in {sum(r.delta_bytes > 0 for r in diff.rows)} stacks, "
               f"shrank {human_bytes(diff.shrunk_bytes)}; by stack (innermost frame first):")
    for r in diff.rows:
        frames = r.stack.split("\n")
        out.append(f"  {_signed(r.delta_bytes):>10}  {r.before_count:,} -> {r.after_count:,} allocations  {frames[0]}")
        out.extend(f"{'':>14}{f}" for f in frames[1:])
    if diff.more:
        out.append(f"  ... {diff.more} more stacks changed (--top N lists more)")
    return out


def run(args: argparse.Namespace) -> int:
    from gpudash.analysis.snapshot_diff import snapshot_diff

    if args.top < 1:
        raise UserError("--top must be at least 1")
    diff = snapshot_diff(load_side(args.before), load_side(args.after), top=args.top)
    if args.json:
        print(json.dumps(diff.as_dict(), indent=1))
    else:
        print(printable_lines(lines(diff)))
    return 0
