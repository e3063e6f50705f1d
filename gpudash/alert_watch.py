"""Alerts raised live: a watcher reads a run's newest rows from its run directory (the same rows every
surface reads), runs :func:`gpudash.analysis.alerts.evaluate` on the trailing window, and hands what
:class:`~gpudash.analysis.alerts.AlertGate` lets through to :class:`gpudash.alerting.Delivery`.

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

import pandas as pd

from gpudash.alerting import Delivery, run_link, say
from gpudash.analysis.alerts import ALERT_EVENT, STATE_KINDS, Alert, AlertGate, evaluate
from gpudash.options import AlertOptions
from gpudash.store.reader import RunReader
from gpudash.store.run import Run, merged_meta, parse_json

__all__ = ["KEEP_ROWS", "AlertWatcher", "RunWatch", "ServeAlerts", "start_alerts"]

KEEP_ROWS = 512
"""Rows per rank of steps and memory (and events in all) the trailing window keeps."""
_TABLES = ("steps", "memory", "events")
_META_EVERY_S = 5.0
_LIVE_FILES_S = 120.0


class RunWatch:
    """One run's trailing window and its gate. ``backlog``: rows per rank and table to start from before
    the current end (0: only what is recorded from now on); with a backlog the first look only takes note
    (what happened before the watch began was not live)."""

    def __init__(self, run_dir: Path, options: AlertOptions, *, backlog: int = 0) -> None:
        self.path = Path(run_dir)
        self.options = options
        self.reader = RunReader(self.path)
        self.gate = AlertGate(options.cooldown_s)
        self.frames: dict[str, pd.DataFrame] = {t: pd.DataFrame() for t in _TABLES}
        self.cursor: dict[str, int] = {}
        self.complete = True
        for rank, r in self.reader.ranks.items():
            for t in _TABLES:
                top = r.max_rowid(t)
                self.cursor[f"{rank}/{t}"] = max(0, top - backlog)
                if top > backlog and t != "events":
                    self.complete = False
        self._quiet = backlog > 0
        self._meta: dict[str, Any] = {}
        self._rank_meta: dict[int, dict[str, Any]] = {}
        self._meta_at = 0.0
        self._status = ""
        self._held: list[Alert] = []
        self._looked = False

    def close(self) -> None:
        self.reader.close()

    def _append(self, table: str, new: pd.DataFrame) -> None:
        if table == "events" and "data" in new:
            new = new.assign(data=pd.Series([parse_json(v) for v in new["data"]], index=new.index, dtype=object))
        old = self.frames[table]
        df = new if old.empty else pd.concat([old, new], ignore_index=True)
        if table == "events":
            df = df[df["kind"].astype(str) != ALERT_EVENT] if "kind" in df else df
            df = df.tail(KEEP_ROWS)
        elif "rank" in df and len(df) > KEEP_ROWS:
            kept = df.groupby("rank", sort=False).tail(KEEP_ROWS)
            if len(kept) < len(df):
                self.complete = False
            df = kept
        self.frames[table] = df.reset_index(drop=True)

    def window(self, status: str | None = None, reason: str | None = None) -> tuple[Run, bool]:
        """The trailing window as a Run, and whether anything arrived since the last look."""
        new, self.cursor = self.reader.read_since(self.cursor, tables=_TABLES, limit=5_000)
        for table, df in new.items():
            self._append(table, df)
        now = time.monotonic()
        st = status or self.reader.status()
        changed = bool(new) or st != self._status
        if changed and (st != self._status or now - self._meta_at > _META_EVERY_S or not self._meta):
            self._rank_meta = self.reader.rank_meta()
            self._meta = merged_meta(self.reader, self._rank_meta)
            self._meta_at = now
        meta = dict(self._meta, status=st)
        if reason:
            meta["end_reason"] = reason
        elif st == "crashed" and not meta.get("end_reason"):
            reasons = {m.get("end_reason") for m in self._rank_meta.values() if m.get("end_reason")}
            meta["end_reason"] = "; ".join(sorted(map(str, reasons))) or "process died (no heartbeat)"
        self._status = st
        f = self.frames
        return Run(path=self.path, meta=meta, status=st, steps=f["steps"], memory=f["memory"], events=f["events"],
                   rank_meta=self._rank_meta), changed

    def look(self, now: float | None = None, status: str | None = None, reason: str | None = None) -> list[Alert]:
        """One look: the alerts to send now."""
        now = time.time() if now is None else now
        run, changed = self.window(status, reason)
        o = self.options
        if changed or not self._looked:
            self._looked = True
            found = evaluate(run, now, complete=self.complete, stall_factor=o.stall_factor,
                             stall_min_s=o.stall_min_s, headroom_pct=o.headroom_pct, kinds=o.kinds)
            self._held = [a for a in found if a.kind in STATE_KINDS and a.kind != "stall"]
        else:  # nothing new: only a stall can have begun; the other states hold as they were
            found = self._held + evaluate(run, now, stall_factor=o.stall_factor, stall_min_s=o.stall_min_s,
                                          kinds=tuple(k for k in o.kinds if k == "stall"))
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
        from gpudash.layouts.runid import list_nested_run_dirs

        out = []
        now = time.time()
        for run_id, path in list_nested_run_dirs(self.runs_dir):
            if run_id in self.watches:
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
        while not self._stop.wait(self.options.poll_s):
            try:
                self.look_once()
            except Exception as exc:  # noqa: BLE001
                say(f"alerts stopped after an error ({type(exc).__name__}: {str(exc)[:200]}); still serving")
                return

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
        self.delivery.close(timeout)
        for w in self.watches.values():
            w.close()
