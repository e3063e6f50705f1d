"""``gpudash run`` on a script preempted and resumed from its checkpoint into the same ``--run-dir`` (issue 43):
an AdamW script that checkpoints every 50 steps is killed by SIGTERM (exit 143) after step 129 and resumed from
its step-100 checkpoint to step 199. The run reads back as steps 0..199 once each with the losses the script
printed last, one resume event, attempt 1's rows still there; on a local folder and on S3 (moto's server)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers.s3 import (
    bucket,
    s3,  # noqa: F401 - the moto S3 server fixture (requested by name below)
)

from gpudash import load_run

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "unchanged" / "train_resume.py"


def _gpudash_run(where: str, ckpt: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    return subprocess.run([sys.executable, "-m", "gpudash", "run", "--run-dir", where, "--", sys.executable,
                           str(SCRIPT), "--ckpt", str(ckpt), *extra],
                          cwd=ckpt.parent, env=env, capture_output=True, text=True, timeout=300)


def _printed(*outputs: str) -> dict[int, float]:
    """The loss the script printed last for each step."""
    out: dict[int, float] = {}
    for text in outputs:
        for m in re.finditer(r"^step (\d+) loss (\S+)$", text, re.M):
            out[int(m.group(1))] = float(m.group(2))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["local", "s3"])
def test_a_preempted_script_resumed_from_its_checkpoint_reads_as_one_run(kind: str, tmp_path: Path,
                                                                         request: pytest.FixtureRequest) -> None:
    if kind == "s3":
        request.getfixturevalue("s3")
        bucket("runs")
        where = "s3://runs/preempted"
    else:
        where = str(tmp_path / "runs" / "preempted")
    ckpt = tmp_path / "ckpt"
    first = _gpudash_run(where, ckpt, "--stop-after", "129")
    # died of the SIGTERM as the script alone does (a shell says exit 143): gpudash run keeps the script's end
    assert first.returncode == -signal.SIGTERM, first.stderr[-3000:]
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-100.pt", "step-50.pt"]
    second = _gpudash_run(where, ckpt, "--resume")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "attempt 2 resumed at step 100 after " in second.stderr
    printed = _printed(first.stdout, second.stdout)
    assert sorted(printed) == list(range(200))
    run = load_run(where)
    try:
        s = run.steps
        assert s["step"].tolist() == list(range(200))
        assert s["loss"].tolist() == [printed[i] for i in range(200)]
        assert s["attempt"].tolist() == [1] * 100 + [2] * 100
        resumed = run.events[run.events["kind"] == "resume"]
        assert len(resumed) == 1
        data = resumed["data"].iloc[0]
        assert data["step"] == 100 and data["previous_end"] == "killed" and data["previous_last_step"] == 129
        assert data["step_from"] == "from the optimizer state the script loaded (AdamW step 100)"
        assert run.status == "finished" and run.meta["attempts"][0]["reason"] == "SIGTERM"
    finally:
        run.close()
    every = load_run(where, attempts="all")
    try:
        one = every.steps[every.steps["attempt"] == 1]
        assert one["step"].tolist() == list(range(130)) and len(every.steps) == 230
        assert one["loss"].tolist() == [_printed(first.stdout)[i] for i in range(130)]
    finally:
        every.close()
    info = subprocess.run([sys.executable, "-m", "gpudash", "info", where], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert info.returncode == 0, info.stderr
    assert re.search(r"^attempts +2 attempts: attempt 2 resumed at step 100 after ", info.stdout, re.M)
    assert re.search(r"^steps +200,", info.stdout, re.M) and re.search(r"^loss spikes +0$", info.stdout, re.M)
