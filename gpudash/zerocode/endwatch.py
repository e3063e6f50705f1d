"""The job's end cause when the job itself could not record it: a small watcher beside an exec'd ``gpudash run``.

Without ``--serve``, ``gpudash run`` becomes the job (exec): no process of ours is left to see how it ended, and
a process the kernel's OOM killer takes (SIGKILL) cannot record anything. So before the exec, ``gpudash run``
starts this watcher: a fresh interpreter (``python -I``, standard library only, a few MB), detached twice so it is
no descendant of the job (the host-memory sampler does not count it as a worker, the job never reaps it) and in
its own session (Ctrl-C at the terminal does not reach it). It holds a pidfd of the job's process and sleeps on
it (no polling, no CPU). When the job's process is gone it reads the run folder's rank databases: a rank whose
record was never closed (status still ``live``: its process, on this machine, is gone without a word: a signal it
could not catch) while

* the OOM-kill counter of the job's memory cgroup went up (``memory.events`` on cgroup v2,
  ``memory.oom_control`` on v1), or the machine's (``oom_kill`` of ``/proc/vmstat``), or
* its last host sample saw the machine's available memory under :data:`NEARLY_FULL` of the total,

is closed as ``crashed`` with ``end_cause: oom_killed`` and an ``end_reason`` that says which of these was seen,
so the summary, report, ``info`` and ``check`` name the OOM killer instead of a silent death. A job the kernel
took before it opened its run (no rank database, an OOM-kill counter up) gets a run folder that says so (its
only record the ``no_steps`` event, closed as crashed by the OOM killer): a run that records nothing says why.
The steps a killed process made in its writer's last interval (half a second) die with it. Anything else is
left as it is (the readers still infer a death from a stale heartbeat). Local run folders only (an object-store
run's rank database is a staging copy); no pidfd (Linux < 5.3, macOS): no watcher, the rows still say what they
can (:mod:`gpudash.analysis.hostmem`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import time
from pathlib import Path

from gpudash.collectors.procmem import VMSTAT, oom_kill_count
from gpudash.store.endcause import close_rank, rank_state
from gpudash.store.schema import OOM_KILLED, rank_from_db_name
from gpudash.units import human_bytes

__all__ = ["NEARLY_FULL", "OOM_KILLED", "Baseline", "cgroup_oom_kills", "counter_evidence", "killed_before_a_step",
           "main", "record_killed_before_a_step", "settle", "spawn", "vmstat_oom_kills"]

#: the last host sample's available memory under this share of the total: memory nearly full
NEARLY_FULL = 0.05
CGROUP_ROOT = "/sys/fs/cgroup"

Baseline = tuple[int | None, str | None, int | None]
"""(the machine's OOM kills, the job's memory-cgroup counter file, its OOM kills) when the job started."""


def vmstat_oom_kills(path: str = VMSTAT) -> int | None:
    """The machine's OOM-killer kills since boot (:func:`gpudash.collectors.procmem.oom_kill_count`)."""
    return oom_kill_count(path)


def _counter_file(pid: int, root: str = CGROUP_ROOT) -> str | None:
    """The file that counts OOM kills in ``pid``'s memory cgroup: v2 ``memory.events``, v1
    ``memory.oom_control``; None where neither is readable."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if "memory" in controllers.split(","):
            found.append(os.path.join(root, "memory", path.lstrip("/"), "memory.oom_control"))
        elif controllers == "":
            for base in (root, os.path.join(root, "unified")):
                found.append(os.path.join(base, path.lstrip("/"), "memory.events"))
    return next((f for f in found if cgroup_oom_kills(f) is not None), None)


def cgroup_oom_kills(path: str | None) -> int | None:
    """``oom_kill N`` of a cgroup's ``memory.events`` / ``memory.oom_control``; None where absent."""
    return vmstat_oom_kills(path) if path else None


