"""``gpudash.load_run``: a run directory as pandas DataFrames."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from gpudash.store.reader import RunReader

if TYPE_CHECKING:
    from gpudash.store.snapshot import MemoryMap

__all__ = ["DIED", "Run", "load_run", "merged_meta", "parse_json", "run_start", "settle_status"]

#: The end reason of a run whose writer stopped without saying why (its heartbeat went stale).
DIED = "process died (no heartbeat)"


@dataclass
class Run:
    """A loaded run. ``steps``, ``memory`` and ``events`` are read at load time;
    the bulkier tables (``device``, ``host``, ``activations``, ``snapshots``,
    ``stacks``) on first access."""

    path: Path
    meta: dict[str, Any]
    status: str
    steps: pd.DataFrame
    memory: pd.DataFrame
    events: pd.DataFrame
    problems: list[str] = field(default_factory=list)
    rank_meta: dict[int, dict[str, Any]] = field(default_factory=dict)
    _reader: RunReader | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or self.path.name)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rank_meta)

    @property
    def start(self) -> float | None:
        """When the run began (unix time): :func:`run_start`."""
        return run_start(self.meta, self.rank_meta)

    def _table(self, table: str) -> pd.DataFrame:
        assert self._reader is not None
        return self._reader.read_table(table, self._reader.attempts)

    @cached_property
    def host(self) -> pd.DataFrame:
        return self._table("host")

    def host_rows(self) -> pd.DataFrame:
        """The host samples; an empty frame for a Run built in memory with neither a reader nor host rows."""
        if "host" in self.__dict__ or self._reader is not None:
            return self.host
        return pd.DataFrame()

    @cached_property
    def device(self) -> pd.DataFrame:
        return self._table("device")

    @cached_property
    def activations(self) -> pd.DataFrame:
        return self._table("activations")

    @cached_property
    def stacks(self) -> pd.DataFrame:
        return self._table("stacks")

    @cached_property
    def snapshots(self) -> list[MemoryMap]:
        from gpudash.store.snapshot import snapshots_from_frame

        maps = snapshots_from_frame(self._table("snapshots"), self.problems)
        return maps

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def parse_json(value: Any) -> dict[str, Any]:
    """An event's ``data`` cell as a dict (``{}`` when missing or not JSON)."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, str) or not value:
        return {}
    try:
        out = json.loads(value)
    except (ValueError, RecursionError, MemoryError):
        return {}
    return out if isinstance(out, dict) else {}


def _time(v: Any) -> float | None:
    try:
        t = float(v)
    except (TypeError, ValueError):
        return None
    return t if t > 0 and t == t and t != float("inf") else None


def run_start(meta: dict[str, Any], rank_meta: dict[int, dict[str, Any]] | None = None) -> float | None:
    """When the run began (unix time): the earliest of ``run.json``'s ``created_at`` (the Monitor writes it
    before its first rank file) and every rank's ``started_at`` (its writer's start); None when neither is
    recorded. The run page's time axis, the runs list, the run's duration and its cost all start here."""
    found = [_time(meta.get("created_at")), _time(meta.get("started_at")),
             *(_time(m.get("started_at")) for m in (rank_meta or {}).values())]
    times = [t for t in found if t is not None]
    return min(times) if times else None


def merged_meta(reader: RunReader, rank_meta: dict[int, dict[str, Any]] | None = None,
                status: str | None = None) -> dict[str, Any]:
    """One meta dict for the run: rank 0's keys win over other ranks', run.json's over both. With the
    run's ``status`` (``reader.status()``), ``meta["status"]`` says it and a crashed run's ``end_reason``
    is its ranks' reasons, else :data:`DIED`."""
    rank_meta = reader.rank_meta() if rank_meta is None else rank_meta
    meta: dict[str, Any] = {}
    for rm in reversed(list(rank_meta.values())):
        meta.update(rm)
    meta.update(reader.run_meta())
    if rank_meta:
        meta["world_size"] = max(int(meta.get("world_size") or 1), len(rank_meta))
    if status is not None:
        settle_status(meta, rank_meta, status)
    return meta


def settle_status(meta: dict[str, Any], rank_meta: dict[int, dict[str, Any]], status: str) -> None:
    """Put the run's ``status`` in ``meta``; a crashed run without an end reason gets its ranks' reasons,
    else :data:`DIED` (the one place a run is said to have died)."""
    meta["status"] = status
    if status == "crashed" and not meta.get("end_reason"):
        reasons = {rm.get("end_reason") for rm in rank_meta.values() if rm.get("end_reason")}
        meta["end_reason"] = "; ".join(sorted(map(str, reasons))) or DIED


def load_run(path: str | os.PathLike[str], attempts: str = "latest") -> Run:
    """Load a run directory (live, finished or crashed). Raises :class:`RunError`
    with a one-line message if the path is not a run at all; damage inside a run
    is reported in ``Run.problems`` and the intact records are returned.

    A run some process resumed (a new *attempt*, see :mod:`gpudash.store.attempts`) shows each step once,
    from the attempt that recorded it last (``attempts="latest"``); ``attempts="all"`` keeps the rows later
    attempts superseded, every frame with an ``attempt`` column."""
    if attempts not in ("latest", "all"):
        raise ValueError(f"attempts={attempts!r}: pass 'latest' (each step once) or 'all' (every attempt's rows)")
    reader = RunReader(path)
    reader.attempts = attempts
    rank_meta = reader.rank_meta()
    meta = merged_meta(reader, rank_meta)
    steps = reader.read_table("steps", attempts)
    memory = reader.read_table("memory", attempts)
    events = reader.read_table("events", attempts)
    if "data" in events:
        events["data"] = pd.Series([parse_json(v) for v in events["data"]], index=events.index, dtype=object)
    status = reader.status()
    settle_status(meta, rank_meta, status)
    return Run(
        path=reader.path,  # an object-store run: the private folder named like it (``reader.url`` says where)
        meta=meta,
        status=status,
        steps=steps,
        memory=memory,
        events=events,
        problems=reader.all_problems(),
        rank_meta=rank_meta,
        _reader=reader,
    )
