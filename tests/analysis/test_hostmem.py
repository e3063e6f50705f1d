"""Host memory by process from recorded host rows: the peak by process, low available memory, the OOM killer."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpudash.analysis.facts import headline_rows, run_facts
from gpudash.analysis.hostmem import host_memory_verdicts, run_host_memory, worker_leaks
from gpudash.analysis.summary import status_verdict
from gpudash.store.run import DIED, Run
from gpudash.units import human_bytes

GB = 10**9


def _run(host: pd.DataFrame, status: str = "finished", reason: str | None = None) -> Run:
    steps = pd.DataFrame({"step": range(3), "time": [1.0, 2.0, 3.0], "duration_s": 1.0})
    r = Run(path=Path("x"), meta={"end_reason": reason} if reason else {}, status=status, steps=steps,
            memory=pd.DataFrame(), events=pd.DataFrame())
    r.__dict__["host"] = host
    r.__dict__["device"] = pd.DataFrame()
    return r


def _host(avail: list[float]) -> pd.DataFrame:
    n = len(avail)
    return pd.DataFrame({"time": np.arange(float(n)), "main_pss_bytes": 1.0 * GB,
                         "child0_pid": 11, "child0_pss_bytes": np.linspace(0.2, 0.5, n) * GB,
                         "child1_pid": 12, "child1_pss_bytes": 0.3 * GB,
                         "children": 2, "children_pss_bytes": (np.linspace(0.2, 0.5, n) + 0.3) * GB,
                         "shm_used_bytes": 64e6, "available_bytes": avail, "total_bytes": 16.0 * GB})


def test_peak_by_process_and_the_headline() -> None:
    h = run_host_memory(_run(_host([8 * GB] * 4)))
    assert h is not None and h.workers == 2 and not h.oom_killed and h.low_available_at is None
    assert h.peak_pss_bytes == {"main": 1.0 * GB, "worker 0": 0.5 * GB, "worker 1": 0.3 * GB}
    assert h.peak_total_pss_bytes == 1.8 * GB
    row = dict(headline_rows(run_facts(_run(_host([8 * GB] * 4)))))["host memory"]
    assert f"worker 0 {human_bytes(0.5 * GB)}" in row and "/dev/shm" in row
    [v] = host_memory_verdicts(_run(_host([8 * GB] * 4)))
    assert v.severity == "ok" and human_bytes(1.8 * GB) in v.title


def test_low_available_is_a_finding() -> None:
    h = run_host_memory(_run(_host([8 * GB, 1 * GB, 3 * GB])))
    assert h is not None and h.low_available_at == 1.0 and h.min_available_bytes == 1 * GB
    kinds = {v.kind: v.severity for v in host_memory_verdicts(_run(_host([8 * GB, 1 * GB, 3 * GB])))}
    assert kinds["host-memory-low"] == "warn"


def test_a_silent_death_with_memory_full_is_the_oom_killer() -> None:
    killed = _run(_host([8 * GB, 0.3 * GB]), status="crashed")  # no end reason: SIGKILL records none
    facts = run_facts(killed)
    assert facts.host_memory is not None and facts.host_memory.oom_killed
    assert facts.end_reason and "OOM killer" in facts.end_reason
    assert "OOM killer" in dict(headline_rows(facts))["ended"]
    assert "OOM killer" in status_verdict(killed).evidence[0]
    assert {v.kind: v.severity for v in host_memory_verdicts(killed)}["host-memory-low"] == "bad"
    # memory was fine at the end, or the run said why it ended: not the OOM killer
    for run in (_run(_host([0.3 * GB, 8 * GB]), status="crashed", reason=DIED),
                _run(_host([8 * GB, 0.3 * GB]), status="crashed", reason="exception: ValueError: x")):
        h = run_host_memory(run)
        assert h is not None and not h.oom_killed


def test_low_available_memory_alerts_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    import gpudash.alerts.watch as watch_mod
    from gpudash.alerts.watch import RunWatch
    from gpudash.monitor import Monitor
    from gpudash.options import AlertOptions

    monkeypatch.setattr(watch_mod, "FULL_EVERY_S", 0.0)  # every look evaluates (live: at least every 10 s)
    with Monitor(tmp_path / "r", host_hz=0, handle_signals=False, flush_interval=0.05) as mon:
        w = RunWatch(tmp_path / "r", AlertOptions(terminal=False, desktop=False))
        for avail in (8 * GB, 6 * GB):
            with mon.step():
                mon.recorder.put("host", {"time": time.time(), "step": mon.step_index, "available_bytes": avail,
                                          "total_bytes": 16 * GB})
        mon.flush()
        assert [a.kind for a in w.look(now=time.time() + 11)] == []
        with mon.step():
            mon.recorder.put("host", {"time": time.time(), "step": mon.step_index, "available_bytes": 0.5 * GB,
                                      "total_bytes": 16 * GB})
        mon.flush()
        found = [a for a in w.look(now=time.time() + 22) if a.kind == "host_memory"]
        assert len(found) == 1 and "OOM killer" in found[0].text
        w.close()


def test_a_worker_the_oom_killer_took_is_said() -> None:
    host = _host([8 * GB] * 3).assign(oom_kills=[0, 0, 1])
    run = _run(host, status="crashed", reason="exception: RuntimeError: DataLoader worker (pid 12) is killed by "
                                                "signal: Killed.")
    h = run_host_memory(run)
    assert h is not None and h.oom_kills == 1 and not h.oom_killed
    [low] = [v for v in host_memory_verdicts(run) if v.kind == "host-memory-low"]
    assert "killed 1 process" in low.title and not any("fell to" in e for e in low.evidence)


_KILLED = """
import os, signal, sys, time
from gpudash.monitor import Monitor
mon = Monitor(sys.argv[1], host_hz=0, flush_interval=0.05)
for _ in range(3):
    with mon.step():
        pass
