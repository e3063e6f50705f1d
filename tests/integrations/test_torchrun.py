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
from gpudash.server.metrics import metrics_registry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "ddp_train.py"
STEPS = 12


def _torchrun(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_torchrun_two_ranks_record_side_by_side(tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    proc = _torchrun(EXAMPLE, str(run_dir), "--steps", str(STEPS), "--straggle-rank", "1", "--straggle-s", "0.03")
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
    # Prometheus sees both ranks of the run
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(metrics_registry(tmp_path)).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    steps = {s.labels["rank"]: s.value for s in samples if s.name == "gpudash_step"}
    assert steps == {"0": STEPS - 1, "1": STEPS - 1}
    skew = {s.name: s.value for s in samples if s.labels == {"run": "ddp"}}
    run = load_run(run_dir)
    newest = rank_skew(run).iloc[-1]
    run.close()
    assert skew["gpudash_step_skew_seconds"] == pytest.approx(newest["skew_s"])
    assert skew["gpudash_step_skew_ratio"] == pytest.approx(newest["skew_ratio"])
    # the same number as the analysis' newest step (rendered, not recomputed), and a real ratio
    assert skew["gpudash_memory_imbalance_ratio"] == pytest.approx(newest["memory_imbalance"])
    assert 0 <= skew["gpudash_memory_imbalance_ratio"] < 1  # the ranks hold the same model


@pytest.mark.slow
def test_hf_trainer_ddp_records_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    run_dir = tmp_path / "hf-ddp"
    _torchrun(EXAMPLES / "hf_trainer.py", str(run_dir), "--steps", "4", "--batch-size", "2", "--ctx", "16")
    run = load_run(run_dir)
    assert run.ranks == [0, 1] and run.status == "finished"
    assert run.meta["config"]["world_size"] == 2  # the Trainer really ran DDP (gloo)
    for rank in (0, 1):
        s = run.steps[run.steps["rank"] == rank]
        assert list(s["step"]) == [1, 2, 3, 4]  # the Trainer's global_step
        assert (s["samples"] == 2).all() and (s["tokens"] == 32).all()
        # each rank's own mean loss (not its share of the global one): about ln(256) untrained
        assert s["loss"].iloc[0] == pytest.approx(5.55, abs=0.5)
    run.close()