def baseline(pid: int) -> Baseline:
    where = _counter_file(pid)
    return vmstat_oom_kills(), where, cgroup_oom_kills(where)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def settle(run_dir: str | os.PathLike[str], base: Baseline, now: float | None = None) -> list[int]:
    """Close, as killed by the OOM killer, each rank of the run whose record was left open when there is evidence
    of it (see the module doc); the ranks closed."""
    counters = counter_evidence(base)
    closed = []
    for db in sorted(Path(run_dir).glob("rank*.db")):
        rank = rank_from_db_name(db.name)
        state = rank_state(db) if rank is not None else None
        if rank is None or state is None:
            continue
        meta, avail, total = state
        if meta.get("status") != "live":
            continue  # it closed its own record: it said how it ended
        if meta.get("host") not in (None, socket.gethostname()):
            continue  # another machine's rank (a shared run folder): not ours to judge
        pid = meta.get("pid")
        if isinstance(pid, int) and _alive(pid):
            continue  # still running (a wrapper was killed, not this process)
        full = avail is not None and total and avail < NEARLY_FULL * total
        if counters is not None:
            why, kills = counters
        elif full:
            why = f"the machine had {human_bytes(avail or 0)} of {human_bytes(total or 0)} available at the last sample"
            kills = 0
        else:
            continue
        reason = (f"killed by the kernel's OOM killer (SIGKILL, no traceback): the process ended without "
                  f"closing its record and {why}")
        at = time.time() if now is None else now
        if close_rank(db, {"status": "crashed", "end_reason": reason, "end_cause": OOM_KILLED, "ended_at": at,
                           "oom_kills_during_run": kills}):
            closed.append(rank)
    return closed


def counter_evidence(base: Baseline) -> tuple[str, int] | None:
    """(what was seen, the kills) when the OOM-kill counter of the job's memory cgroup, or else the machine's,
    went up since ``base``; None when neither did (or neither can be read)."""
    kills0, where, cg0 = base
    kills, cg = vmstat_oom_kills(), cgroup_oom_kills(where)
    cg_up = cg - cg0 if cg is not None and cg0 is not None else 0
    vm_up = kills - kills0 if kills is not None and kills0 is not None else 0
    if cg_up > 0:
        return f"its memory cgroup's OOM-kill counter went up by {cg_up} while the job ran ({where})", cg_up
    if vm_up > 0:
        return f"the machine's OOM-kill counter went up by {vm_up} while the job ran (/proc/vmstat)", vm_up
    return None


def killed_before_a_step(run_dir: str | os.PathLike[str], base: Baseline) -> tuple[str, int] | None:
    """(the reason, the kills) for a job gone before it opened its run (no rank database: no step recorded)
    while an OOM-kill counter went up: the kernel took it (a job that ends any other way writes its own
    ``no_steps`` record at exit); None otherwise."""
    if any(Path(run_dir).glob("rank*.db")):
        return None
    counters = counter_evidence(base)
    if counters is None:
        return None
    return (f"killed by the kernel's OOM killer (SIGKILL, no traceback) before it recorded a step: "
            f"{counters[0]}"), counters[1]


def record_killed_before_a_step(run_dir: str | os.PathLike[str], base: Baseline) -> str | None:
    """Write the run of a job :func:`killed_before_a_step` (its only record: the ``no_steps`` event, closed as
    ``crashed`` with ``end_cause: oom_killed``); the reason written, or None when that was not the end."""
    found = killed_before_a_step(run_dir, base)
    if found is None:
        return None
    from gpudash.zerocode.outcome import write_no_steps  # the store's writer: only now, after the job

    why, kills = found
    write_no_steps(str(run_dir), why, crashed={"end_cause": OOM_KILLED, "oom_kills_during_run": kills})
    return why


def spawn(run_dir: str | os.PathLike[str]) -> bool:
    """Start the watcher of this process (about to exec the job); whether one was started. Never raises."""
    if not hasattr(os, "pidfd_open") or not hasattr(os, "fork"):
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:
        return False
    base = baseline(os.getpid())
    source = str(Path(__file__).resolve().parents[2])
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from gpudash.zerocode.endwatch import main; "
            "main(sys.argv[2:])")
    argv = [sys.executable, "-I", "-c", code, source, str(fd), str(run_dir), json.dumps(base)]
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError:
        os.close(fd)
        return False
    if pid:
        os.close(fd)
        os.waitpid(pid, 0)
        return True
    try:  # the first child: start the watcher and go, so that it is nobody's child but init's
        if os.fork() == 0:
            os.setsid()
            os.set_inheritable(fd, True)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)  # stderr kept: a pipe reader (a test, tee) sees the end once it is settled
            os.execv(sys.executable, argv)
    except BaseException:  # noqa: BLE001 - never let a forked copy of gpudash run go on
        pass
    os._exit(0)


def main(args: list[str]) -> None:
    """The watcher: ``FD RUN_DIR BASELINE_JSON``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    fd, run_dir, raw = int(args[0]), args[1], json.loads(args[2])
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while not poller.poll():
        pass
    base = (raw[0], raw[1], raw[2])
    try:
        if not settle(run_dir, base):
            record_killed_before_a_step(run_dir, base)
    except Exception as exc:  # noqa: BLE001 - the run keeps what its rows say
        print(f"gpudash: could not record how the job ended ({type(exc).__name__}: {exc})", file=sys.stderr)
