"""Host memory by process: the training process and every process it started, and ``/dev/shm``.

DataLoader workers, compile workers and anything else the script spawned hold host memory that the
training process's RSS does not count. Each is measured by its unique and proportional set (USS, PSS:
``psutil``'s ``memory_full_info``, one read of ``/proc/PID/smaps_rollup``), so pages N forked workers share
copy-on-write are counted once over the processes, not N times as RSS would. Columns of the ``host`` row:

* ``main_uss_bytes``, ``main_pss_bytes``: the training process;
* ``children``, ``children_rss_bytes``, ``children_uss_bytes``, ``children_pss_bytes``: how many
  descendants, and their sums;
* ``child<i>_pid``, ``child<i>_rss_bytes``, ``child<i>_pss_bytes``, ``child<i>_uss_bytes``: one slot per live descendant (at most
  :data:`MAX_SLOTS`), kept by a process while it lives and given to the next one when it exits, so a
  DataLoader's workers, respawned each epoch, keep their slots 0..N-1;
* ``shm_used_bytes``: what ``/dev/shm`` holds (the workers hand tensors to the main process there; the
  mount is the machine's, so other jobs' files count too);
* ``oom_kills``: processes the kernel's OOM killer killed on the machine since the sampler started
  (``oom_kill`` of ``/proc/vmstat``, Linux 4.13+): a DataLoader worker it took shows here;
* ``pinned_bytes``, ``pinned_active_bytes``: page-locked host memory held by torch's pinned (CUDA host) allocator
  (``pin_memory=True`` loaders, ``tensor.pin_memory()``, CPU offload buffers): what it holds, cached blocks
  included, and what is handed out (``torch.cuda.host_memory_stats()``, torch 2.5+; a host-side read under the
  allocator's lock, no GPU sync). Where there is no CUDA, or the torch has no such stats, :func:`open_pinned`
  says why once (``unavailable_pinned_memory``), never a silent zero.

Bounded cost: the descendants are listed (a walk of ``/proc``) at most every :data:`RESCAN_S` seconds and
between scans only the known ones are read; a process that exited is dropped when its read fails. RSS is
read every sample; USS/PSS, whose read walks the process's pages, within :data:`BUDGET` of one core for all
the processes together (of n processes, one whose read took c seconds keeps its last USS/PSS for n c / BUDGET
seconds).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BUDGET", "MAX_SLOTS", "NO_CUDA", "RESCAN_S", "SHM_ROOT", "VMSTAT", "ProcMem", "oom_kill_count",
           "open_pinned", "pinned_reader", "shm_used"]

#: the descendants are listed again at most this often (a walk of /proc costs ~0.1 ms per process on the machine)
RESCAN_S = 5.0
#: per-process columns for at most this many descendants; the rest count in the sums only
MAX_SLOTS = 16
#: the share of one core the USS/PSS reads of all the processes together may take (see :meth:`ProcMem._read`)
BUDGET = 0.02
#: where POSIX shared memory lives (torch's ``file_descriptor`` sharing strategy allocates there)
SHM_ROOT = "/dev/shm"
#: the kernel's event counters (``oom_kill N``)
VMSTAT = "/proc/vmstat"


#: the reported state of a CPU-only run (said once, in ``unavailable_pinned_memory``)
NO_CUDA = "no CUDA: no pinned memory"


def open_pinned() -> tuple[Callable[[], dict[str, float]] | None, str | None]:
    """``(read, None)``: ``read()`` returns ``pinned_bytes`` and ``pinned_active_bytes`` from torch's pinned host
    allocator; ``(None, why)`` where it cannot be measured (no torch loaded, no CUDA, a torch without
    ``torch.cuda.host_memory_stats``). Only a torch the training process already imported is used."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None, "torch is not loaded: no pinned memory"
    try:
        cuda = bool(torch.cuda.is_available())
    except Exception as exc:  # noqa: BLE001 - a broken driver is a state, not a crash
        return None, f"{NO_CUDA} (CUDA check failed: {type(exc).__name__}: {exc})"
    if not cuda:
        return None, NO_CUDA
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None:
        return None, (f"torch {getattr(torch, '__version__', '?')} has no torch.cuda.host_memory_stats "
                      "(torch 2.5+): pinned memory not measured")
    return pinned_reader(stats), None


def pinned_reader(stats: Callable[[], Any]) -> Callable[[], dict[str, float]]:
    """The ``pinned_*`` columns from a ``host_memory_stats``-like function (flat ``"allocated_bytes.current"``
    keys); a missing key is left out."""
    def read() -> dict[str, float]:
        s = stats()
        row = {}
        for col, key in (("pinned_bytes", "allocated_bytes.current"), ("pinned_active_bytes", "active_bytes.current")):
            if key in s:
                row[col] = float(s[key])
        return row
    return read


