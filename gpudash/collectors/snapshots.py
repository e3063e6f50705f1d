"""Allocator snapshots (memory maps): every N steps, on request, and at OOM.

* every ``snapshot_every`` steps (0, the default: never on a schedule), at the
  end of the step;
* on demand: when ``RUN_DIR/snapshot.request`` appears (the dashboard writes
  it), at the end of the next step, stored with reason ``"requested"``. A
  background thread stats the file about once a second, so the training thread
  does no I/O. gpudash's own requests (:meth:`SnapshotCollector.request` with a
  ``reason``: the leak watch's ``"leak watch"``) are stored with theirs, so a
  snapshot nobody asked for is not shown as one a user requested;
* at OOM: the allocator's OOM observer fires before ``OutOfMemoryError`` is
  raised; the collector stores a snapshot of memory at that moment and hands
  the allocator's numbers to :func:`gpudash.collectors.oom.note_observed_oom`:
  the ``oom`` event is recorded once, by the ``record_oom`` call of whoever
  catches the error (with their numbers too), else at the next step or at
  close (a crashed run keeps both).

``torch.cuda.memory._snapshot()`` runs on the training thread (it must see a
consistent allocator); summarising and compressing run on the collector's
thread, except at OOM, where it is done at once because the process may be
about to die. Frames per block exist only while allocation history is
recorded (``record_history``; ~2 µs per allocation, so off unless snapshots
are scheduled).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpudash.collectors.base import cuda_torch
from gpudash.collectors.oom import flush_observed_oom, note_observed_oom
from gpudash.store.schema import SNAPSHOT_REQUEST_FILE

if TYPE_CHECKING:
    from gpudash.collectors.api import Recording

__all__ = ["SnapshotCollector"]

# torch has no way to detach an OOM observer: attach one dispatcher per process
# and point it at the live collectors.
_LIVE: weakref.WeakSet[SnapshotCollector] = weakref.WeakSet()
_ATTACHED = False
_ATTACH_LOCK = threading.Lock()


def _dispatch_oom(device: int, alloc: int, device_limit: int, device_free: int) -> None:
    for c in list(_LIVE):
        try:
            c.on_oom(device, alloc, device_limit, device_free)
        except Exception:  # noqa: BLE001 - never turn an OOM into a different error
            pass


def _free_blocks(snap: dict[str, Any]) -> dict[str, int]:
    """Largest free (inactive) block and the total in them, straight from a raw snapshot."""
    sizes = [int(b.get("size", 0)) for seg in snap.get("segments") or () for b in seg.get("blocks") or ()
             if b.get("state") == "inactive"]
    return {"largest_free_bytes": max(sizes, default=0), "inactive_bytes": sum(sizes)}


class SnapshotCollector:
    name = "snapshots"

    def __init__(self, every: int = 0, *, record_history: bool | None = None, history_entries: int = 100_000,
                 poll_interval: float = 1.0, oom_snapshot_gap_s: float = 30.0, queue_size: int = 2,
                 take_snapshot: Callable[[], dict[str, Any]] | None = None) -> None:
        """``take_snapshot`` replaces ``torch.cuda.memory._snapshot`` (tests on CPU feed a recorded
        snapshot through the whole pipeline with it; no CUDA check is made then)."""
        self.every = every
        self._take = take_snapshot
        self.record_history = every > 0 if record_history is None else record_history
        self.history_entries = history_entries
        self.poll_interval = poll_interval
        self.oom_snapshot_gap_s = oom_snapshot_gap_s
        self.taken = 0
        self.dropped = 0
        self._monitor: Recording | None = None
        self._torch: Any = None
        self._reasons: list[str] = []  # why the snapshot at the end of this step was asked for (guarded)
        self._reasons_lock = threading.Lock()
        self._stop = threading.Event()
        self._queue: queue.Queue[tuple[dict[str, Any], float, int, str] | None] = queue.Queue(queue_size)
        self._thread: threading.Thread | None = None
        self._served_mtime = 0.0
        self._last_oom_snapshot = -1e18
        self._history_on = False
        self._armed = False
        self._oom_pending = False

    # ---- lifecycle ----------------------------------------------------------------------
    def start(self, monitor: Recording) -> None:
        if self._take is not None:
            self._monitor = monitor
            self._begin(monitor)
            _LIVE.add(self)  # a recorded trace can drive the OOM dispatcher (nothing attaches it to torch here)
            return
        torch = cuda_torch(monitor, self.name,
                           "no CUDA device: allocator snapshots and the OOM observer need CUDA")
        if torch is None:
            return
        self._monitor = monitor
        self._torch = torch
        self._take = torch.cuda.memory._snapshot
        # the OOM observer and history attach to the per-device allocators, which
        # exist only once CUDA is initialised: arm now, or at the first step after
        self._begin(monitor)
        if torch.cuda.is_initialized():
            self._arm()
        else:
            monitor.add_step_hooks(start=self._arm_when_ready)

    def _arm_when_ready(self, step: int) -> None:
        if not self._armed and self._torch.cuda.is_initialized():
            self._arm()

    def _arm(self) -> None:
        monitor = self._monitor
        if self._armed or monitor is None:
            return
        self._armed = True
        torch = self._torch
        if self.record_history:
            try:
                torch.cuda.memory._record_memory_history(max_entries=self.history_entries, stacks="python")
                self._history_on = True
            except Exception as exc:  # noqa: BLE001 - older torch: snapshots without frames
                monitor.unavailable("snapshot_history", f"allocation history not recorded: {exc}")
        self._attach_oom_observer(monitor)

    def _begin(self, monitor: Recording) -> None:
        self._served_mtime = time.time() - 5.0  # a request left over from an earlier run is stale
        monitor.add_step_hooks(start=self._claim_oom, end=self.on_step_end)
        self._thread = threading.Thread(target=self._run, name="gpudash-snapshots", daemon=True)
        self._thread.start()

    def _attach_oom_observer(self, monitor: Recording) -> None:
        global _ATTACHED
        attach = getattr(self._torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            monitor.unavailable("oom_observer", "this torch has no OOM observer; OOMs are recorded by the trainer")
            return
        with _ATTACH_LOCK:
            if not _ATTACHED:
                try:
                    attach(_dispatch_oom)
                except Exception as exc:  # noqa: BLE001 - e.g. cudaMallocAsync backend has no observer
                    monitor.unavailable("oom_observer", f"cannot attach the OOM observer: {exc}")
                    return
                _ATTACHED = True
        _LIVE.add(self)

    def _claim_oom(self, step: int) -> None:
        """A new step began and nobody recorded the observed OOM: record it on its own."""
        if self._oom_pending:
            self._oom_pending = False
            if self._monitor is not None:
                flush_observed_oom(self._monitor)

    def stop(self) -> None:
        _LIVE.discard(self)
        self._claim_oom(-1)
        self._stop.set()
        if self._thread is not None:
            try:
                self._queue.put(None, timeout=5)
            except queue.Full:
                pass
            self._thread.join(30)  # finish summaries queued before close
            self._thread = None
        if self._history_on:
            try:
                self._torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001
                pass
            self._history_on = False
        self._monitor = None

    @property
    def can_take(self) -> bool:
        """Whether this collector can take a snapshot here (CUDA, or a test's ``take_snapshot``)."""
        return self._take is not None

    # ---- training thread ----------------------------------------------------------------
    def request(self, reason: str = "requested") -> None:
        """Take a snapshot at the end of the current step (from any thread), stored with ``reason``:
        ``"requested"`` for a user's request (the dashboard's file), the asker's name for gpudash's own (the
        leak watch's ``"leak watch"``). Requests that meet at one step share its snapshot and their reasons."""
        with self._reasons_lock:
            if reason not in self._reasons:
                self._reasons.append(reason)

    def _take_reasons(self) -> str:
        """The reasons asked for since the last snapshot (``""`` when none), cleared."""
        if not self._reasons:  # the usual step: no lock taken
            return ""
        with self._reasons_lock:
            reasons, self._reasons = self._reasons, []
        return ", ".join(reasons)

    def on_step_end(self, step: int, row: dict[str, Any]) -> None:
        if row.get("failed"):
            return
        reason = self._take_reasons()
        if not reason and self.every and step % self.every == 0 and step > 0:
            reason = f"every {self.every} steps"
        if not reason:
            return
        assert self._take is not None
        snap = self._take()
        try:
            self._queue.put_nowait((snap, time.time(), step, reason))
        except queue.Full:
            self.dropped += 1

    def on_oom(self, device: int, alloc: int, device_limit: int, device_free: int) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        data: dict[str, Any] = {"source": "allocator_observer", "device": int(device),
                                "requested_bytes": int(alloc), "free_bytes": int(device_free),
                                "capacity_bytes": int(device_limit)}
        try:
            cuda = self._torch.cuda
            stats = cuda.memory_stats(device)
            allocated = int(stats.get("allocated_bytes.all.current", 0))
            reserved = int(stats.get("reserved_bytes.all.current", 0))
            data.update(allocated_bytes=allocated, reserved_bytes=reserved,
                        reserved_unallocated_bytes=max(0, reserved - allocated),
                        ooms=int(stats.get("num_ooms", 0)))
            total = int(cuda.get_device_properties(device).total_memory)
            if total != int(device_limit):
                data["device_total_bytes"] = total  # device_limit is a memory-fraction cap
        except Exception:  # noqa: BLE001 - the observer's own numbers still stand
            pass
        snap: dict[str, Any] | None = None
        now = time.monotonic()
        if now - self._last_oom_snapshot >= self.oom_snapshot_gap_s:
            self._last_oom_snapshot = now
            try:
                assert self._take is not None
                snap = self._take()
                data.update(_free_blocks(snap))
            except Exception:  # noqa: BLE001 - the event matters more than the map
                snap = None
        note_observed_oom(monitor, data)
        self._oom_pending = True
        if snap is not None:
            self._store(snap, time.time(), monitor.step_index, "oom")

    # ---- collector thread ---------------------------------------------------------------
    def _store(self, snap: dict[str, Any], t: float, step: int, reason: str) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        # imported here, on the collector's thread: pandas (which the summary uses) is not the training
        # thread's to import at the first step (most runs never take a snapshot)
        from gpudash.store.snapshot import snapshot_row, summarize

        try:
            # torch's own snapshot, not a stranger's file: the work budget is its size (a 1,000,000-entry
            # history is ~11 million entries and frames), every trace entry kept
            summary = summarize(snap, max_nodes=10**12)
        except Exception as exc:  # noqa: BLE001 - a strange snapshot must not stop the collector
            monitor.event("snapshot_failed", f"memory snapshot at step {step} not stored: {exc}", step=step)
            return
        monitor.put("snapshots", snapshot_row(summary, time=t, step=step, reason=reason))
        self.taken += 1

    def _poll_request(self) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        path = monitor.run_dir / SNAPSHOT_REQUEST_FILE
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return
        if mtime <= self._served_mtime:
            return
        self._served_mtime = mtime
        self.request("requested")
        if monitor.world_size <= 1:  # with several ranks each serves it once (by mtime) and it stays
            try:
                os.unlink(path)
            except OSError:
                pass

    def _run(self) -> None:
        next_poll = 0.0
        while True:
            got = True
            try:
                item = self._queue.get(timeout=max(0.0, next_poll - time.monotonic()))
            except queue.Empty:
                got = False
            if got and item is None:
                while True:  # drain what was queued before stop
                    try:
                        rest = self._queue.get_nowait()
                    except queue.Empty:
                        return
                    if rest is not None:
                        self._store(*rest)
            if got and item is not None:
                self._store(*item)
            if time.monotonic() >= next_poll:
                next_poll = time.monotonic() + self.poll_interval
                if not self._stop.is_set():
                    self._poll_request()
