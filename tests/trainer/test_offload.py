from __future__ import annotations

import pytest

SAME_SHAPE = {"seq_len": 64, "min_len": 64, "batch": 4, "steps": 3}


@pytest.mark.parametrize("offload", ["optimizer", "optimizer+grads"])
def test_offloaded_optimizer_gives_the_same_losses(run_train, offload: str) -> None:  # type: ignore[no-untyped-def]
    base = run_train("base", **SAME_SHAPE).steps["loss"].to_numpy()
    r = run_train(offload.replace("+", "_"), offload=offload, **SAME_SHAPE)
    assert r.steps["loss"].to_numpy() == pytest.approx(base, rel=1e-4)
    assert "offload_s" in r.steps
    assert r.memory["offload_host_bytes"].max() > 0
    assert any("offload on a CPU run" in w for w in r.meta["preflight"]["warnings"])


def test_bf16_weights_need_offload_and_train(run_train) -> None:  # type: ignore[no-untyped-def]
    from gpudash.trainer import TrainConfig

    with pytest.raises(ValueError, match="offload"):
        TrainConfig(weights="bf16", precision="bf16")
    r = run_train("bf16w", weights="bf16", precision="bf16", offload="optimizer+grads", **SAME_SHAPE)
    assert r.steps["loss"].notna().all()
    assert r.memory["params_bytes"].max() == r.meta["estimate"]["params_bytes"]  # 2 bytes per parameter


def test_estimated_host_bytes_match_the_offload_optimizer() -> None:
    import torch

    from gpudash.memmodel.estimator import estimate
    from gpudash.trainer.model import GPT, preset
    from gpudash.trainer.offload import OffloadOptimizer

    cfg = preset("tiny")
    opt = OffloadOptimizer(list(GPT(cfg).parameters()), lr=1e-3)
    for p in opt.params:
        p.grad = torch.zeros_like(p)
    opt.gather_grads()
    opt.step()
    predicted = estimate(cfg, micro_batch=1, seq_len=8, offload="optimizer").host_bytes
    assert abs(opt.state_bytes() - predicted) / predicted < 0.01
