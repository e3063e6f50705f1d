"""Every way a training process ends: finished, exception, Ctrl-C, SIGTERM, SIGKILL;
and several ranks writing one run directory at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import gpudash

CHILD = textwrap.dedent("""
    import faulthandler, signal, sys, time, gpudash
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for the stacks of a hang
    # Ctrl-C as a script started from a terminal gets it: a shell without job control starts background
    # commands with SIGINT ignored, which their children inherit (so did this child when the suite was
    # started with `cmd &` from a script: Ctrl-C then does nothing, with or without gpudash)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    run_dir, mode, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mon = gpudash.Monitor(run_dir, rank=rank, world_size=2 if mode == "rank" else 1, host_hz=5)
    if mode == "with":
        with mon:
            for i in range(50):
                with mon.step():
                    mon.log(i=i)
            raise RuntimeError("bad batch")
    for i in range(10**9):
        with mon.step(samples=1):
            time.sleep(0.002)
            mon.log(i=i)
        print(i, time.time(), flush=True)
        if mode == "raise" and i == 40:
            raise ValueError("nan loss")
        if mode == "rank" and i == 199:
            mon.close()
            break
""")


def _spawn(run_dir: Path, mode: str, rank: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir), mode, str(rank)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_until(proc: subprocess.Popen[str], step: int) -> tuple[int, float]:
    assert proc.stdout is not None
    for line in proc.stdout:
        i, t = line.split()
        if int(i) >= step:
            return int(i), float(t)
    raise AssertionError(f"child ended early: {proc.stderr.read() if proc.stderr else ''}")


def _ended(proc: subprocess.Popen[str], timeout: float) -> str:
    """The child's stdout once it has exited; one that does not exit in ``timeout`` fails the test with its
    threads' stacks (py-spy) and its stderr, so a hang says where it hangs."""
    from gpudash.collectors.stacks import find_py_spy

    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        spy = find_py_spy()  # with native frames; needs ptrace, which a container may refuse
        dump = subprocess.run([spy, "dump", "--native", "--pid", str(proc.pid)], capture_output=True, text=True,
                              timeout=60) if spy else None
        proc.send_signal(signal.SIGUSR1)  # faulthandler: every thread's Python stack, on stderr
        time.sleep(1.0)
        proc.kill()
        out, err = proc.communicate()
        lines = out.splitlines()
        raise AssertionError(f"the child did not exit within {timeout:g} s (it printed {len(lines)} more lines, "
                             f"the last {lines[-1:]}):\npy-spy: {dump.stdout + dump.stderr if dump else 'not found'}"
                             f"\nstderr: {err[-6000:]}") from None


def test_sigkill_loses_at_most_one_second(tmp_path: Path) -> None:
    proc = _spawn(tmp_path / "r", "loop")
    _read_until(proc, 300)
    t_kill = time.time()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    run = gpudash.load_run(tmp_path / "r")
    assert run.status == "crashed"
    assert run.steps["time"].max() >= t_kill - 1.0
    assert run.steps["step"].tolist() == list(range(len(run.steps)))


@pytest.mark.parametrize("sig, reason", [(signal.SIGINT, "KeyboardInterrupt"), (signal.SIGTERM, "SIGTERM")])
def test_signals_flush_everything(tmp_path: Path, sig: int, reason: str) -> None:
    proc = _spawn(tmp_path / "r", "loop")
    _read_until(proc, 100)
    proc.send_signal(sig)
    out = _ended(proc, 30)
    last = max([int(line.split()[0]) for line in out.splitlines()] + [100])
    run = gpudash.load_run(tmp_path / "r")
    assert run.status == "crashed" and run.meta["end_reason"] == reason
    assert run.steps["step"].max() >= last  # nothing printed as done was lost


def test_uncaught_exception_is_recorded(tmp_path: Path) -> None:
    proc = _spawn(tmp_path / "r", "raise")
    proc.communicate(timeout=60)
    run = gpudash.load_run(tmp_path / "r")
    assert run.status == "crashed"
    assert run.meta["end_reason"] == "exception: ValueError: nan loss"
    assert run.steps["step"].max() == 40


def test_exception_inside_context_manager(tmp_path: Path) -> None:
    proc = _spawn(tmp_path / "r", "with")
    proc.communicate(timeout=60)
    run = gpudash.load_run(tmp_path / "r")
    assert run.status == "crashed" and "RuntimeError: bad batch" in run.meta["end_reason"]
    assert len(run.steps) == 50


def test_two_ranks_write_one_run_directory(tmp_path: Path) -> None:
    procs = [_spawn(tmp_path / "r", "rank", rank) for rank in (0, 1)]
    for p in procs:
        p.communicate(timeout=120)
        assert p.returncode == 0
    run = gpudash.load_run(tmp_path / "r")
    assert run.status == "finished" and run.ranks == [0, 1]
    assert run.steps.groupby("rank")["step"].count().tolist() == [200, 200]
    run.close()
    # a finished run is opened immutable: reading it leaves no -wal/-shm files behind
    assert sorted(os.listdir(tmp_path / "r")) == ["rank0.db", "rank1.db", "run.json"]
