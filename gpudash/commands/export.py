"""``gpudash export RUN_DIR --format parquet|csv``: a run's tables as files.

For people who analyse runs in pandas, DuckDB or a spreadsheet. One file per
table (``steps``, ``memory``, ``events``, ``host``, ``device``,
``activations``, ``stacks``), every rank in it with a ``rank`` column, plus
``meta.json``. The ``data`` column of ``events`` is JSON text. Allocator
snapshots stay in the run (they are blobs; ``gpudash.load_run`` reads them).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pandas as pd

from gpudash.errors import UserError
from gpudash.store import load_run

__all__ = ["FORMATS", "TABLES", "add_arguments", "export_run", "run"]

TABLES = ("steps", "memory", "events", "host", "device", "activations", "stacks")
FORMATS = ("parquet", "csv")


def _plain(df: pd.DataFrame, table: str) -> pd.DataFrame:
    """Columns a file format can hold: JSON text for dicts, text for mixed objects."""
    df = df.copy()
    for col in df.columns:
        if df[col].dtype != object:
            continue
        values = df[col]
        if table == "events" and col == "data":
            df[col] = [json.dumps(v, default=str, sort_keys=True) if isinstance(v, dict) else None for v in values]
        elif not all(v is None or isinstance(v, str) for v in values):
            df[col] = [None if v is None else str(v) for v in values]
    return df


def export_run(run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], fmt: str = "parquet",
               tables: tuple[str, ...] = TABLES) -> dict[str, Path]:
    """Write each non-empty table of ``run_dir`` to ``out_dir/<table>.<fmt>``; returns table -> path."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r}: use one of {', '.join(FORMATS)}")
    if fmt == "parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError as exc:
            raise UserError("parquet export needs pyarrow: pip install pyarrow (or use --format csv)") from exc
    run = load_run(run_dir)
    out = Path(out_dir)
    written: dict[str, Path] = {}
    try:
        out.mkdir(parents=True, exist_ok=True)
        for table in tables:
            df = getattr(run, table)
            if df.empty:
                continue
            df = _plain(df, table)
            path = out / f"{table}.{fmt}"
            if fmt == "parquet":
                df.to_parquet(path, index=False)
            else:
                df.to_csv(path, index=False)
            written[table] = path
        meta = {**run.meta, "status": run.status, "problems": run.problems}
        (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    except OSError as exc:
        raise UserError(f"cannot write to {out}: {exc.strerror or exc}; pass another folder with -o") from exc
    finally:
        run.close()
    return written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=Path, help="a run directory")
    p.add_argument("--format", choices=FORMATS, default="parquet", help="file format (default: parquet)")
    p.add_argument("-o", "--out", type=Path, default=None,
                   help="output folder (default: RUN_DIR/export)")
    p.add_argument("--tables", default=",".join(TABLES),
                   help=f"comma-separated tables to export (default: {','.join(TABLES)})")


def run(args: argparse.Namespace) -> int:
    tables = tuple(t.strip() for t in str(args.tables).split(",") if t.strip())
    unknown = [t for t in tables if t not in TABLES]
    if unknown:
        raise UserError(f"unknown table(s) {', '.join(unknown)}: choose from {', '.join(TABLES)}")
    out = args.out if args.out is not None else Path(args.run_dir) / "export"
    written = export_run(args.run_dir, out, args.format, tables)
    for table, path in written.items():
        print(f"{table:<12} {path}")
    if not written:
        print(f"nothing recorded in {args.run_dir} yet; wrote only {out / 'meta.json'}")
    return 0
