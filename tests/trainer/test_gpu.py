"""GPU checks of the trainer (run by the GPU validation on a real card; skipped here)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GPU = {"preset": "gpt2-124m", "seq_len": 512, "min_len": 512, "steps": 4, "device": "cuda"}


@pytest.mark.parametrize("ckpt", ["none", "block", "mlp"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_estimated_peak_within_10_percent_of_the_allocator_peak(run_train, ckpt: str, precision: str) -> None:  # type: ignore[no-untyped-def]
    r = run_train(f"{ckpt}-{precision}", batch=4, ckpt=ckpt, precision=precision, **GPU)
    measured = r.memory["peak_bytes"].iloc[1:].max()  # steady state: optimizer state exists
    predicted = r.meta["estimate"]["peak_bytes"]
    assert abs(predicted - measured) / measured <= 0.10, (predicted, measured)


def test_offload_keeps_optimizer_state_off_the_device(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("offload", batch=4, offload="optimizer+grads", precision="bf16", **GPU)
    assert r.memory["optimizer_bytes"].max() == 0
    assert r.memory["optimizer_host_bytes"].max() > 0
    assert r.steps["offload_s"].notna().all()


def test_memory_cap_makes_real_ooms_that_the_run_survives(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("cap", batch=64, effective_batch=64, memory_cap_gb=8, **GPU)
    assert r.status == "finished" and len(r.steps) == GPU["steps"]
    ooms = r.events[r.events["kind"] == "oom"]
    assert len(ooms) >= 1 and all(d["leaked_bytes"] == 0 for d in ooms["data"])
    assert (r.steps["batch_size"] == 64).all()


def test_auto_batch_grows_into_a_capped_card(run_train) -> None:  # type: ignore[no-untyped-def]
    r = run_train("auto", batch="auto", effective_batch=128, memory_cap_gb=16, **{**GPU, "steps": 20})
    assert r.status == "finished"
    peak = r.memory["peak_bytes"].max()
    assert peak <= 16 * 2**30