mon.recorder.put("host", {"time": time.time(), "step": 2, "available_bytes": 0.2e9, "total_bytes": 16e9})
mon.flush()
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does: no handler runs, nothing more is written
"""


def test_a_process_killed_with_memory_full_says_oom_killer(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    import gpudash
    from gpudash.commands.info import summarize

    rc = subprocess.run([sys.executable, "-c", _KILLED, str(tmp_path / "k")], timeout=120).returncode
    assert rc == -signal.SIGKILL
    run = gpudash.load_run(tmp_path / "k")
    try:
        assert run.status == "crashed"
        ended = next(line for line in summarize(run) if line.startswith("ended"))
        assert "OOM killer" in ended
    finally:
        run.close()


def _workers(n: int, grow: float) -> pd.DataFrame:
    steps = np.arange(float(n))
    return pd.DataFrame({"time": steps, "step": steps, "main_pss_bytes": 1e9,
                         "child0_pid": 11, "child0_pss_bytes": 1e8 + grow * steps,
                         "child1_pid": 12, "child1_pss_bytes": 1e8 + 1e6 * np.sin(steps),
                         "children": 2, "available_bytes": 8 * GB, "total_bytes": 16 * GB})


def test_a_worker_growing_1_mb_per_step_is_named() -> None:
    [w] = worker_leaks(_workers(120, 1e6))
    assert w.process == "worker 0" and w.pid == 11 and w.growth.per_step_bytes == pytest.approx(1e6, rel=0.05)
    assert worker_leaks(_workers(120, 0.0)) == []
    # a slot whose process is replaced by a fresh one (a new epoch's worker, lower): judged per process
    respawn = _workers(120, 1e6)
    respawn.loc[60:, "child0_pid"] = 13
    respawn.loc[60:, "child0_pss_bytes"] = 1e8
    assert [w.pid for w in worker_leaks(respawn)] == [11]  # the replaced process grew; its successor did not
    run = _run(_workers(120, 1e6))
    kinds = {v.kind for v in host_memory_verdicts(run)}
    assert "worker-leak" in kinds and "worker 0 (pid 11) grows" in dict(headline_rows(run_facts(run)))["host memory"]


_GROWER = ("import sys\nkept = []\nfor line in sys.stdin:\n    kept.append(b'\\x01' * (1 << 20))\n"
           "    print('ok', flush=True)\n")


def test_a_real_worker_growing_each_step_alerts_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys
    import time

    import gpudash.alerts.watch as watch_mod
    from gpudash.alerts.watch import RunWatch
    from gpudash.monitor import Monitor
    from gpudash.options import AlertOptions

    monkeypatch.setattr(watch_mod, "FULL_EVERY_S", 0.0)
    child = subprocess.Popen([sys.executable, "-c", _GROWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        with Monitor(tmp_path / "g", host_hz=20, handle_signals=False, flush_interval=0.05) as mon:
            w = RunWatch(tmp_path / "g", AlertOptions(terminal=False, desktop=False, kinds=("worker_leak",)))
            for _ in range(80):
                with mon.step():
                    child.stdin.write("x\n")
                    child.stdin.flush()
                    child.stdout.readline()  # the worker has grown 1 MiB (the issue: 1 MB per step, named live)
                    time.sleep(0.05)
            mon.flush()
            time.sleep(0.2)
            found = w.look()
            w.close()
    finally:
        child.stdin.close()
        child.wait(30)
    assert [a.kind for a in found] == ["worker_leak"] and f"pid {child.pid}" in found[0].text
    m = re.search(r"grows ([\d.,]+) (KiB|MiB) per step", found[0].text)
    assert m is not None, found[0].text
    per_step = float(m.group(1).replace(",", "")) * (2**10 if m.group(2) == "KiB" else 2**20)
    assert 0.8 * 2**20 <= per_step <= 1.3 * 2**20, found[0].text  # the worker's 1 MiB a step
