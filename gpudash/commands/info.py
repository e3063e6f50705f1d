"""``gpudash info RUN_DIR``: a run's status and headline numbers in the terminal."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpudash.analysis.facts import Facts, headline_rows, run_facts
from gpudash.store import load_run
from gpudash.store.run import Run
from gpudash.terminal import printable_lines
from gpudash.units import human_bytes

__all__ = ["add_arguments", "as_json", "human_bytes", "run", "summarize"]

#: Characters of a run name shown on the terminal line.
NAME_CHARS = 200


def summarize(r: Run, facts: Facts | None = None) -> list[str]:
    """The run as lines of text: its :class:`gpudash.analysis.facts.Facts`, and the events by kind."""
    facts = facts if facts is not None else run_facts(r)
    name = r.name if len(r.name) <= NAME_CHARS else r.name[:NAME_CHARS] + "…"  # the store trims to 1,000
    lines = [f"{'run':<13} {name}  ({r.path})"]
    lines += [f"{label:<13} {text}" for label, text in headline_rows(facts, r.meta)]
    if len(r.events):
        counts = r.events["kind"].value_counts()
        lines.append(f"{'events':<13} " + ", ".join(f"{k} x{v}" for k, v in counts.items()))
    for p in r.problems:
        lines.append(f"{'damaged':<13} {p}")
    return lines


def as_json(r: Run, facts: Facts | None = None) -> dict[str, Any]:
    """``gpudash info RUN --json``: ``{"facts": {...}, "name", "path", "events", "problems"}``."""
    facts = facts if facts is not None else run_facts(r)
    events = {str(k): int(v) for k, v in r.events["kind"].value_counts().items()} if len(r.events) else {}
    return {"facts": facts.to_json(), "name": r.name, "path": str(r.path), "events": events,
            "problems": list(r.problems)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory, or its URL in an object store (s3://bucket/runs/exp1)")
    p.add_argument("--json", action="store_true", help='print {"facts": {...}, ...} as JSON')


def run(args: argparse.Namespace) -> int:
    r = load_run(args.run_dir)
    try:
        if getattr(args, "json", False):
            print(json.dumps(as_json(r), indent=1, allow_nan=False))
        else:
            print(printable_lines(summarize(r)))  # a run's text never acts on the terminal
    finally:
        r.close()
    return 0
