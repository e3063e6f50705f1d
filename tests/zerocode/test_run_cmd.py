"""``gpudash run -- COMMAND`` on unchanged scripts (examples/unchanged/): the script's
output and exit code pass through, step counts equal optimizer steps, parameter and
optimizer bytes are exact, every torchrun rank records into the run."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")

from gpudash import load_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "unchanged"
PLAIN = EXAMPLES / "train_plain.py"


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=240)


def gpudash_run(run_dir: Path, *command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(run_dir), "--", *command],
                cwd or run_dir.parent)


def _example(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _param_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _without_gpudash_lines(stderr: str) -> str:
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("gpudash: "))


def test_plain_script_output_exit_code_steps_loss_and_exact_bytes(tmp_path: Path) -> None:
    steps, batch, accum = 5, 16, 2
    cmd = [sys.executable, str(PLAIN), "--steps", str(steps), "--batch-size", str(batch), "--accum", str(accum)]
    bare = _run(cmd, tmp_path)
    rec = gpudash_run(tmp_path / "run", *cmd)
    assert bare.returncode == rec.returncode == 0, rec.stderr
    assert rec.stdout == bare.stdout  # the script's stdout, byte for byte
    assert _without_gpudash_lines(rec.stderr) == bare.stderr
    assert f"gpudash: recording into {tmp_path / 'run'}" in rec.stderr
    printed = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", rec.stdout, re.M)]
    assert len(printed) == steps

    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    s = run.steps
    assert list(s["step"]) == list(range(steps))  # one step per optimizer step; the eval after is not one
    assert (s["samples"] == batch * accum).all()  # the model's input batches, not the loss module's
    assert list(s["loss"]) == pytest.approx(printed, abs=2e-6)  # the sum of the (divided) micro-batch losses
    assert list(s["lr"]) == pytest.approx([1e-3 * 0.9**i for i in range(steps)])  # the rate each step used
    for phase in ("forward_s", "backward_s", "optimizer_s"):
        assert (s[phase] > 0).all(), phase
    assert (s["forward_s"] + s["backward_s"] + s["optimizer_s"] <= s["duration_s"]).all()
    model = _example(PLAIN).build_model()
    n_tensors = len(list(model.parameters()))
    mem = run.memory
    assert len(mem) == steps
    assert (mem["params_bytes"] == _param_bytes(model)).all()
    # from step 0 on, as an explicit Monitor records it: every micro-batch after the first runs with all
    # gradients; AdamW keeps two moments per parameter plus a 4-byte step counter per tensor, none before
    # its first step
    assert (mem["grads_bytes"] == _param_bytes(model)).all()
    assert mem["optimizer_bytes"].iloc[0] == 0
    assert (mem["optimizer_bytes"].iloc[1:] == 2 * _param_bytes(model) + 4 * n_tensors).all()
    assert mem["activations_bytes"].iloc[1] > 0  # sampled from the second step on, as the Monitor does
    run.close()


@pytest.mark.parametrize(("flags", "code"), [(["--exit-code", "3"], 3), (["--fail-at", "2"], 1)])
def test_exit_code_and_stderr_are_the_scripts(tmp_path: Path, flags: list[str], code: int) -> None:
    # the exit-3 case runs as `python -m train_plain`, the other as `python path/train_plain.py`
    target = ["-m", PLAIN.stem] if code == 3 else [str(PLAIN)]
    cmd = [sys.executable, *target, "--steps", "4", *flags]
    bare = _run(cmd, EXAMPLES)
    rec = gpudash_run(tmp_path / "run", *cmd, cwd=EXAMPLES)
    assert bare.returncode == rec.returncode == code
    assert rec.stdout == bare.stdout
    assert _without_gpudash_lines(rec.stderr) == bare.stderr  # the traceback too
    run = load_run(tmp_path / "run")
    if code == 1:
        assert run.status == "crashed" and "deliberate failure" in run.meta["end_reason"]
        assert list(run.steps["step"]) == [0, 1]
    else:
        assert run.status == "finished"
        assert list(run.steps["step"]) == [0, 1, 2, 3]
    run.close()


def test_a_failure_inside_gpudash_leaves_the_script_alone(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the run directory should go")
    cmd = [sys.executable, str(PLAIN), "--steps", "3"]
    bare = _run(cmd, tmp_path)
    rec = gpudash_run(blocker / "run", *cmd, cwd=tmp_path)
    assert rec.returncode == 0
    assert rec.stdout == bare.stdout
    problems = [line for line in rec.stderr.splitlines() if line.startswith("gpudash: cannot record")]
    assert len(problems) == 1 and "the script runs unrecorded" in problems[0]


def test_the_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(theirs)])
    script = "import os, sys, sitecustomize; print(os.environ.get('THEIRS_RAN'), sitecustomize.__file__, " \
             "any('_boot' in p for p in sys.path))"
    proc = _run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "r"), "--",
                 sys.executable, "-c", script], tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", str(theirs / "sitecustomize.py"), "False"]


def test_a_script_with_its_own_monitor_is_left_to_it(tmp_path: Path) -> None:
    script = tmp_path / "own.py"
    script.write_text(
        "import sys, torch\nfrom gpudash import Monitor\nfrom gpudash.testing import ToyLoop\n"
        "loop = ToyLoop((8, 16, 4))\n"
        "with Monitor(sys.argv[1], host_hz=0) as mon:\n"
        "    for _ in range(3):\n"
        "        with loop.step(mon):\n"
        "            pass\n")
    rec = gpudash_run(tmp_path / "run", sys.executable, str(script), str(tmp_path / "own"))
    assert rec.returncode == 0, rec.stderr
    assert "gpudash run leaves it to that" in rec.stderr
    assert not (tmp_path / "run" / "rank0.db").exists()
    run = load_run(tmp_path / "own")
    assert list(run.steps["step"]) == [0, 1, 2]
    run.close()


@pytest.mark.slow
def test_hf_trainer_script_is_recorded_by_its_callback_once(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    hf = EXAMPLES / "train_hf.py"
    rec = gpudash_run(tmp_path / "run", sys.executable, str(hf), "--steps", "4", "--output-dir", str(tmp_path / "o"))
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert "trained 4 steps" in rec.stdout
    run = load_run(tmp_path / "run")
    assert run.status == "finished"
    assert run.meta["config"]["framework"] == "transformers"  # the richer callback recorded it
    assert run.meta["total_steps"] == 4  # the auto-attached callback says how many: progress and ETA
    s = run.steps
    assert list(s["step"]) == [1, 2, 3, 4]  # global_step; not counted twice by the optimizer hooks
    assert (s["samples"] == 4).all() and (s["tokens"] == 4 * 16).all()
    assert s["grad_norm"].notna().all()
    n = _param_bytes(_example(hf).build_model())
    assert (run.memory["params_bytes"] == n).all()
    assert (run.memory["optimizer_bytes"].iloc[1:] >= 2 * n).all()  # AdamW's moments once it stepped
    run.close()


@pytest.mark.slow
def test_lightning_script_is_recorded_by_its_callback_once(tmp_path: Path) -> None:
    pytest.importorskip("lightning.pytorch")
    pl = EXAMPLES / "train_lightning.py"
    rec = gpudash_run(tmp_path / "run", sys.executable, str(pl), "--steps", "4", "--root", str(tmp_path / "o"))
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert "trained 4 steps" in rec.stdout
    run = load_run(tmp_path / "run")
    assert run.meta["config"]["framework"] == "lightning"
    assert list(run.steps["step"]) == [1, 2, 3, 4]
    assert run.meta["total_steps"] == 4
    model = _example(pl).build_model()
    n = _param_bytes(model)
    assert (run.memory["params_bytes"] == n).all()
    # Adam: two moments per parameter plus a 4-byte step counter per tensor
    assert (run.memory["optimizer_bytes"].iloc[1:] == 2 * n + 4 * len(list(model.parameters()))).all()
    run.close()


@pytest.mark.slow
def test_torchrun_two_ranks_record_into_one_run(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.run")
    ddp = EXAMPLES / "train_ddp.py"
    steps = 6
    rec = gpudash_run(tmp_path / "run", sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nproc-per-node", "2", str(ddp), "--steps", str(steps))
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert rec.stderr.count("gpudash: recording into") == 1
    run = load_run(tmp_path / "run")
    assert run.ranks == [0, 1] and run.status == "finished"
    n = _param_bytes(_example(ddp).build_model())
    for rank in (0, 1):
        assert list(run.steps[run.steps["rank"] == rank]["step"]) == list(range(steps))
        mem = run.memory[run.memory["rank"] == rank]
        assert (mem["params_bytes"] == n).all()
        assert (mem["optimizer_bytes"].iloc[1:] == n).all()  # SGD momentum: one buffer per parameter
        assert (run.steps[run.steps["rank"] == rank]["samples"] == 8).all()
    run.close()


def test_without_a_command_one_line_and_exit_2(tmp_path: Path) -> None:
    for argv, words in ((["run"], "give the command to run after --, e.g. gpudash run -- python train.py"),
                        (["run", "--", "no-such-program-xyz"], "no-such-program-xyz: command not found")):
        proc = _run([sys.executable, "-m", "gpudash", *argv], tmp_path)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[-1] == f"gpudash: error: {words}"
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_serve_prints_the_url_serves_beside_the_job_and_passes_the_exit_code(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/run/job"
    script = tmp_path / "poll.py"
    script.write_text(
        "import sys, time, urllib.request\n"
        "for _ in range(900):\n"
        "    try:\n"
        "        with urllib.request.urlopen(sys.argv[1], timeout=2) as r:\n"
        "            print('served', r.status, flush=True)\n"
        "            break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "time.sleep(1)\n"
        "sys.exit(5)\n")
    proc = _run([sys.executable, "-m", "gpudash", "run", "--serve", "--port", str(port), "--run-dir",
                 str(tmp_path / "job"), "--", sys.executable, str(script), url], tmp_path)
    assert proc.returncode == 5, proc.stderr
    assert proc.stdout == "served 200\n"
    assert f"gpudash: dashboard at {url}\n" in proc.stderr
    with socket.socket() as s:  # the dashboard went away with the job
        assert s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
def test_mp_spawn_ranks_come_from_the_process_group(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**_env(), "MASTER_PORT": str(port)}
    proc = _run([sys.executable, "-m", "gpudash", "run", "--run-dir", str(tmp_path / "run"), "--", sys.executable,
                 str(EXAMPLES / "train_spawn.py"), "--steps", "3"], tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(tmp_path / "run")
    assert run.ranks == [0, 1]  # not two writers of rank0.db
    for rank in (0, 1):
        assert list(run.steps[run.steps["rank"] == rank]["step"]) == [0, 1, 2]
    run.close()


@pytest.mark.slow
def test_a_process_the_training_process_starts_does_not_record_over_it(tmp_path: Path) -> None:
    script = tmp_path / "twice.py"
    script.write_text(
        "import subprocess, sys, torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(int(sys.argv[1])):\n"
        "    model(torch.randn(3, 4)).sum().backward()\n"
        "    opt.step()\n"
        "if sys.argv[1] == '2':\n"
        "    subprocess.run([sys.executable, __file__, '5'], check=True)\n")
    rec = gpudash_run(tmp_path / "run", sys.executable, str(script), "2")
    assert rec.returncode == 0, rec.stderr
    run = load_run(tmp_path / "run")
    assert run.ranks == [0] and run.status == "finished"
    assert list(run.steps["step"]) == [0, 1]  # the child's 5 steps did not land in rank 0's file
    run.close()
