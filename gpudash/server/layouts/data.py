"""What a run page shows, read from the store: whole tables when small, roll-ups when long.

:func:`load_view` reads every table once, after noting how far each rank's
tables went (the rowid cursor), so the live tick that follows reads only what
arrived since, and drops the few rows both reads saw (by step or time).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from gpudash.server.layouts.downsample import MAX_POINTS, downsample_indices
from gpudash.store.reader import RunReader
from gpudash.store.run import merged_meta, parse_json, run_start, settle_status
from gpudash.store.schema import NUMERIC_TABLES

__all__ = ["RAW_LIMIT", "STEP_TABLES", "RunView", "downsample_frame", "load_view", "order_key", "parse_json", "rolled_frame", "run_meta"]

#: Tables with more rows than this are read through the 1 s / 60 s roll-ups.
RAW_LIMIT = 50_000
LIVE_TABLES = NUMERIC_TABLES + ("events", "activations")
#: Tables charted by step: always read at full resolution (columnar chunks) and downsampled by step, so a
#: 200,000-step run of short steps is drawn whole; a roll-up by time would average steps away.
STEP_TABLES = ("steps", "memory")


def order_key(table: str) -> str:
    """Column that orders a table's records for de-duplication between reads."""
    return "step" if table in ("steps", "memory") else "time"


@dataclass
class RunView:
    path: Path
    meta: dict[str, Any]
    status: str
    frames: dict[str, pd.DataFrame]
    levels: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    cursor: dict[str, int] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    t0: float = 0.0
    full: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)
    """The step tables at full resolution (zoom re-reads a step range from them)."""

    @property
    def ranks(self) -> list[int]:
        ranks: set[int] = set()
        for df in self.frames.values():
            if "rank" in df and len(df):
                ranks.update(int(r) for r in df["rank"].unique())
        return sorted(ranks) or [0]

    def frame(self, table: str) -> pd.DataFrame:
        return self.frames.get(table, pd.DataFrame())

    def full_frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Steps and memory at full resolution (their downsampled frames where not read whole): what numbers
        are taken over, where :attr:`frames` are what charts draw."""
        return self.full.get("steps", self.frame("steps")), self.full.get("memory", self.frame("memory"))

    @property
    def last_step(self) -> int | None:
        s = self.full.get("steps", self.frame("steps"))
        if not len(s) or "step" not in s:
            return None
        return int(np.nanmax(s["step"].to_numpy(dtype=float)))


def run_meta(reader: RunReader) -> dict[str, Any]:
    return merged_meta(reader)


_ENVELOPE = {
    "steps": ("duration_s", "loss", "grad_norm"),
    "memory": ("allocated_bytes", "reserved_bytes", "activations_bytes", "params_bytes"),
    "host": ("rss_bytes", "cpu_pct"),
    "device": ("sm_active_pct", "power_w", "pcie_tx_mib_s", "pcie_rx_mib_s", "util_pct"),
}


def downsample_frame(df: pd.DataFrame, table: str, n: int = MAX_POINTS) -> pd.DataFrame:
    """At most about ``n`` rows per rank (and GPU), keeping the peaks of the columns that matter."""
    if len(df) <= n:
        return df
    keys = [k for k in ("rank", "gpu") if k in df]
    parts = []
    for _, g in (df.groupby(keys, sort=True) if keys else [((), df)]):
        if len(g) <= n:
            parts.append(g)
            continue
        cols = [c for c in _ENVELOPE.get(table, ()) if c in g and g[c].notna().any()] or \
               [c for c in g.columns if c not in ("rank", "gpu", "time", "step")][:1]
        key = "step" if table in STEP_TABLES and "step" in g else "time" if "time" in g else None
        x = g[key].to_numpy() if key is not None else np.arange(len(g), dtype=np.int64)
        per = max(n // max(len(cols), 1), 100)
        idx = np.unique(np.concatenate([downsample_indices(x, g[c].to_numpy(dtype=float), per) for c in cols]))
        parts.append(g.iloc[idx])
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0].reset_index(drop=True)


def rolled_frame(df: pd.DataFrame) -> pd.DataFrame:
    """A roll-up frame in the shape of raw rows: byte columns take the bucket's max (peaks stay)."""
    out = pd.DataFrame({c: df[c] for c in df.columns if "__" not in c and c != "n"})
    for c in list(out.columns):
        if c.endswith("_bytes") and f"{c}__max" in df:
            out[c] = df[f"{c}__max"]
    if "step" in out:
        out["step"] = out["step"].round()
    return out


def load_view(reader: RunReader, max_points: int = MAX_POINTS, raw_limit: int = RAW_LIMIT,
              known: dict[str, Any] | None = None) -> RunView:
    """Everything the run page needs, with numeric tables at most ``max_points`` rows per rank. ``known``:
    step tables (:data:`STEP_TABLES`) already read from these same files, used instead of reading them again."""
    reader.refresh()
    cursor = {f"{rank}/{t}": r.max_rowid(t) for rank, r in reader.ranks.items() for t in LIVE_TABLES}
    rank_meta = reader.rank_meta()
    meta = merged_meta(reader, rank_meta)
    frames: dict[str, pd.DataFrame] = {}
    levels: dict[str, int] = {}
    full: dict[str, pd.DataFrame] = {}
    for table in NUMERIC_TABLES:
        if table in STEP_TABLES:
            full[table] = known[table] if known is not None and table in known else reader.read_table(table)
            frames[table] = downsample_frame(full[table], table, max_points)
            levels[table] = 0
            continue
        total = sum(r.count(table, None, None) for r in reader.ranks.values())
        if total > raw_limit:
            lo, hi = reader.time_bounds(table) or (None, None)
            df, level = reader.read_range(table, lo, hi, max_rows=max_points)
            if level:
                df = rolled_frame(df)
            levels[table] = level
        else:
            df = reader.read_table(table)
            levels[table] = 0
        frames[table] = downsample_frame(df, table, max_points)
    for table in ("events", "activations", "stacks"):
        frames[table] = reader.read_table(table)
    ev = frames["events"]
    if "data" in ev and len(ev):
        ev["data"] = pd.Series([parse_json(v) for v in ev["data"]], index=ev.index, dtype=object)
    last: dict[str, float] = {}
    for table in LIVE_TABLES:
        key = order_key(table)
        if table not in frames or not len(frames[table]) or key not in frames[table]:
            continue
        for rank, g in frames[table].groupby("rank"):
            vals = pd.to_numeric(g[key], errors="coerce")
            if vals.notna().any():
                last[f"{rank}/{table}"] = float(vals.max())
    t0 = run_start(meta, rank_meta) or 0.0
    if not t0:
        bounds = reader.time_bounds("steps")
        t0 = bounds[0] if bounds else 0.0
    status = reader.status()
    settle_status(meta, rank_meta, status)
    problems = reader.all_problems()
    problems += [p for p in (known or {}).get("problems", ()) if p not in problems]
    return RunView(path=reader.path, meta=meta, status=status, frames=frames, levels=levels,
                   problems=problems, cursor=cursor, last=last, t0=t0, full=full)
