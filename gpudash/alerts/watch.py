"""Alerts raised live: a watcher reads a run's newest rows from its run directory (the same rows every
surface reads), runs :func:`gpudash.analysis.alerts.evaluate` on the trailing window, and hands what
:class:`~gpudash.analysis.alerts.AlertGate` lets through to :class:`gpudash.alerts.delivery.Delivery`.

The training process runs one :class:`AlertWatcher` (rank 0, a daemon thread; it sees every rank's files
in the run directory); ``gpudash serve --alert-webhook`` runs one :class:`ServeAlerts` thread for every
live run it serves (it also sees a run killed with ``kill -9``, which no in-process watcher outlives).
Nothing here touches the training thread: the cost there is the GIL share of a small SQLite read and a
few pandas operations every ``poll_s`` (measured: benchmarks/alerts.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpudash.alerts.delivery import Delivery, run_link, say
from gpudash.analysis.alerts import (
    ALERT_EVENT,
    FULL_EVERY_S,
    STATE_KINDS,
    TRIGGER_COLUMNS,
    Alert,
    AlertGate,
    Triggers,
    evaluate,
)
from gpudash.analysis.listing import run_status
from gpudash.analysis.memory import capacity_bytes
from gpudash.options import AlertOptions
from gpudash.store import mirror as store_mirror
from gpudash.store.listed import listed_run
from gpudash.store.listing import published_metas
from gpudash.store.reader import RunReader
from gpudash.store.run import Run, merged_meta, parse_json, settle_status

__all__ = ["KEEP_ROWS", "AlertWatcher", "RunWatch", "ServeAlerts", "start_alerts"]

KEEP_ROWS = 512
"""Rows per rank of steps and memory (and events in all) the trailing window keeps."""
_TABLES = ("steps", "memory", "events", "host")
_SAMPLED = ("events", "host")  # not every step: a backlog of them leaves the step history whole
_META_EVERY_S = 5.0
_LIVE_FILES_S = 120.0


def _trigger_columns(parts: list[tuple[int, list[str], list[tuple[Any, ...]]]]) -> dict[str, np.ndarray]:
    """The new rows' :data:`TRIGGER_COLUMNS` as float arrays (None and non-numbers as NaN), no DataFrame."""
    names = sorted({c for _, cols, _ in parts for c in cols if c in TRIGGER_COLUMNS} | ({"rank"} if parts else set()))
    out: dict[str, list[Any]] = {c: [] for c in names}
    for rank, cols, rows in parts:
        where = {c: i + 1 for i, c in enumerate(cols)}
        for c in names:
            i = where.get(c)
            if c == "rank":
                out[c] += [rank] * len(rows)
            elif i is None:
                out[c] += [None] * len(rows)
            else:
                out[c] += [row[i] if isinstance(row[i], int | float) else None for row in rows]
    return {c: np.array(v, dtype=float) for c, v in out.items()}


