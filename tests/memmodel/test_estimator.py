from __future__ import annotations

import re

import pytest
import torch
from helpers.tiny_hf import saved_storages

from gpudash.memmodel.estimator import ModelShape, estimate, estimate_step, safe_micro_batch
from gpudash.memmodel.fit import explain, what_fits
from gpudash.memmodel.plan import CARD_SHARE
from gpudash.memmodel.steptime import StepTimeModel
from gpudash.trainer.model import GPT, preset
from gpudash.units import human_bytes

SAME_SHAPE = {"seq_len": 64, "min_len": 64, "batch": 8, "steps": 3}


def _saved_bytes(mode: str, precision: str, b: int = 4, t: int = 64) -> int:
    """What autograd really keeps for one forward, as the Monitor counts it."""
    from gpudash.trainer.checkpointing import apply_checkpointing, parse_mode

    torch.manual_seed(0)
    model = GPT(preset("tiny"))
    apply_checkpointing(model, parse_mode(mode))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu", enabled=False)
    idx = torch.randint(0, 256, (b, t))
    with saved_storages(model) as seen, ctx:
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
    b = safe_micro_batch(cfg, card_bytes=cap, seq_len=1024, limit=256)
    assert b >= 1
    assert estimate(cfg, micro_batch=b, seq_len=1024, accum=2).peak_bytes <= CARD_SHARE * cap
    assert estimate(cfg, micro_batch=b + 1, seq_len=1024, accum=2).peak_bytes > CARD_SHARE * cap


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


def test_autocast_weight_copies_are_what_makes_bf16_activations_larger_at_micro_batch_1() -> None:
    cfg = preset("tiny")
    # measured: bf16 saves more than fp32 at micro-batch 1, and the batch-independent part is the weight copies
    t = 16
    assert _saved_bytes("none", "bf16", b=1, t=t) > _saved_bytes("none", "fp32", b=1, t=t)
    constant = 2 * _saved_bytes("none", "bf16", b=1, t=t) - _saved_bytes("none", "bf16", b=2, t=t)
    est = estimate(cfg, micro_batch=1, seq_len=t, precision="bf16")
    assert abs(est.weight_copies_bytes + t * 8 - constant) / constant < 0.01  # + the position ids
    h, m, v, layers = cfg.n_embd, cfg.hidden, cfg.vocab_size, cfg.n_layer
    assert est.weight_copies_bytes == 2 * (layers * (4 * h * h + 2 * h * m) + v * h)
    assert estimate(cfg, micro_batch=1, seq_len=t).weight_copies_bytes == 0  # fp32 keeps no copies
    assert estimate(cfg, micro_batch=1, seq_len=t, precision="bf16", ckpt="block").weight_copies_bytes == 2 * v * h
    # the explanation, with the micro-batch from which bf16 is the smaller again
    fp32 = estimate(cfg, micro_batch=1, seq_len=t)
    assert est.activations_bytes > fp32.activations_bytes
    note = next(n for n in explain(cfg, est) if "autocast" in n)
    assert "bf16 activations" in note and "exceed fp32's" in note
    found = re.search(r"from micro-batch (\d+) on", note)
    assert found
    n = int(found.group(1))

    def gap(b: int) -> int:
        return (estimate(cfg, micro_batch=b, seq_len=t, precision="bf16").activations_bytes
                - estimate(cfg, micro_batch=b, seq_len=t).activations_bytes)

    assert gap(n) < 0 <= gap(n - 1)
    big = estimate(cfg, micro_batch=n, seq_len=t, precision="bf16")
    assert not any("autocast" in x for x in explain(cfg, big))


