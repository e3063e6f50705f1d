from __future__ import annotations

import pytest
import torch

from gpudash.trainer.estimator import estimate, estimate_step, safe_micro_batch, what_fits
from gpudash.trainer.model import GPT, preset

SAME_SHAPE = {"seq_len": 64, "min_len": 64, "batch": 8, "steps": 3}


def _saved_bytes(mode: str, precision: str, b: int = 4, t: int = 64) -> int:
    """What autograd really keeps for one forward, as the Monitor counts it."""
    from gpudash.trainer.checkpointing import apply_checkpointing, parse_mode

    torch.manual_seed(0)
    model = GPT(preset("tiny"))
    apply_checkpointing(model, parse_mode(mode))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        st = x.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return x

    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu", enabled=False)
    idx = torch.randint(0, 256, (b, t))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x), ctx:
        model(idx, idx)
    return sum(seen.values())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["none", "block", "every-2", "attn", "mlp"])
def test_activation_model_matches_what_autograd_saves(mode: str, precision: str) -> None:
    predicted = estimate(preset("tiny"), micro_batch=4, seq_len=64, ckpt=mode, precision=precision).activations_bytes
    measured = _saved_bytes(mode, precision)
    assert abs(predicted - measured) / measured < 0.01


@pytest.mark.parametrize("mode", ["none", "block"])
def test_estimate_matches_the_monitors_measured_categories(run_train, mode: str) -> None:  # type: ignore[no-untyped-def]
    r = run_train(mode, ckpt=mode, **SAME_SHAPE)
    est = r.meta["estimate"]
    mem = r.memory
    assert est["params_bytes"] == mem["params_bytes"].max()
    assert est["grads_bytes"] == mem["grads_total_bytes"].max()
    # fused AdamW adds a 4-byte step counter per parameter tensor
    assert abs(est["optimizer_bytes"] - mem["optimizer_bytes"].max()) / est["optimizer_bytes"] < 0.01
    assert abs(est["activations_bytes"] - mem["activations_bytes"].max()) / est["activations_bytes"] < 0.10
    measured_sum = sum(mem[c].max() for c in ("params_bytes", "grads_total_bytes", "optimizer_bytes",
                                              "activations_bytes"))
    predicted_sum = sum(est[c] for c in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes"))
    assert abs(predicted_sum - measured_sum) / measured_sum < 0.10
    assert (mem["predicted_activations_bytes"] == est["activations_bytes"]).all()  # per step, for the dashboard


def test_techniques_move_memory_the_right_way() -> None:
    cfg = preset("gpt2-124m")
    base = estimate(cfg, micro_batch=8, seq_len=1024)
    assert estimate(cfg, micro_batch=8, seq_len=1024, ckpt="block").activations_bytes < 0.35 * base.activations_bytes  # logits stay
    assert estimate(cfg, micro_batch=8, seq_len=1024, precision="bf16").activations_bytes < base.activations_bytes
    off = estimate(cfg, micro_batch=8, seq_len=1024, offload="optimizer+grads")
    assert off.optimizer_bytes == 0 and off.grads_bytes < base.grads_bytes and off.host_bytes > 0
    assert off.peak_bytes < base.peak_bytes
    with pytest.raises(ValueError, match="offload"):
        estimate(cfg, micro_batch=1, seq_len=8, weights="bf16")


def test_llama_7b_on_a_24_gb_card() -> None:
    fits = [f for f in what_fits(preset("llama-7b"), card_bytes=24 * 2**30, seq_len=2048) if f.micro_batch]
    assert fits, "some technique mix must fit"
    assert all(f.offload != "none" and f.weights == "bf16" for f in fits)  # fp32 weights alone are 25 GiB
    assert max(f.micro_batch for f in fits if f.ckpt == "block") >= 2
    assert all(f.peak_bytes <= 24 * 2**30 for f in fits)


def test_safe_micro_batch_respects_capacity() -> None:
    cfg = preset("gpt2-124m")
    cap = 16 * 2**30
    b = safe_micro_batch(cfg, capacity_bytes=cap, seq_len=1024, limit=256, fraction=0.8)
    assert b >= 1
    assert estimate(cfg, micro_batch=b, seq_len=1024, accum=2).peak_bytes <= 0.8 * cap
    assert estimate(cfg, micro_batch=b + 1, seq_len=1024, accum=2).peak_bytes > 0.8 * cap


def test_recompute_flops_follow_the_checkpointed_regions() -> None:
    cfg = preset("gpt2-124m")
    f = {m: estimate(cfg, micro_batch=1, seq_len=1024, ckpt=m) for m in ("none", "attn", "mlp", "every-2", "block")}
    assert f["none"].recompute_flops_per_token == 0
    assert f["block"].recompute_flops_per_token == f["attn"].recompute_flops_per_token + f["mlp"].recompute_flops_per_token
    assert f["every-2"].recompute_flops_per_token * 2 == f["block"].recompute_flops_per_token
    # a full forward again is a third of training FLOPs at most (embeddings and head are not redone)
    assert 0.2 < f["block"].recompute_flops_per_token / f["block"].flops_per_token < 1 / 3


def _profiled_peak(vocab: int, b: int, t: int, accum: int) -> int:
    """Peak bytes of one steady-state optimizer step, from torch's memory profiler (CPU)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    cfg = preset("tiny", vocab_size=vocab)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step() -> None:
        for _ in range(accum):
            idx = torch.randint(0, vocab, (b, t))
            model(idx, idx).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # optimizer state exists from here on
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return max(sum(s) for s in sizes)


@pytest.mark.parametrize("accum", [1, 2])
def test_tied_embedding_gradient_spike_matches_torchs_memory_profiler(accum: int) -> None:
    # a large vocabulary and a short batch: the shared weight's gradient accumulation is the peak
    measured = _profiled_peak(8192, 1, 16, accum)
    predicted = estimate(preset("tiny", vocab_size=8192), micro_batch=1, seq_len=16, accum=accum).peak_bytes
    assert abs(predicted - measured) / measured < 0.01, (predicted, measured)


def test_estimate_step_at_real_shapes() -> None:
    cfg = preset("tiny")
    full = estimate(cfg, micro_batch=4, seq_len=64, accum=2)
    assert estimate_step(cfg, [(4, 64), (4, 64)]) == full
    short = estimate_step(cfg, [(4, 64), (4, 20)])  # the second micro-batch is shorter
    assert short.activations_bytes == full.activations_bytes  # the largest micro-batch's
    assert short.peak_bytes < full.peak_bytes and short.forward_peak_bytes < full.forward_peak_bytes
    # forward peak: the first micro-batch runs without gradients, the later ones on top of them
    one = estimate(cfg, micro_batch=4, seq_len=64)
    assert one.forward_peak_bytes == one.params_bytes + one.optimizer_bytes + one.activations_bytes
    with pytest.raises(ValueError):
        estimate_step(cfg, [])
