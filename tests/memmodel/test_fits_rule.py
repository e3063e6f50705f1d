"""One rule of what fits a card, for both model families (issue 47): the largest micro-batch whose peak, at the
gradient accumulation the plan needs to make up its step, is within the card's usable share; the peak printed
is the one judged, and ``gpudash estimate``'s verdict line judges by the same rule. Checked against the peak
torch's memory profiler measures on CPU."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from gpudash.memmodel.estimator import estimate
from gpudash.memmodel.finetune import estimate_hf
from gpudash.memmodel.fit import what_fits
from gpudash.memmodel.hf_arch import HFArch, hf_preset
from gpudash.memmodel.plan import CARD_SHARE, Estimate, fits, largest_fit, plan_accum, usable_bytes
from gpudash.memmodel.shapes import preset
from gpudash.units import GiB, human_bytes

torch = pytest.importorskip("torch")

from helpers.tiny_hf import TINY, build  # noqa: E402

ROWS = 8
"""Rows of one optimizer step: a micro-batch below it accumulates gradients."""


def _profiled_peak(model: Any, loss: Callable[[Any], Any], accum: int) -> int:
    """Peak bytes of one steady-state optimizer step of ``accum`` micro-batches (AdamW), from torch's memory
    profiler on CPU: every tensor, the gradients held across micro-batches included."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        for _ in range(accum):
            loss(model).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.manual_seed(0)
    step()  # optimizer state exists from here on
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    _, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    return max(sum(s) for s in sizes)


def _gpt(t: int) -> tuple[Callable[[int, int], Estimate], Callable[[int, int], int]]:
    from gpudash.trainer.model import GPT

    cfg = preset("tiny")

    def predict(b: int, accum: int) -> Estimate:
        return estimate(cfg, micro_batch=b, seq_len=t, accum=accum)

    def measure(b: int, accum: int) -> int:
        torch.manual_seed(0)

        def loss(model: Any) -> Any:
            idx = torch.randint(0, cfg.vocab_size, (b, t))
            return model(idx, idx)

        return _profiled_peak(GPT(cfg), loss, accum)

    return predict, measure


def _hf(t: int) -> tuple[Callable[[int, int], Estimate], Callable[[int, int], int]]:
    cfg = TINY["llama"]
    arch = HFArch.from_dict(cfg)

    def predict(b: int, accum: int) -> Estimate:
        return estimate_hf(arch, micro_batch=b, seq_len=t, accum=accum, cuda=False)

    def measure(b: int, accum: int) -> int:
        def loss(model: Any) -> Any:
            ids = torch.randint(0, cfg["vocab_size"], (b, t))
            return model(input_ids=ids, labels=ids).loss

        return _profiled_peak(build(cfg), loss, accum)

    return predict, measure


@pytest.mark.slow
@pytest.mark.parametrize(("family", "seq"), [("gpt", 64), ("hf", 32)])
def test_the_offered_micro_batch_is_under_the_measured_peak_and_the_next_one_over(family: str, seq: int) -> None:
    pytest.importorskip("transformers")
    predict, measure = (_gpt if family == "gpt" else _hf)(seq)
    tokens = ROWS * seq
    # a card whose usable share lies between micro-batch 4's peak without accumulation and with it
    card = (predict(4, 1).peak_bytes + predict(4, 2).peak_bytes) / 2 / CARD_SHARE
    usable = usable_bytes(card)
    best = largest_fit(predict, card_bytes=card, seq_len=seq, tokens_per_step=tokens, limit=256)
    assert best is not None and 1 <= best.micro_batch < ROWS and fits(best, card)
    b = best.micro_batch
    assert best == predict(b, plan_accum(b, seq, tokens))  # judged at the accumulation the plan needs
    over = b + 1
    # judged without the gradients held across micro-batches (the HF family's rule before), the next one fitted
    assert fits(predict(over, 1), card) and not fits(predict(over, plan_accum(over, seq, tokens)), card)
    measured, measured_next = measure(b, plan_accum(b, seq, tokens)), measure(over, plan_accum(over, seq, tokens))
    assert measured <= usable < measured_next, (b, measured, usable, measured_next)