class RunWatch:
    """One run's trailing window and its gate. ``backlog``: rows per rank and table to start from before
    the current end (0: only what is recorded from now on); with a backlog the first look only takes note
    (what happened before the watch began was not live).

    A look reads the rows since the last one (per rank, by rowid) and evaluates every rule when
    :class:`~gpudash.analysis.alerts.Triggers` fire on them, when an event or the status is new, and at
    least every :data:`~gpudash.analysis.alerts.FULL_EVERY_S`; between, only the stall rule, and only once
    the run has gone ``stall_min_s`` without a step. A quiet look costs a few small SQLite reads."""

    def __init__(self, run_dir: Path, options: AlertOptions, *, backlog: int = 0) -> None:
        self.path = Path(run_dir)
        self.options = options
        self.reader = RunReader(self.path)
        self.gate = AlertGate(options.cooldown_s)
        self.triggers = Triggers()
        self.frames: dict[str, pd.DataFrame] = {t: pd.DataFrame() for t in _TABLES}
        self._pending: dict[str, list[tuple[int, list[str], list[tuple[Any, ...]]]]] = {t: [] for t in _TABLES}
        self.cursor: dict[str, int] = {}
        self.complete = True
        for rank, r in self.reader.ranks.items():
            for t in _TABLES:
                top = r.max_rowid(t)
                self.cursor[f"{rank}/{t}"] = max(0, top - backlog)
                if top > backlog and t not in _SAMPLED:
                    self.complete = False
        self._quiet = backlog > 0
        self._meta: dict[str, Any] = {}
        self._rank_meta: dict[int, dict[str, Any]] = {}
        self._meta_at = -1e9
        self._refresh_at = time.monotonic()
        self._full_at = -1e9
        self._status = ""
        self._last_step_time: float | None = None
        self._held: list[Alert] = []

    def close(self) -> None:
        self.reader.close()

    def _read_new(self) -> tuple[bool, dict[str, dict[str, np.ndarray]]]:
        """Rows since the last look, kept as row tuples until a full evaluation needs them as frames; returns
        whether events (other than alerts) arrived, and the new steps' and memory rows' trigger columns."""
        now = time.monotonic()
        if now - self._refresh_at > _META_EVERY_S:  # ranks that started writing since
            self._refresh_at = now
            self.reader.refresh()
        events = False
        fresh: dict[str, list[tuple[int, list[str], list[tuple[Any, ...]]]]] = {"steps": [], "memory": []}
        for rank, r in sorted(self.reader.ranks.items()):
            r.refresh_columns()  # a column logged for the first time (one cheap PRAGMA)
            for t in _TABLES:
                key = f"{rank}/{t}"
                after = self.cursor.get(key, 0)
                if r.max_rowid(t) <= after:  # one index probe: most looks find no new events
                    continue
                cols, rows = r.read_rows(t, after_rowid=after, limit=5_000)
                if not rows:
                    continue
                self.cursor[key] = int(rows[-1][0])
                if t == "events":
                    kind = cols.index("kind") + 1 if "kind" in cols else None
                    rows = [row for row in rows if kind is None or row[kind] != ALERT_EVENT]
                    events = events or bool(rows)
                elif t in fresh:
                    fresh[t].append((rank, cols, rows))
                    if t == "steps" and "time" in cols:
                        i = cols.index("time") + 1
                        times = [row[i] for row in rows if isinstance(row[i], int | float)]
                        if times:
                            self._last_step_time = max(max(times), self._last_step_time or 0.0)
                if rows:
                    self._pending[t].append((rank, cols, rows))
        return events, {t: _trigger_columns(parts) for t, parts in fresh.items()}

    def _materialize(self) -> None:
        for t, parts in self._pending.items():
            if not parts:
                continue
            new = [pd.DataFrame.from_records(rows, columns=["_rowid", *cols]).drop(columns="_rowid").assign(rank=rank)
                   for rank, cols, rows in parts]
            if t == "events":
                new = [df.assign(data=pd.Series([parse_json(v) for v in df["data"]], index=df.index, dtype=object))
                       if "data" in df else df for df in new]
            old = self.frames[t]
            df = pd.concat(([old] if len(old) else []) + new, ignore_index=True)
            self._pending[t] = []
            if t == "events":
                df = df.tail(KEEP_ROWS)
            elif "rank" in df and len(df) > KEEP_ROWS:
                kept = df.groupby("rank", sort=False).tail(KEEP_ROWS)
                if len(kept) < len(df) and t not in _SAMPLED:
                    self.complete = False
                df = kept
            self.frames[t] = df.reset_index(drop=True)

    def window(self, status: str | None = None, reason: str | None = None) -> Run:
        """The trailing window as a Run (the rows read so far)."""
        self._materialize()
        st = status or self._status
        now = time.monotonic()
        if now - self._meta_at > _META_EVERY_S or st != self._meta.get("status"):
            self._rank_meta = self.reader.rank_meta()
            self._meta = merged_meta(self.reader, self._rank_meta)
            self._meta["status"] = st
            self._meta_at = now
        meta = dict(self._meta)
        if reason:
            meta["end_reason"] = reason
        settle_status(meta, self._rank_meta, st)  # a crashed run's reason, said as everywhere else
        f = self.frames
        run = Run(path=self.path, meta=meta, status=st, steps=f["steps"], memory=f["memory"], events=f["events"],
                  rank_meta=self._rank_meta)
        run.__dict__["host"] = f["host"]  # the host rules read the trailing host rows
        return run

    def look(self, now: float | None = None, status: str | None = None, reason: str | None = None) -> list[Alert]:
        """One look: the alerts to send now."""
        now = time.time() if now is None else now
        o = self.options
        events, fresh = self._read_new()
        st = status or self.reader.status()
        new_status, self._status = st != self._status, st
        fired = self.triggers.fire(fresh["steps"], fresh["memory"], o.headroom_pct)
        mono = time.monotonic()
        if fired or events or new_status or self._quiet or status is not None or mono - self._full_at >= FULL_EVERY_S:
            self._full_at = mono
            run = self.window(status, reason)
            found = evaluate(run, now, complete=self.complete, stall_factor=o.stall_factor,
                             stall_min_s=o.stall_min_s, headroom_pct=o.headroom_pct, kinds=o.kinds)
            self.triggers.capacity = capacity_bytes(run)
            self._held = [a for a in found if a.kind in STATE_KINDS and a.kind != "stall"]
        else:  # nothing new worth the rules: the states hold as they were; a stall may have begun
            stall = []
            idle = self._last_step_time is not None and now - self._last_step_time > o.stall_min_s
            if idle and "stall" in o.kinds:
                stall = evaluate(self.window(), now, stall_factor=o.stall_factor, stall_min_s=o.stall_min_s,
                                 kinds=("stall",))
            found = self._held + stall
        quiet, self._quiet = self._quiet, False
        return self.gate.admit(found, now, quiet=quiet)