def test_peak_below_the_sum_of_categories_is_explained_by_when_it_happens() -> None:
    cfg = preset("gpt2-124m")
    early = estimate(cfg, micro_batch=1, seq_len=1024, precision="bf16")  # the peak is early in backward
    assert early.peak_moment == "activations"
    assert early.peak_bytes == (early.params_bytes + early.optimizer_bytes + early.activations_bytes
                                + early.logits_grad_bytes + early.recompute_bytes)
    late = estimate(cfg, micro_batch=1, seq_len=128, precision="bf16")  # small activations: gradients peak
    assert late.peak_moment == "gradients"
    assert late.peak_bytes >= late.params_bytes + late.optimizer_bytes + late.grads_bytes
    for est, words in ((early, "early in backward"), (late, "end of backward")):
        total = est.params_bytes + est.grads_bytes + est.optimizer_bytes + est.activations_bytes
        assert est.peak_bytes < total
        note = next(n for n in explain(cfg, est) if "sum of the categories" in n)
        assert words in note and human_bytes(est.peak_bytes) in note and human_bytes(total) in note
    assert "tied embedding's two partial gradients" in explain(cfg, late)[-1]  # gpt2 ties its head
    # with accumulation the later micro-batches run on top of every gradient: the peak is above the sum
    accum = estimate(cfg, micro_batch=8, seq_len=1024, accum=2)
    assert accum.peak_bytes > accum.params_bytes + accum.grads_bytes + accum.optimizer_bytes + accum.activations_bytes
    assert not any("sum of the categories" in n for n in explain(cfg, accum))


def test_step_time_model_arithmetic() -> None:
    shape = ModelShape(vocab_size=100, n_layer=2, n_head=2, n_embd=16, hidden=64, gated=False, n_params=10_000)
    model = StepTimeModel(tflops=100, pcie_gbps=16)
    plain = estimate(shape, micro_batch=1, seq_len=8, precision="bf16")
    assert plain.flops_per_token == 6 * 10_000 + 12 * 2 * 16 * 8  # 63,072
    t = model.step(plain, tokens_per_step=1000)
    assert t.compute_s == pytest.approx(1000 * 63_072 / 100e12) and t.recompute_s == 0 and t.transfer_s == 0
    assert model.step(estimate(shape, micro_batch=1, seq_len=8), 1000).compute_s == pytest.approx(2 * t.compute_s)
    ck = estimate(shape, micro_batch=1, seq_len=8, precision="bf16", ckpt="block")
    # block checkpointing runs every layer's forward again: projections, attention scores, MLP
    per_layer = 2 * 4 * 16 * 16 + 4 * 16 * 8 + 2 * 2 * 16 * 64
    assert ck.recompute_flops_per_token == 2 * per_layer
    assert model.step(ck, 1000).recompute_s == pytest.approx(1000 * 2 * per_layer / 100e12)
    off = estimate(shape, micro_batch=1, seq_len=8, precision="bf16", offload="optimizer")
    moved = model.step(off, 1000)
    assert moved.transfer_bytes == 2 * 4 * 10_000  # fp32 gradients out, fp32 weights back
    assert moved.transfer_s == pytest.approx(80_000 / 16e9)
    with pytest.raises(ValueError, match="pcie_gbps"):  # the parameter; the CLI says --pcie-gbps
        StepTimeModel(pcie_gbps=0)


def test_what_fits_gives_host_ram_and_step_cost_per_option() -> None:
    cfg = preset("llama-7b")
    model = StepTimeModel(tflops=100, pcie_gbps=16)
    fits = what_fits(cfg, card_bytes=24 * 2**30, seq_len=2048, tokens_per_step=8 * 2048, time_model=model)
    shown = [f for f in fits if f.micro_batch]
    n = cfg.n_params()
    for f in shown:  # optimizer+grads: fp32 master weights, Adam moments, fp32 gradients + a bf16 staging copy
        assert f.host_bytes == (16 * n + 2 * n if f.offload == "optimizer+grads" else 16 * n)
        est = estimate(cfg, micro_batch=f.micro_batch, seq_len=2048, ckpt=f.ckpt, precision=f.precision,
                       offload=f.offload, weights=f.weights)
        t = model.step(est, 8 * 2048)
        assert f.step_s == pytest.approx(t.total_s)
        assert f.step_cost == pytest.approx((t.recompute_s + t.transfer_s) / t.compute_s)
        assert t.transfer_s == pytest.approx(2 * 2 * n / 16e9)  # bf16 weights: 2 bytes out, 2 back
    assert any(f.host_bytes / 2**30 > 113 for f in shown)  # the 24 GB suggestion needs 113 GiB of host RAM
    assert [f.step_s for f in shown] == sorted(f.step_s for f in shown)  # fastest first
    small = what_fits(preset("gpt2-124m"), card_bytes=80 * 2**30, seq_len=1024)
    plain = next(f for f in small if f.ckpt == "none" and f.offload == "none")
    assert plain.step_cost == 0 and plain.host_bytes == 0 and small[0] is plain or small[0].step_cost == 0
