"""torchrun --nproc-per-node 2 on CPU (gloo): both ranks record into one run directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch.distributed.run")

from gpudash import load_run
from gpudash.analysis.ranks import rank_skew, straggler_summary

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"
STEPS = 12


@pytest.mark.slow
def test_torchrun_two_ranks_record_side_by_side(tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
           str(run_dir), "--steps", str(STEPS), "--straggle-rank", "1", "--straggle-s", "0.03"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"recorded {STEPS} steps x 2 ranks" in proc.stdout
    run = load_run(run_dir)
    assert run.ranks == [0, 1]
    assert run.status == "finished"
    assert run.meta["world_size"] == 2
    for rank in (0, 1):
        s = run.steps[run.steps["rank"] == rank]
        assert list(s["step"]) == list(range(STEPS))
        assert s["loss"].notna().all()
        m = run.memory[run.memory["rank"] == rank]
        assert len(m) == STEPS and (m["params_bytes"] > 0).all()
    skew = rank_skew(run)
    assert len(skew) == STEPS
    # rank 1 sleeps in its data phase; rank 0 waits for it in backward's all-reduce
    assert (skew["data_slowest_rank"] == 1).all()
    assert skew["data_skew_s"].median() > 0.02
    assert straggler_summary(skew)["steps"] == STEPS
    run.close()