def shm_used(root: str = SHM_ROOT) -> int | None:
    """Bytes in use on the ``root`` mount, or None where it is not one (macOS, a container without it)."""
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    return int((st.f_blocks - st.f_bfree) * st.f_frsize)


def oom_kill_count(path: str = VMSTAT) -> int | None:
    """The machine's OOM-killer kills since boot, or None where the kernel does not count them."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class ProcMem:
    """USS/PSS of a process and its descendants; :meth:`sample` returns the ``host`` row's columns.

    ``proc`` is a ``psutil.Process``. Raises nothing: a process that cannot be read is left out, and
    :attr:`unavailable` says once why the main process could not be (then only ``shm_used_bytes`` is sampled).
    """

    def __init__(self, proc: Any, *, rescan_s: float = RESCAN_S, max_slots: int = MAX_SLOTS,
                 shm_root: str = SHM_ROOT, vmstat: str = VMSTAT) -> None:
        import psutil

        self._psutil = psutil
        self.proc = proc
        self.rescan_s = rescan_s
        self.max_slots = max_slots
        self.shm_root = shm_root
        self.vmstat = vmstat
        self._kills0 = oom_kill_count(vmstat)
        self.unavailable: str | None = None
        self._children: list[Any] = []
        self._scanned = float("-inf")
        self._slots: dict[int, int] = {}  # pid -> slot
        self._full: dict[int, tuple[int, int, float]] = {}  # pid -> (uss, pss, when due again)

    def _rescan(self, now: float) -> None:
        self._scanned = now
        try:
            found = self.proc.children(recursive=True)
        except self._psutil.Error:
            return
        known = {p.pid for p in self._children}
        self._children += [p for p in found if p.pid not in known]

    def _slot(self, pid: int) -> int | None:
        slot = self._slots.get(pid)
        if slot is None:
            used = set(self._slots.values())
            slot = next((i for i in range(self.max_slots) if i not in used), None)
            if slot is not None:
                self._slots[pid] = slot
        return slot

    def _read(self, p: Any, now: float) -> tuple[int, int, int]:
        """``(rss, uss, pss)`` of ``p``: RSS every time (``statm``, ~20 µs); USS/PSS when due, else the
        last ones. The kernel walks every resident page of the process for them (~15 ms for 200 MB on a loaded
        machine), so of n processes one whose read took c seconds is read again only after n c / :data:`BUDGET`:
        all of them together take at most BUDGET of one core."""
        rss = int(p.memory_info().rss)
        last = self._full.get(p.pid)
        if last is None or now >= last[2]:
            t0 = time.perf_counter()
            full = p.memory_full_info()
            cost = time.perf_counter() - t0
            last = (int(full.uss), int(full.pss), now + cost * (1 + len(self._children)) / BUDGET)
            self._full[p.pid] = last
        return rss, last[0], last[1]

    def sample(self, now: float | None = None) -> dict[str, float]:
        now = time.monotonic() if now is None else now
        row: dict[str, float] = {}
        shm = shm_used(self.shm_root)
        if shm is not None:
            row["shm_used_bytes"] = shm
        kills = oom_kill_count(self.vmstat) if self._kills0 is not None else None
        if kills is not None and self._kills0 is not None:
            row["oom_kills"] = kills - self._kills0
        if self.unavailable is not None:
            return row
        error = self._psutil.Error
        try:
            _, row["main_uss_bytes"], row["main_pss_bytes"] = self._read(self.proc, now)
        except error as exc:  # AccessDenied where /proc/self/smaps is not readable (a hardened kernel)
            self.unavailable = f"per-process memory unreadable: {exc}"
            return row
        if now - self._scanned >= self.rescan_s:
            self._rescan(now)
        alive, rss, uss, pss = [], 0, 0, 0
        for p in self._children:
            try:
                r, u, q = self._read(p, now)
            except error:  # exited (or not ours to read): dropped, its slot freed
                self._slots.pop(p.pid, None)
                self._full.pop(p.pid, None)
                continue
            alive.append(p)
            rss, uss, pss = rss + r, uss + u, pss + q
            slot = self._slot(p.pid)
            if slot is not None:
                row[f"child{slot}_pid"] = p.pid
                row[f"child{slot}_rss_bytes"] = r
                row[f"child{slot}_pss_bytes"] = q
                row[f"child{slot}_uss_bytes"] = u
        self._children = alive
        row["children"] = len(alive)
        row["children_rss_bytes"] = rss
        row["children_uss_bytes"] = uss
        row["children_pss_bytes"] = pss
        return row