class AlertWatcher:
    """The training process's watcher: a daemon thread looking at the run every ``poll_s``."""

    def __init__(self, run_dir: Path, options: AlertOptions, *, name: str, delivery: Delivery,
                 on_stats: Any = None) -> None:
        self.options = options
        self.name = name
        self.delivery = delivery
        self.link = run_link(options.dashboard_url, Path(run_dir).name)
        self.watch = RunWatch(Path(run_dir), options)
        self._on_stats = on_stats
        self._stats: dict[str, Any] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._failed = False
        self._thread = threading.Thread(target=self._loop, name="gpudash-alerts", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.options.poll_s):
            self.look_once()

    def look_once(self, status: str | None = None, reason: str | None = None) -> None:
        with self._lock:
            if self._failed:
                return
            try:
                alerts = self.watch.look(status=status, reason=reason)
            except Exception as exc:  # noqa: BLE001 - alerts stop; training goes on
                self._failed = True
                say(f"alerts stopped after an error ({type(exc).__name__}: {str(exc)[:200]}); the run goes on")
                return
            for a in alerts:
                self.delivery.deliver(self.name, a, self.link)
            stats = dict(self.delivery.stats(), suppressed=self.watch.gate.suppressed)
            if stats != self._stats and self._on_stats is not None:
                self._stats = stats
                self._on_stats(stats)

    def finish(self, status: str, reason: str, flush: Any = None) -> None:
        """The last look, with the status the run is about to be closed with (the crash alert), ``flush``
        (the writer's) first so that it sees the last steps; then deliver what is queued (at most one
        webhook timeout) and record the counts (sent, dropped), all before the writer closes."""
        self._stop.set()
        self._thread.join(5.0)
        try:
            if flush is not None:
                flush(2.0)
        except Exception:  # noqa: BLE001
            pass
        self.look_once(status=status, reason=reason)
        try:
            self.delivery.close(self.options.timeout_s + 0.5)
        except Exception:  # noqa: BLE001 - closing the run must go on
            pass
        with self._lock:
            self._failed = True
            stats = dict(self.delivery.stats(), suppressed=self.watch.gate.suppressed)
            if stats != self._stats and self._on_stats is not None:
                self._on_stats(stats)

    def close(self) -> None:
        """Let go of the run (after :meth:`finish`)."""
        self._stop.set()
        with self._lock:
            self._failed = True
            self.watch.close()


