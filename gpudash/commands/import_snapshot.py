"""``gpudash import-snapshot FILE RUN_DIR``: store a torch memory snapshot in a run.

For a snapshot taken without gpudash (``torch.cuda.memory._dump_snapshot``):
the pickle is read with the no-globals unpickler, summarised, and appended to
``RUN_DIR``'s ``snapshots`` table (a new run directory is created if needed),
so the dashboard's memory map shows it. No torch needed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from gpudash.errors import RunError, UserError
from gpudash.store.meta import write_run_meta
from gpudash.store.schema import rank_db_name
from gpudash.store.snapshot_codec import append_snapshot_row, snapshot_row
from gpudash.store.snapshot_read import (
    MAX_NODES,
    no_gc,
    node_budget,
    open_snapshot_file,
    read_snapshot_pickle,
    summarize,
)
from gpudash.store.writer import Recorder
from gpudash.units import human_bytes

__all__ = ["add_arguments", "import_snapshot", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="snapshot pickle written by torch.cuda.memory._dump_snapshot")
    p.add_argument("run_dir", help="run directory to store it in (created if missing)")
    p.add_argument("--step", type=int, default=None, help="training step the snapshot belongs to")
    p.add_argument("--rank", type=int, default=0, help="rank whose database receives it (default 0)")
    p.add_argument("--reason", default=None, help="label shown in the dashboard (default: imported FILE)")
    p.add_argument("--max-nodes", type=int, default=None, metavar="N",
                   help=f"read at most N segments, blocks, frames and trace entries (default {MAX_NODES:,} and "
                        "one per byte of the file: shared references count at each use)")


def import_snapshot(file: str | Path, run_dir: str | Path, *, step: int | None = None, rank: int = 0,
                    reason: str | None = None, max_nodes: int | None = None) -> dict[str, int]:
    """Store ``file`` in ``run_dir`` (every trace entry, as compressed columns); returns segment, block and
    trace entry counts and bytes. The pickle is read as it streams in (never whole in memory)."""
    src = Path(file)
    run = Path(run_dir)
    if run.exists() and not run.is_dir():
        raise UserError(f"{run}: not a directory (pass a run folder; it is created if missing)")
    f, size = open_snapshot_file(src)
    with f, no_gc():
        snap = read_snapshot_pickle(f, where=str(src))
        summary = summarize(snap, max_nodes=node_budget(size) if max_nodes is None else max_nodes, where=str(src))
        del snap  # the summary is all that is stored: freed (by reference counts) before compressing
    try:
        t = src.stat().st_mtime
    except OSError:
        t = time.time()
    row = snapshot_row(summary, time=t, step=step, reason=reason or f"imported {src.name}")
    run.mkdir(parents=True, exist_ok=True)
    db = run / rank_db_name(rank)
    if db.exists():
        append_snapshot_row(db, row)  # an existing (maybe live) run: add one row, leave its meta alone
    else:
        write_run_meta(run, {"name": run.name, "created_at": time.time(), "world_size": 1,
                             "imported_from": str(src)})
        rec = Recorder(run, rank=rank, meta={"name": run.name})
        rec.put("snapshots", row)
        rec.close(status="finished", reason="imported snapshot")
        if rec.errors:
            raise RunError(f"{db}: could not write the snapshot ({'; '.join(rec.errors)})")
    trace = summary.get("trace") or {}
    return {"segments": len(summary["segments"]["address"]), "blocks": len(summary["blocks"]["address"]),
            "trace_entries": len(trace.get("address", ())),
            "reserved_bytes": sum(summary["segments"]["total_size"]),
            "allocated_bytes": sum(summary["segments"]["allocated_size"])}


def run(args: argparse.Namespace) -> int:
    info = import_snapshot(args.file, args.run_dir, step=args.step, rank=args.rank, reason=args.reason,
                           max_nodes=args.max_nodes)
    print(f"stored {args.file} in {args.run_dir}: {info['segments']} segments, {info['blocks']} blocks, "
          f"{info['trace_entries']:,} trace entries, "
          f"{human_bytes(info['reserved_bytes'])} reserved, {human_bytes(info['allocated_bytes'])} allocated")
    return 0