def test_a_micro_batch_holding_the_whole_step_is_judged_without_accumulation() -> None:
    cfg = preset("gpt2-124m")  # gradients larger than a short row's activations

    def predict(b: int, accum: int) -> Estimate:
        return estimate(cfg, micro_batch=b, seq_len=64, accum=accum)

    whole, below = predict(ROWS, 1), predict(ROWS - 1, 2)
    assert below.peak_bytes > whole.peak_bytes
    # the whole step in one micro-batch fits where a smaller micro-batch under accumulation would not
    card = (whole.peak_bytes + below.peak_bytes) / 2 / CARD_SHARE
    best = largest_fit(predict, card_bytes=card, seq_len=64, tokens_per_step=ROWS * 64, limit=256)
    assert best is not None and best.micro_batch >= ROWS and best == predict(best.micro_batch, 1)
    assert not fits(below, card) and fits(whole, card)
    # from the whole step on, no accumulation; without a step size each micro-batch is a step
    big = largest_fit(predict, card_bytes=80 * GiB, seq_len=64, tokens_per_step=ROWS * 64, limit=256)
    assert big == predict(256, 1)
    free = largest_fit(predict, card_bytes=80 * GiB, seq_len=64, tokens_per_step=0, limit=256)
    assert free is not None and free == predict(256, 1)
    assert largest_fit(predict, card_bytes=1.0, seq_len=64, tokens_per_step=0, limit=256) is None


@pytest.mark.parametrize(("family", "seq", "gb"), [("gpt", 1024, 8), ("hf", 512, 12)])
def test_both_families_list_each_mix_at_the_rules_micro_batch_and_its_judged_peak(family: str, seq: int,
                                                                                   gb: int) -> None:
    tokens, card = 16 * seq, gb * GiB
    if family == "gpt":
        model: Any = preset("gpt2-124m")
        rows = what_fits(model, card_bytes=card, seq_len=seq, tokens_per_step=tokens)

        def predict(f: Any, b: int) -> Estimate:
            return estimate(model, micro_batch=b, seq_len=seq, accum=plan_accum(b, seq, tokens), ckpt=f.ckpt,
                            precision=f.precision, offload=f.offload, weights=f.weights)
    else:
        model = hf_preset("llama-2-7b")
        rows = what_fits(model, card_bytes=card, seq_len=seq, tokens_per_step=tokens)

        def predict(f: Any, b: int) -> Estimate:
            return estimate_hf(model, micro_batch=b, seq_len=seq, accum=plan_accum(b, seq, tokens),
                               finetune=f.finetune, weights=f.weights, optimizer=f.optimizer, ckpt=f.ckpt,
                               precision=f.precision)
    shown = [f for f in rows if f.micro_batch]
    assert shown and any(f.accum > 1 for f in shown)
    for f in shown:
        judged = predict(f, f.micro_batch)
        assert f.accum == plan_accum(f.micro_batch, seq, tokens) and f.peak_bytes == judged.peak_bytes
        assert fits(judged, card)
        assert not fits(predict(f, f.micro_batch + 1), card)  # at its own accumulation


def test_estimate_prints_the_peak_it_judged_and_its_verdict_by_the_same_rule(capsys: pytest.CaptureFixture[str]) -> None:
    from gpudash.cli import main

    argv = ["estimate", "--preset", "gpt2-124m", "--precision", "bf16", "--card-gb", "8"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cfg = preset("gpt2-124m")
    listed = [f for f in data["what_fits"] if f["micro_batch"]]
    for f in listed[:10]:
        judged = estimate(cfg, micro_batch=f["micro_batch"], seq_len=1024, accum=f["accum"], ckpt=f["ckpt"],
                          precision=f["precision"], offload=f["offload"], weights=f["weights"])
        assert f["peak_bytes"] == judged.peak_bytes
        assert re.search(rf"micro-batch\s+{f['micro_batch']} x{f['accum']}\s+peak\s+"
                         rf"{re.escape(human_bytes(judged.peak_bytes, 2))}", text)
    first = listed[0]
    assert (first["micro_batch"], first["accum"], first["ckpt"]) == (5, 2, "none")  # 8 rows a step: 5 + the rest
    assert "peak   6.11 GiB" not in text  # the peak without the held gradients, which it did not judge
    # the verdict line: 7 rows in one micro-batch peak above the usable share of 8 GB, though below 8 GiB
    assert main(["estimate", "--preset", "gpt2-124m", "--precision", "bf16", "--card-gb", "8", "--batch", "7",
                 "--json"]) == 0
    seven = json.loads(capsys.readouterr().out)
    assert seven["peak_bytes"] < 8 * GiB and seven["fits_card"] is False
    assert seven["usable_bytes"] == usable_bytes(8 * GiB) < seven["peak_bytes"]
    assert main(["estimate", "--preset", "gpt2-124m", "--precision", "bf16", "--card-gb", "8", "--batch", "7"]) == 0
    assert "this configuration (peak 7.90 GiB at --accum 1) does NOT fit" in capsys.readouterr().out