def start_alerts(monitor: Any) -> AlertWatcher | None:
    """The Monitor's watcher (rank 0 only: it reads every rank's files); None when it cannot start."""
    opts: AlertOptions = monitor.options.alerts
    recorder = monitor.recorder

    def record(a: Alert) -> None:
        data: dict[str, Any] = {"alert": a.kind, **a.data}
        if a.rank is not None:
            data["rank"] = a.rank
        if a.where is not None:
            data["where"] = a.where
        recorder.put("events", {"time": time.time(), "step": a.step if a.step is not None else monitor.step_index,
                                "kind": ALERT_EVENT, "message": a.text, "data": data})

    def stats(s: dict[str, Any]) -> None:
        recorder.put_meta(alerts=s)

    try:
        recorder.flush(5.0)  # the rank file exists and holds what came before: the watch starts at its end
        return AlertWatcher(monitor.run_dir, opts, name=monitor.name, delivery=Delivery(opts, record=record),
                            on_stats=stats)
    except Exception as exc:  # noqa: BLE001
        monitor.unavailable("alerts", f"failed to start: {type(exc).__name__}: {exc}")
        return None


class ServeAlerts:
    """``gpudash serve --alert-webhook``: one thread watching every live run in ``runs_dir``. A run already
    going when the server started is taken from its newest rows on (nothing it did before alerts)."""

    def __init__(self, runs_dir: Path, options: AlertOptions, dashboard_url: str, max_runs: int = 256) -> None:
        self.runs_dir = Path(runs_dir)
        self.options = options
        self.dashboard_url = dashboard_url
        self.max_runs = max_runs
        self.delivery = Delivery(options)  # a server never writes into a run
        self.watches: dict[str, RunWatch] = {}
        self._started = time.time()
        self._scan_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpudash-serve-alerts", daemon=True)
        self._thread.start()

    def _candidates(self) -> list[tuple[str, Path]]:
        from gpudash.store.runid import list_nested_run_dirs

        out = []
        now = time.time()
        listed = sum(1 for w in self.watches.values() if listed_run(w.path) is not None)
        for run_id, path in list_nested_run_dirs(self.runs_dir):
            if run_id in self.watches:
                continue
            if listed_run(path) is not None:
                # listed from an object store: its status from its metadata, opened only when live (its
                # segments fetched), at most as many as the segment caches kept at once
                if listed < store_mirror.OPEN_RUNS and run_status(published_metas(path, [])) == "live":
                    out.append((run_id, path))
                    listed += 1
                continue
            try:
                newest = max((p.stat().st_mtime for p in path.glob("rank*.db*")), default=0.0)
            except OSError:
                continue
            if now - newest < _LIVE_FILES_S:
                out.append((run_id, path))
        return out

    def scan(self) -> None:
        for run_id, path in self._candidates():
            if len(self.watches) >= self.max_runs:
                break
            try:
                w = RunWatch(path, self.options, backlog=KEEP_ROWS)
            except Exception:  # noqa: BLE001 - not a run (yet), or unreadable: the next scan tries again
                continue
            if w.reader.status() != "live":
                w.close()
                continue
            self.watches[run_id] = w

    def look_once(self) -> None:
        now = time.monotonic()
        if now - self._scan_at > max(2.0, 4 * self.options.poll_s):
            self._scan_at = now
            self.scan()
        for run_id, w in list(self.watches.items()):
            try:
                alerts = w.look()
            except Exception:  # noqa: BLE001 - one bad run never stops the others
                alerts = []
                w._status = "gone"
            name = str(w._meta.get("name") or run_id)
            for a in alerts:
                self.delivery.deliver(name, a, run_link(self.dashboard_url, run_id))
            if w._status != "live":  # finished or crashed: its last look is done
                w.close()
                del self.watches[run_id]

    def _loop(self) -> None:
        wait = self.options.poll_s
        while not self._stop.wait(wait):
            t0 = time.thread_time()
            try:
                self.look_once()
            except Exception as exc:  # noqa: BLE001
                say(f"alerts stopped after an error ({type(exc).__name__}: {str(exc)[:200]}); still serving")
                return
            # many live runs: look less often rather than take more than a tenth of a core from the pages
            wait = max(self.options.poll_s, 10 * (time.thread_time() - t0))

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self.delivery.close(timeout)
        for w in self.watches.values():
            w.close()
