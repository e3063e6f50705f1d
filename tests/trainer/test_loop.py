from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpudash
from gpudash.options import MonitorOptions
from gpudash.trainer.loop import _SpikeDetector


def test_tiny_preset_trains_50_steps_under_the_monitor(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("tiny", steps=50, monitor=MonitorOptions(host_hz=0.0, handle_signals=False))
    assert r.status == "finished"
    s = r.steps
    assert s["step"].tolist() == list(range(50))
    for col in ("data_s", "forward_s", "backward_s", "optimizer_s", "loss", "grad_norm", "lr", "batch_size",
                "micro_batch", "skipped_steps", "tokens"):
        assert col in s and s[col].notna().all(), col
    assert s["loss"].iloc[-5:].mean() < s["loss"].iloc[:5].mean() - 0.5  # it learns
    assert s["lr"].max() == pytest.approx(1e-3)
    est = r.meta["estimate"]
    assert set(est) >= {"params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes"}
    pre = r.meta["preflight"]
    assert {"capacity_bytes", "precision_strategy", "fallback_plan", "warnings"} <= set(pre)
    assert "preflight" in set(r.events["kind"])
    assert r.meta["train_summary"]["tokens"] == s["tokens"].sum()
    assert r.meta["total_steps"] == 50  # --steps: progress and ETA on every surface


def test_slow_data_makes_the_data_phase_long(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("slow", steps=3, batch=2, seq_len=16, slow_data_ms=30)
    assert (r.steps["data_s"] >= 0.03).all()
    assert any("data phase sleeps" in w for w in r.meta["preflight"]["warnings"])


def test_train_returns_the_run_dir(tmp_path: Path) -> None:
    from gpudash.trainer import TrainConfig, train

    out = train(TrainConfig(run_dir=tmp_path / "x", steps=1, batch=1, seq_len=8, device="cpu",
                            monitor=MonitorOptions(host_hz=0.0, handle_signals=False)))
    assert out == tmp_path / "x"
    r = gpudash.load_run(out)
    assert len(r.steps) == 1 and r.status == "finished"
    r.close()


def test_spike_detector_flags_a_jump_and_not_noise() -> None:
    d = _SpikeDetector()  # the one rule of gpudash.analysis.stability, on the trailing window
    for i in range(30):
        assert d.check(3.0 + 0.01 * (i % 3)) is None
    assert d.check(6.0) is not None
    assert d.check(3.01) is None


@pytest.mark.slow
def test_two_ranks_under_torchrun_write_one_run(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", "gpudash", "train", "--steps", "2", "--batch", "2",
                          "--seq-len", "16", "--device", "cpu", "--no-progress", "--run-dir", str(tmp_path / "ddp")],
                         capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    r = gpudash.load_run(tmp_path / "ddp")
    assert r.ranks == [0, 1] and r.status == "finished"
    assert sorted(r.steps.groupby("rank")["step"].count().tolist()) == [2, 2]
    r.close()


def test_injected_spike_is_detected(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("spike", steps=16, batch=4, seq_len=32, inject_spike_at_steps=(14,))
    spikes = r.events[r.events["kind"] == "loss_spike"]
    assert 14 in set(spikes["step"].astype(int))
    from gpudash.analysis.facts import run_facts

    assert sorted(set(spikes["step"].astype(int))) == list(run_facts(r).loss_spike_steps)  # live == post-run
    assert r.steps.set_index("step").loc[14, "loss"] > 4 * r.steps.set_index("step").loc[13, "loss"]


def test_monitor_options_are_checked_up_front() -> None:
    from gpudash.trainer import TrainConfig

    with pytest.raises(ValueError, match="memory_every must be >= 1"):
        TrainConfig(monitor=MonitorOptions(memory_every=0))
    with pytest.raises(ValueError, match="pass MonitorOptions"):
        TrainConfig(monitor={"host_hz": 0})  # type: ignore[arg-type]
