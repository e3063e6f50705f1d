"""``gpudash run`` never ends silently without a run: a job that records no step says why on stderr (one
``gpudash:`` line), leaves a run folder with a ``no_steps`` event naming the cause, and ``gpudash check``
fails that run with one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash import load_run
from gpudash.zerocode import outcome

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _gpudash(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudash", *argv], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=240)


def _no_steps(tmp_path: Path, *command: str, rc: int = 0) -> str:
    """Runs COMMAND under gpudash run; checks the one line said, the run folder and check; returns the reason."""
    proc = _gpudash(tmp_path, "run", "--run-dir", str(tmp_path / "run"), "--", *command)
    assert proc.returncode == rc, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("gpudash: no step recorded: ")]
    assert len(said) == 1, proc.stderr
    why = said[0].removeprefix("gpudash: no step recorded: ")
    run = load_run(tmp_path / "run")
    try:
        assert len(run.steps) == 0 and run.status == "finished"
        assert run.events[run.events["kind"] == "no_steps"]["message"].tolist() == [why]
        assert run.meta["no_steps_reason"] == why
    finally:
        run.close()
    check = _gpudash(tmp_path, "check", str(tmp_path / "run"), "--no-oom")
    assert check.returncode == 1
    assert check.stdout.strip() == f"FAIL steps: {tmp_path / 'run'} recorded no step: {why}"
    return why


def test_torch_never_imported_said_and_exit_code_kept(tmp_path: Path) -> None:
    why = _no_steps(tmp_path, sys.executable, "-c", "import sys; print('hello'); sys.exit(3)", rc=3)
    assert why.startswith("the script never imported torch")


def test_a_shell_command_gets_the_last_word_from_gpudash_run(tmp_path: Path) -> None:
    why = _no_steps(tmp_path, "bash", "-c", "echo not python")
    assert why.startswith("the script never imported torch") and "exited with code" not in why


def test_a_script_that_crashes_before_training(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    why = _no_steps(tmp_path, sys.executable, "-c", "import torch\nraise ValueError('bad config')", rc=1)
    assert why.startswith("torch was imported (1 process(es)) but no optimizer stepped")
    assert why.endswith("(the script ended with ValueError first)")


def test_only_evaluated(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    why = _no_steps(tmp_path, sys.executable, "-c",
                    "import torch\nm = torch.nn.Linear(3, 1)\nwith torch.no_grad():\n    m(torch.randn(2, 3))\n")
    assert why.startswith("no backward() ran: the script only evaluated (1 evaluation pass(es)")


def test_recording_failed_names_the_cause(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "blocked").write_text("a file where the run folder would go")
    proc = _gpudash(tmp_path, "run", "--run-dir", str(tmp_path / "blocked" / "run"), "--", sys.executable, "-c",
                    "import torch\nm = torch.nn.Linear(3, 1)\nm(torch.randn(2, 3)).sum().backward()\nprint('ok')")
    assert proc.returncode == 0 and proc.stdout == "ok\n"
    said = [line for line in proc.stderr.splitlines() if line.startswith("gpudash: no step recorded: ")]
    assert len(said) == 1 and said[0].startswith(f"gpudash: no step recorded: recording failed: cannot record into "
                                                 f"{tmp_path / 'blocked' / 'run'}"), proc.stderr


def test_the_reason_comes_from_every_process_of_the_job() -> None:
    reason = outcome.no_steps_reason
    assert reason([]) == (outcome.NEVER_IMPORTED, False)
    assert reason([], torch_unseen=True) == (outcome.UNSEEN, False)
    # a launcher that imported torch and a rank that trained: steps, nothing to say
    assert reason([{"torch": True, "steps": 0}, {"torch": True, "steps": 5}]) == (None, True)
    assert reason([{"torch": True, "delegated": "transformers.Trainer"}]) == (None, True)
    assert reason([{"torch": True}, {"torch": True}])[0] == outcome.NOT_TRAINED.format(n=2)
    told = {"torch": True, "no_steps": "no backward() ran: the script only evaluated", "written": True}
    assert reason([{"torch": True}, told]) == (told["no_steps"], True)
    failed = {"torch": True, "failed": "cannot record into /x (RunError: read-only)", "written": False}
    assert reason([told, failed]) == ("recording failed: cannot record into /x (RunError: read-only)", False)


def test_states_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(outcome.ENV_STATE, str(tmp_path))
    outcome.report(torch=True)
    outcome.report(torch=True, steps=4)  # replaces what this process said before
    (tmp_path / "junk.json").write_text("{not json")
    assert outcome.read_states(str(tmp_path)) == [{"pid": os.getpid(), "torch": True, "steps": 4}]
    monkeypatch.setenv(outcome.ENV_STATE, str(tmp_path / "gone"))
    outcome.report(torch=True)  # the job is over: nothing raised


def test_torch_imported_where_the_hook_could_not_see_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    hide = ("import sys\nsys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != '_WhenImported']\n"
            "import torch\nm = torch.nn.Linear(3, 1)\nm(torch.randn(2, 3)).sum().backward()\n")
    why = _no_steps(tmp_path, sys.executable, "-c", hide)
    assert why.startswith("torch was imported where gpudash run's import hook could not see it")


def test_a_killed_job_that_recorded_steps_is_not_called_untrained(tmp_path: Path) -> None:
    # killed (SIGKILL, as the OOM killer does) after recording: its exit handler never ran, its steps are there
    script = ("import os, signal, torch\nm = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
              "for i in range(5):\n    opt.zero_grad()\n    m(torch.randn(8, 4)).sum().backward()\n    opt.step()\n"
              "import time; time.sleep(1.5)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    (tmp_path / "killed.py").write_text(script)
    # through a shell, so gpudash run waits for the job and gives the last word
    proc = _gpudash(tmp_path, "run", "--run-dir", str(tmp_path / "run"), "--", "bash", "-c",
                    f"{sys.executable} killed.py")
    assert proc.returncode != 0
    assert "no step recorded" not in proc.stderr, proc.stderr[-2000:]
    run = load_run(tmp_path / "run")
    try:
        assert len(run.steps) >= 1
        assert "no_steps" not in set(run.events["kind"]) if len(run.events) else True
    finally:
        run.close()
