"""The OOM killer's kill recorded as the run's end cause under exec-mode ``gpudash run`` (issue 46): the watcher
(:mod:`gpudash.zerocode.endwatch`) closes a rank left open with ``end_cause: oom_killed`` when the OOM-kill
counter went up or memory was nearly full, and leaves every other end alone; a real memory-limited cgroup kill
where the machine allows one makes it to the summary."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudash import load_run
from gpudash.analysis.hostmem import run_host_memory
from gpudash.analysis.summary import status_verdict
from gpudash.store.schema import OOM_KILLED
from gpudash.store.writer import Recorder
from gpudash.zerocode import endwatch

ROOT = Path(__file__).resolve().parents[2]


def _open_rank(run: Path, available: float, total: float = 16e9) -> None:
    """A rank whose process died without closing its record (its status stays ``live``), with one host row."""
    rec = Recorder(run, rank=0, meta={"name": "r", "world_size": 1})
    rec.put("steps", {"step": 0, "time": time.time(), "duration_s": 0.1})
    rec.put("host", {"time": time.time(), "step": 0, "available_bytes": available, "total_bytes": total})
    assert rec.flush()
    rec._stop.set()  # the writer stops as a killed process's would: nothing closed
    rec._wake.set()
    rec._thread.join(5)
    rec._conn.close()
    with sqlite3.connect(run / "rank0.db") as c:  # a long-gone pid: readers see it dead
        c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('pid', ?)", (json.dumps(2**22 + 7),))


def _meta(run: Path) -> dict[str, object]:
    with sqlite3.connect(run / "rank0.db") as c:
        return {k: json.loads(v) for k, v in c.execute("SELECT key, value FROM meta")}


def test_counter_up_closes_the_rank_as_oom_killed_and_the_summary_says_so(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _open_rank(run, available=8e9)
    now = endwatch.vmstat_oom_kills()
    if now is None:
        pytest.skip("this kernel does not count OOM kills (/proc/vmstat has no oom_kill)")
    assert endwatch.settle(run, (now - 1, None, None)) == [0]
    meta = _meta(run)
    assert meta["status"] == "crashed" and meta["end_cause"] == OOM_KILLED
    assert "OOM-kill counter went up by 1" in str(meta["end_reason"])
    loaded = load_run(run)
    assert loaded.status == "crashed"
    h = run_host_memory(loaded)
    assert h is not None and h.oom_killed  # memory was not nearly full at the last sample: the counter says it
    verdict = status_verdict(loaded)
    assert "killed by the kernel's OOM killer" in verdict.evidence[0]


def test_memory_nearly_full_at_the_last_sample_is_evidence_too(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _open_rank(run, available=0.2e9)
    kills = endwatch.vmstat_oom_kills()
    assert endwatch.settle(run, (kills, None, None)) == [0]
    assert "0.2 GiB" not in str(_meta(run)["end_reason"])  # said in binary units
    assert "available at the last sample" in str(_meta(run)["end_reason"])


def test_no_evidence_and_a_closed_record_are_left_alone(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _open_rank(run, available=8e9)
    kills = endwatch.vmstat_oom_kills()
    assert endwatch.settle(run, (kills, None, None)) == []  # a plain SIGKILL: the readers' inference stands
    assert _meta(run)["status"] == "live"
    done = tmp_path / "done"
    rec = Recorder(done, rank=0, meta={"name": "d", "world_size": 1})
    rec.close("finished", "closed")
    assert endwatch.settle(done, ((kills or 1) - 1, None, None)) == []
    assert _meta(done)["status"] == "finished"


def test_a_job_killed_before_its_first_step_gets_a_run_that_says_so(tmp_path: Path) -> None:
    """No rank database (the kernel took the job before it opened its run) and its cgroup's counter went up: the
    run folder is written as crashed, killed by the OOM killer, and ``gpudash check`` names that as why there
    is no step. The counter file stands in for a cgroup's ``memory.events`` (``oom_kill N``)."""
    events = tmp_path / "memory.events"
    events.write_text("oom 0\noom_kill 0\n")
    base = (None, str(events), 0)
    run = tmp_path / "run"
    assert endwatch.record_killed_before_a_step(run, base) is None  # nothing went up: not an OOM kill
    assert not run.exists()
    events.write_text("oom 1\noom_kill 1\n")
    why = endwatch.record_killed_before_a_step(run, base)
    assert why is not None and "before it recorded a step" in why and "went up by 1" in why
    loaded = load_run(run)
    assert loaded.status == "crashed" and loaded.rank_meta[0]["end_cause"] == OOM_KILLED
    assert endwatch.record_killed_before_a_step(run, base) is None  # a run folder with a rank: settled already
    from gpudash.analysis.facts import run_facts
    from gpudash.commands.check import GateRules, check

    [outcome] = check(run_facts(loaded), GateRules(no_oom=True), run="run")
    assert not outcome.passed and outcome.rule == "steps" and "killed by the kernel's OOM killer" in outcome.text


def _limited_cgroup(tmp_name: str, limit: int) -> tuple[Path, str]:
    """A child memory cgroup limited to ``limit`` bytes (v2 where its memory controller is delegated, else v1);
    pytest.skip with the reason where this machine allows neither."""
    v2 = Path("/sys/fs/cgroup")
    why = []
    if "memory" in (v2 / "cgroup.subtree_control").read_text().split() if (v2 / "cgroup.subtree_control").exists() \
            else False:
        group = v2 / tmp_name
        try:
            group.mkdir()
            (group / "memory.max").write_text(str(limit))
            (group / "memory.swap.max").write_text("0")
            return group, "v2"
        except OSError as exc:
            why.append(f"cgroup v2: {exc}")
    else:
        why.append("cgroup v2: no memory controller delegated")
    v1 = Path("/sys/fs/cgroup/memory")
    if v1.is_dir():
        group = v1 / tmp_name
        try:
            group.mkdir()
            (group / "memory.limit_in_bytes").write_text(str(limit))
            return group, "v1"
        except OSError as exc:
            why.append(f"cgroup v1: {exc}")
    else:
        why.append("no cgroup v1 memory hierarchy")
    pytest.skip("cannot make a memory-limited cgroup here (" + "; ".join(why) + ")")


#: past the cgroup's limit: the kernel's OOM killer takes the process
HOG = """
hog = []
while True:
    hog.append(bytearray(32 << 20))
    hog[-1][::4096] = b"x" * len(hog[-1][::4096])
"""

SCRIPT = """
import torch
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
""" + HOG

#: the kernel takes the process before its first step: a run that records no step says why
SCRIPT_NO_STEP = "import torch\n" + HOG


@pytest.mark.slow
@pytest.mark.parametrize("how,source", [("exec", SCRIPT), ("wrapper", SCRIPT), ("exec", SCRIPT_NO_STEP),
                                        ("wrapper", SCRIPT_NO_STEP)],
                         ids=["exec", "wrapper", "exec-no-step", "wrapper-no-step"])
def test_a_real_cgroup_oom_kill_is_the_runs_end_cause(tmp_path: Path, how: str, source: str) -> None:
    """exec: gpudash run becomes the job (the watcher records it); wrapper: a shell runs the job and gpudash run
    waits for it (it records it itself). The steps a process made in its last half second may die with it in
    the writer's queue (SIGKILL leaves no time): ``gpudash check`` names the OOM killer either way."""
    group, version = _limited_cgroup(f"gpudash-test-{os.getpid()}", 1 << 30)
    try:
        script = tmp_path / "hog.py"
        script.write_text(source)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                            if p])
        procs = group / "cgroup.procs"

        def join() -> None:  # the job (and its watcher, forked from it) inside the limited group
            procs.write_text(str(os.getpid()))

        job = [sys.executable, str(script)] if how == "exec" else ["sh", "-c", f'exec "{sys.executable}" "{script}"']
        proc = subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "run"), "--", *job], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300, preexec_fn=join)
        assert proc.returncode == -9, proc.stderr[-3000:]  # SIGKILL, as the OOM killer sends
        if how == "wrapper":
            assert "killed by the kernel's OOM killer" in proc.stderr, proc.stderr[-3000:]
        run = load_run(tmp_path / "run")
        assert run.status == "crashed"
        assert run.rank_meta[0]["end_cause"] == OOM_KILLED, run.rank_meta[0]
        assert "memory cgroup's OOM-kill counter went up" in str(run.meta["end_reason"])
        assert "killed by the kernel's OOM killer" in status_verdict(run).evidence[0]
        check = subprocess.run([sys.executable, "-m", "gpudash", "check", str(tmp_path / "run"),
                                "--no-oom"], cwd=tmp_path,
                               env=env, capture_output=True, text=True, timeout=120)
        assert check.returncode == 1 and "OOM killer" in check.stdout, (version, check.stdout, check.stderr)
        info = subprocess.run([sys.executable, "-m", "gpudash", "info", str(tmp_path / "run")], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
        assert "killed by the kernel's OOM killer" in info.stdout, info.stdout
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
